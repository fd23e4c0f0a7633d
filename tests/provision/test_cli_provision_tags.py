"""``dsv4kit provision --tags/--skip-tags``: a name the playbook does not use is refused before
ansible-playbook runs (Ansible itself would silently run, or skip, nothing for it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsv4kit.core import exitcodes

from dsv4kit.provision import playbook as provision
from tests.remote_inventory import closed_port, keygen

REPO_ROOT = Path(__file__).resolve().parents[2]


def dsv4kit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT)


@pytest.fixture
def inventory(tmp_path) -> Path:
    """One box on a closed loopback port: if ansible-playbook runs, the host is unreachable (exit 3)."""
    port = closed_port()
    # Its key is in known_hosts (dsv4kit checks that before Ansible runs); no server ever answers.
    key = keygen(tmp_path / "host_key").with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {key[0]} {key[1]}\n")
    host = {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "nobody",
            "dsv4_venv_dir": "/opt/dsv4/venv", "dsv4_context_length": 8192, "dsv4_decode_port": 30002,
            "dsv4_gpu_count": 8, "dsv4_known_hosts": str(known)}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"dsv4_boxes": {"hosts": {"box1": host}}}}}))
    return path


def site_tags() -> set[str]:
    """The stage tags of playbooks/site.yml, read here independently of dsv4kit."""
    plays = yaml.safe_load((REPO_ROOT / "playbooks" / "site.yml").read_text())
    return {tag for play in plays for role in play.get("roles", []) if isinstance(role, dict)
            for tag in role.get("tags", [])}


def test_the_valid_tags_are_the_playbooks():
    known = set(provision.playbook_tags(provision.default_playbook()))
    assert site_tags() <= known and {"flash_attn", "sglang_service"} <= known
    provision.check_tags(provision.default_playbook(), tags=sorted(known), skip_tags="always,never")
    provision.check_tags(provision.default_playbook(), tags=["all", "tagged", "untagged"])


@pytest.mark.parametrize("option,value,bad", [("--skip-tags", "flash-attn", "flash-attn"),
                                              ("--tags", "preflight,sglang-venv", "sglang-venv"),
                                              ("--tags", "nonsense", "nonsense")])
def test_an_unknown_tag_is_refused_before_ansible_runs(inventory, option, value, bad):
    proc = dsv4kit("provision", "-i", str(inventory), option, value)
    assert proc.returncode == exitcodes.USAGE, proc.stdout + proc.stderr
    assert f"{option} {bad!r} is not a tag of" in proc.stderr
    assert "valid tags: " + ", ".join(sorted(site_tags())) in proc.stderr
    if bad != "nonsense":
        assert f"did you mean {bad.replace('-', '_')!r}" in proc.stderr
    assert "PLAY" not in proc.stdout and "Traceback" not in proc.stderr  # ansible-playbook never started


def test_known_tags_reach_ansible(inventory):
    proc = dsv4kit("provision", "-i", str(inventory), "--tags", "preflight", "--skip-tags", "flash_attn,never")
    assert proc.returncode == exitcodes.UNREACHABLE, proc.stdout + proc.stderr
    assert "PLAY RECAP" in proc.stdout


def test_ansibles_short_flags_mean_what_they_mean_to_ansible_playbook(inventory, tmp_path):
    """-C, -e and -v reach the real ansible-playbook with Ansible's meaning (the host is unreachable,
    so the play ends at exit 3 after Ansible read them)."""
    extra = tmp_path / "extra.yml"
    extra.write_text("dsv4_context_length: 65536\nprobe_from_file: yes-file\n")
    proc = dsv4kit("provision", "-i", str(inventory), "--tags", "preflight", "-C", "-vvv", "-e", "probe=from-cli",
                   "-e", f"@{extra}", "-e", '{"dsv4_max_running_requests": 32}', "--json")
    assert proc.returncode == exitcodes.UNREACHABLE, proc.stdout + proc.stderr
    command = json.loads(proc.stdout)["command"]
    assert "--check" in command and "-vvv" in command
    assert command[command.index("probe=from-cli") - 1] == "--extra-vars" and f"@{extra}" in command
    assert "PLAYBOOK: site.yml" in proc.stderr  # Ansible's own -v output


@pytest.mark.parametrize("value,words", [
    ("dsv4_contxt_length=8192", "unknown field 'dsv4_contxt_length' (did you mean 'dsv4_context_length'?)"),
    ("dsv4_context_length=8192", "dsv4_context_length must be int, got str '8192'"),
    ('{"dsv4_router_open": "yes"}', "dsv4_router_open must be bool"),
    ("[1, 2]", "not key=value pairs nor a JSON/YAML mapping"),
])
def test_bad_extra_vars_are_refused_before_ansible_runs(inventory, value, words):
    proc = dsv4kit("provision", "-i", str(inventory), "-e", value)
    assert proc.returncode == exitcodes.USAGE, proc.stdout + proc.stderr
    assert words in proc.stderr and "PLAY" not in proc.stdout and "Traceback" not in proc.stderr
