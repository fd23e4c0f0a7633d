"""Paths and helpers the monitoring tests share."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks" / "roles" / "monitoring"
ALERT_RULES = ROLE / "files" / "dsv4kit-alerts.yml"

import json
import os
import subprocess
import sys

import yaml

GRAFANA_PASSWORD = "grafana-test-secret-5e1"


def render_role(root: Path, overrides: dict | None = None, box2: dict | None = None, *, two_boxes: bool = True) -> Path:
    """Render the monitoring role's configuration (its tasks/config.yml, defaults and the tracked
    pins, through the real ansible-playbook) for an inventory of two boxes, both rendered locally:
    box1 (the monitoring host, under ``root/box1``) and box2 (address 192.0.2.12, under
    ``root/box2``, with the host vars ``box2``; left out when not ``two_boxes``). ``overrides``:
    inventory values for both. The units are left alone. Returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    work = root / "ansible"
    work.mkdir(exist_ok=True)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {"box1": {**local, "ansible_host": "127.0.0.1", "dsv4_prefix": str(root / "box1")},
             "box2": {**local, "ansible_host": "192.0.2.12", "dsv4_prefix": str(root / "box2"), **(box2 or {})}}
    if not two_boxes:
        del hosts["box2"]
    site_vars = yaml.safe_load((REPO / "playbooks/site.yml").read_text())[0]["vars"]
    pins = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    group = {**pins, **site_vars, "ansible_managed": "managed by dsv4kit",
             "dsv4_grafana_admin_password": GRAFANA_PASSWORD, "monitoring_manage_units": False, **(overrides or {})}
    group.pop("ansible_ssh_common_args", None)
    inventory = {"all": {"children": {"dsv4_boxes": {"hosts": hosts, "vars": group}}}}
    (work / "inventory.yml").write_text(yaml.safe_dump(inventory))
    play = [{"hosts": "dsv4_boxes", "gather_facts": False,
             "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "config"}}]}]
    (work / "play.yml").write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLE.parent),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(work / "tmp")}
    done = subprocess.run(["ansible-playbook", "-i", str(work / "inventory.yml"), str(work / "play.yml")],
                          capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise AssertionError(f"ansible-playbook failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    return root
