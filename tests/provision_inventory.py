"""Build a GPU-less loopback inventory for the provisioning tests (used by test_provision_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# One tiny pure-python package: the venv stage really installs and verifies something, fast.
TINY_PACKAGES = ["six==1.17.0"]

# The operating systems preflight accepts: the playbook's own, plus this machine's (the box under
# test, Debian 12: GPU-less, so the driver, CUDA and flash-attn stages only run in check mode).
PLAYBOOK_SUPPORTED_OS = yaml.safe_load(
    (REPO / "playbooks/roles/preflight/defaults/main.yml").read_text())["preflight_supported_os"]
TEST_SUPPORTED_OS = [*PLAYBOOK_SUPPORTED_OS, "Debian 12"]


def write_loopback_inventory(directory: Path, sshd, prefix: Path, *, host: str = "loop",
                             extra_hosts: dict | None = None, overrides: dict | None = None,
                             role_vars: dict | None = None) -> Path:
    """An inventory whose only box is the loopback sshd, every path under ``prefix``.

    ``overrides`` go into group_vars/all.yml (dsv4_* fields, checked against the schema);
    ``role_vars`` override role defaults in group_vars/dsv4_boxes.json, which Ansible reads and
    dsv4kit's inventory check (dsv4_* and connection fields only) does not.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "group_vars").mkdir(exist_ok=True)
    all_vars = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    all_vars.update({
        "dsv4_gpu_present": False,
        "dsv4_prefix": str(prefix),
        "dsv4_venv_dir": str(prefix / "opt/dsv4/venv"),
        "dsv4_state_dir": str(prefix / "var/lib/dsv4kit"),
        "dsv4_python_version": "3.11",  # Debian 12's; the box under test is this machine
        "dsv4_venv_packages": list(TINY_PACKAGES),
        "dsv4_service_user": "root",  # an existing user: the test never creates one
        "dsv4_known_hosts": str(sshd.known_hosts),
        # Forced on: these tests check the rollout itself ('auto' is tests/test_kernel_plan_e2e.py's).
        "dsv4_kernel_flags": {"SGLANG_SM120_TRITON_INDEXER": "1", "SGLANG_SM120_MMA_ATTENTION": "1"},
        # The monitoring stage has its own tests (tests/monitoring): its packages are not in the
        # box's stand-in archive.
        "dsv4_monitoring": False,
    })
    all_vars.update(overrides or {})
    (directory / "group_vars/all.yml").write_text(yaml.safe_dump(all_vars, sort_keys=False))
    # The weights stage needs a hub: tests/provision/test_model_weights.py runs it against its stand-in.
    group_vars = {"preflight_supported_os": TEST_SUPPORTED_OS, "model_weights_enabled": False, **(role_vars or {})}
    (directory / "group_vars/dsv4_boxes.json").write_text(json.dumps(group_vars, indent=2))
    hosts = {host: {
        "ansible_host": "127.0.0.1",
        "ansible_port": sshd.port,
        "ansible_user": sshd.user,
        "ansible_ssh_private_key_file": str(sshd.client_key),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={sshd.known_hosts} -o StrictHostKeyChecking=yes",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_become": False,
    }}
    hosts.update(extra_hosts or {})
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"dsv4_boxes": {"hosts": hosts}}}}, sort_keys=False))
    return path
