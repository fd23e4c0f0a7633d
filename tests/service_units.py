"""The sglang_service role's unit files rendered by Ansible itself (its templates, its defaults,
the tracked inventory's pins), fast and without a box: a local ansible-playbook run that writes
them under a scratch prefix, with the programs they start stood in by executables there, so
`systemd-analyze verify` and `security --offline` judge exactly what a box would get."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "playbooks/roles/sglang_service"


def role_defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults/main.yml").read_text())


#: The units the role writes, by the names in its own defaults.
UNITS = [role_defaults()["sglang_service_uvm_unit"], *role_defaults()["sglang_service_unit_names"]]


def render_units(prefix: Path, overrides: dict | None = None, *, scripts: bool = False,
                 inventory_vars: dict | None = None) -> Path:
    """Render every unit of the role under ``prefix``; returns the unit directory.

    ``overrides`` are extra vars (as `dsv4kit provision`'s own); ``inventory_vars`` go in at the
    inventory's precedence (below the role's set_fact, e.g. dsv4_fp4_indexer: auto).

    ``scripts``: also the environment files of the other roles the units read (nccl.env,
    kernel-flags.env) and the role's real box-side scripts in its bin directory (the preflight
    rendered, the health wait, the router launcher, the nvidia_uvm loader), and no venv python:
    the caller provides one. Otherwise those programs are stand-ins that exit 0."""
    prefix.mkdir(parents=True, exist_ok=True)
    if 'content: "DSV4_ROUTER_API_KEY={{ dsv4_router_api_key }}\\n"' not in (ROLE / "tasks/main.yml").read_text():
        raise AssertionError("the role writes the router's key file differently now: update render_units")
    site_vars = yaml.safe_load((REPO / "playbooks/site.yml").read_text())[0]["vars"]
    pins = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    extra = {**pins, **site_vars, "dsv4_prefix": str(prefix), "dsv4_venv_dir": str(prefix / "opt/dsv4/venv"),
             "dsv4_state_dir": str(prefix / "var/lib/dsv4kit"), "ansible_managed": "managed by dsv4kit", "ansible_python_interpreter": sys.executable,
             **(overrides or {})}
    servers = "{{ sglang_service_servers }}"
    for name in inventory_vars or {}:
        extra.pop(name, None)
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars_files": [str(ROLE / "defaults/main.yml")], "vars": dict(inventory_vars or {}), "tasks": []}]
    tasks = [
        # the role's own first step: dsv4_fp4_indexer as provision resolved it (never a literal 'auto')
        {"ansible.builtin.import_tasks": str(ROLE / "tasks/fp4_indexer.yml")},
        {"ansible.builtin.file": {"path": "{{ item }}", "state": "directory", "mode": "0755"},
         "loop": ["{{ sglang_service_unit_dir }}", "{{ sglang_service_bin_dir }}", "{{ dsv4_venv_dir }}/bin",
                  "{{ sglang_service_home }}"]},
        {"ansible.builtin.template": {"src": str(ROLE / "templates/dsv4-server.service.j2"),
                                      "dest": "{{ sglang_service_unit_dir }}/dsv4-{{ item.name }}.service",
                                      "mode": "0644"}, "loop": servers},
        *({"ansible.builtin.template": {"src": str(ROLE / f"templates/{name}.j2"),
                                        "dest": "{{ sglang_service_unit_dir }}/" + name, "mode": "0644"}}
          for name in ("dsv4-router.service", "dsv4-nvidia-uvm.service")),
        {"ansible.builtin.file": {"path": "{{ dsv4_etc_dir }}", "state": "directory", "mode": "0755"}},
        {"ansible.builtin.file": {"path": "{{ sglang_service_firewall_file | dirname }}", "state": "directory",
                                  "mode": "0755"}},
        {"ansible.builtin.template": {"src": str(ROLE / "templates/dsv4-firewall.nft.j2"),
                                      "dest": "{{ sglang_service_firewall_file }}", "mode": "0644"}},
        {"ansible.builtin.template": {"src": str(ROLE / "templates/service.env.j2"),
                                      "dest": "{{ sglang_service_env_file }}", "mode": "0644"}},
        {"ansible.builtin.template": {"src": str(ROLE / "templates/server-secret.yaml.j2"),
                                      "dest": "{{ sglang_service_server_secret_file }}", "mode": "0640"},
         "when": "dsv4_router_api_key | length > 0"},
        # tasks/main.yml writes this one from an inline content, the same line as here.
        {"ansible.builtin.copy": {"content": "DSV4_ROUTER_API_KEY={{ dsv4_router_api_key }}\n",
                                  "dest": "{{ sglang_service_router_secret_file }}", "mode": "0600"},
         "when": "dsv4_router_api_key | length > 0"},
    ]
    if scripts:
        tasks += [
            {"ansible.builtin.template": {"src": str(REPO / "playbooks/roles" / src), "dest": dest, "mode": "0644"}}
            for src, dest in (("host_tuning/templates/nccl.env.j2", "{{ dsv4_etc_dir }}/nccl.env"),
                              ("kernel_rollout/templates/kernel-flags.env.j2", "{{ dsv4_etc_dir }}/kernel-flags.env"))]
        tasks.append({"ansible.builtin.template": {"src": str(ROLE / "templates/dsv4-serve-preflight.j2"),
                                                   "dest": "{{ sglang_service_bin_dir }}/dsv4-serve-preflight",
                                                   "mode": "0755"}})
        tasks += [{"ansible.builtin.copy": {"src": str(ROLE / "files" / src),
                                            "dest": "{{ sglang_service_bin_dir }}/" + dest, "mode": "0755"}}
                  for src, dest in (("health_wait.py", "dsv4-health-wait"), ("router_launch.py", "dsv4-router-launch"),
                                    ("nvidia_uvm.sh", "dsv4-nvidia-uvm"))]
    else:
        tasks.append({"ansible.builtin.copy": {"content": "#!/bin/sh\nexit 0\n", "dest": "{{ item }}", "mode": "0755"},
                      "loop": ["{{ dsv4_venv_dir }}/bin/python", "{{ sglang_service_bin_dir }}/dsv4-serve-preflight",
                               "{{ sglang_service_bin_dir }}/dsv4-nvidia-uvm"]})
    play[0]["tasks"] = tasks
    (prefix / "render.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    (prefix / "extra.json").write_text(json.dumps(extra))
    env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(prefix / ".ansible-tmp")}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                           "-e", f"@{prefix / 'extra.json'}", str(prefix / "render.yml")],
                          capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"rendering the units failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    return prefix / "etc/systemd/system"
