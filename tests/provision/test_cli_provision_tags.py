"""``dsv4kit provision --tags/--skip-tags``: a name the playbook does not use is refused before
ansible-playbook runs (Ansible itself would silently run, or skip, nothing for it)."""

from __future__ import annotations

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
