"""Secrets and a closed box: vaulted inventory values, the become/Vault options of `dsv4kit provision`,
the control machine's own dependencies, and what the serving units expose."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsv4kit.core.inventory import VaultedValue, load_inventory
from dsv4kit.provision.playbook import build_command
from dsv4kit.provision.secrets import PlaybookSecrets

REPO = Path(__file__).resolve().parents[2]
SERVICE = REPO / "playbooks/roles/sglang_service"


def _vaulted(secret: str, password_file: Path) -> str:
    tool = shutil.which("ansible-vault") or str(Path(sys.executable).parent / "ansible-vault")
    proc = subprocess.run([tool, "encrypt_string", "--vault-password-file", str(password_file), secret,
                           "--name", "dsv4_router_api_key"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_vaulted_inventory_loads(tmp_path):
    password = tmp_path / "vault-pass"
    password.write_text("correct horse\n")
    (tmp_path / "group_vars").mkdir()
    all_vars = (REPO / "inventory/group_vars/all.yml").read_text().replace('dsv4_router_api_key: ""', "")
    (tmp_path / "group_vars/all.yml").write_text(all_vars + _vaulted("s3cret-router-key", password))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text((REPO / "inventory/hosts.yml").read_text())
    host = load_inventory(inventory).host("box1")
    value = host["dsv4_router_api_key"]
    assert isinstance(value, VaultedValue) and "$ANSIBLE_VAULT" in value and "s3cret" not in value


def test_become_and_vault_secrets_reach_ansible_as_private_files():
    answers = iter(["sudo-pass", "vault-pass", "id-pass"])
    secrets = PlaybookSecrets.ask(ask_become_pass=True, ask_vault_pass=True,
                                  vault_ids=["prod@prompt", "dev@/etc/dev-vault-pass"], prompt=lambda _: next(answers))
    command = build_command("inv.yml", "site.yml", **secrets.command_args())
    become = Path(command[command.index("--become-password-file") + 1])
    vault = Path(command[command.index("--vault-password-file") + 1])
    ids = [command[i + 1] for i, arg in enumerate(command) if arg == "--vault-id"]
    assert ids[1] == "dev@/etc/dev-vault-pass" and ids[0].startswith("prod@/")
    prompted = Path(ids[0].split("@", 1)[1])
    assert (become.read_text(), vault.read_text(), prompted.read_text()) == ("sudo-pass\n", "vault-pass\n", "id-pass\n")
    for path in (become, vault, prompted):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "sudo-pass" not in " ".join(command)
    secrets.cleanup()
    assert not become.exists() and not become.parent.exists()


def test_provision_help_lists_the_secret_options():
    out = subprocess.run([sys.executable, "-m", "dsv4kit.cli", "provision", "--help"], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, COLUMNS="200")).stdout
    for option in ("--ask-become-pass", "--ask-vault-pass", "--vault-id"):
        assert option in out


def test_the_control_machine_needs_only_the_base_dependencies_to_build_the_wheel():
    """kernel_rollout runs `pip wheel --no-build-isolation` with the Python dsv4kit is installed in:
    setuptools and wheel must be base dependencies, not only test ones."""
    project = __import__("tomllib").loads((REPO / "pyproject.toml").read_text())["project"]
    base = {dep.split(">")[0].split("=")[0].split("<")[0].strip() for dep in project["dependencies"]}
    assert {"setuptools", "wheel", "ansible-core"} <= base


def test_the_box_is_closed_by_default():
    defaults = (SERVICE / "defaults/main.yml").read_text()
    router = (SERVICE / "templates/dsv4-router.service.j2").read_text()
    server = (SERVICE / "templates/dsv4-server.service.j2").read_text()
    env = (SERVICE / "templates/service.env.j2").read_text()
    pins = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    assert pins["dsv4_router_open"] is False and pins["dsv4_router_api_key"] == ""
    assert "sglang_service_router_host: \"{{ '0.0.0.0' if dsv4_router_open else '127.0.0.1' }}\"" in defaults
    assert "--prometheus-host {{ sglang_service_metrics_host }}" in router
    assert 'sglang_service_metrics_host: "127.0.0.1"' in defaults
    assert "SGLANG_HOST_IP=127.0.0.1" in env
    assert "--enable-metrics" in yaml.safe_load(defaults)["sglang_service_common_args"]
    for unit in (router, server):
        assert "StartLimitIntervalSec=" in unit and "StartLimitBurst=" in unit
        assert "sglang_service_sandbox" in unit
    sandbox = yaml.safe_load(defaults)["sglang_service_sandbox"]
    assert sandbox["NoNewPrivileges"] == "true" and sandbox["PrivateTmp"] == "true" and sandbox["ProtectSystem"]
    assert "PrivateDevices" not in sandbox  # CUDA needs /dev/nvidia*
    # The key comes from a root-only environment file through the launcher, never in the unit or argv.
    assert "dsv4-router-launch" in router and "--api-key" not in router
    assert "DSV4_ROUTER_API_KEY" in (SERVICE / "files/router_launch.py").read_text()


@pytest.mark.slow
def test_a_vaulted_inventory_provisions_with_a_vault_id(tmp_path, loopback_ssh):
    """The loader accepts the vaulted value (it used to stop with exit 2) and the Vault secret reaches
    ansible-playbook, which decrypts it on the real loopback box."""
    from dsv4kit.provision.playbook import run_playbook
    from tests.provision_inventory import write_loopback_inventory

    password = tmp_path / "vault-pass"
    password.write_text("correct horse\n")
    inventory = write_loopback_inventory(tmp_path / "inv", loopback_ssh, tmp_path / "prefix")
    all_vars = inventory.parent / "group_vars/all.yml"
    text = all_vars.read_text().replace("dsv4_router_api_key: ''\n", "")
    all_vars.write_text(text + _vaulted("s3cret-router-key", password))
    playbook = tmp_path / "show.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Read the vaulted key", "hosts": "dsv4_boxes", "gather_facts": False,
                                         "tasks": [{"name": "Check the key decrypts", "ansible.builtin.assert": {
                                             "that": ["dsv4_router_api_key == 's3cret-router-key'"]}}]}]))
    lines: list[str] = []
    secrets = PlaybookSecrets.ask(vault_ids=[f"default@{password}"])
    summary = run_playbook(inventory, playbook=playbook, progress=lines.append, secrets=secrets, timeout=300)
    assert summary.exit_code == 0, "\n".join(lines[-40:])
    assert "s3cret-router-key" not in "\n".join(lines)
    lines.clear()
    summary = run_playbook(inventory, playbook=playbook, progress=lines.append, timeout=300)
    assert summary.exit_code == 6 and "vault" in "\n".join(lines).lower()  # no secret: Ansible's own error
