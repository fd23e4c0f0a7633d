"""The inventory's FP4 indexer setting (dsv4_fp4_indexer) through the serving units Ansible renders
and SGLang 0.5.23's own argument pipeline (prepare_server_args from the cached wheel): on, both
servers resolve enable_deepseek_v4_fp4_indexer=True and their environment turns SGLang's sm_120
TileLang default off; off (the tracked default), both resolve False and the environment is as
before."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.service_units import REPO, render_units
from tests.sglang_wheel import sglang_site

SERVERS = ("dsv4-prefill.service", "dsv4-decode.service")

PARSE = r"""
import json, sys
from sglang.srt.server_args import prepare_server_args
out = {}
for name, argv in json.loads(sys.stdin.read()).items():
    args = prepare_server_args(argv)
    out[name] = {"fp4": args.enable_deepseek_v4_fp4_indexer, "mode": args.disaggregation_mode}
print(json.dumps(out))
"""


def _argv(unit: Path) -> list[str]:
    line = next(x for x in unit.read_text().splitlines() if x.startswith("ExecStart="))
    words = shlex.split(line.split("=", 1)[1])
    return words[words.index("sglang.launch_server") + 1:]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """True, False, and 'auto' as `dsv4kit provision` passes it resolved (the plan's extra var)."""
    out = {value: render_units(tmp_path_factory.mktemp(f"fp4-{value}") / "prefix", {"dsv4_fp4_indexer": value})
           for value in (True, False)}
    out["auto"] = render_units(tmp_path_factory.mktemp("fp4-auto") / "prefix",
                               {"sglang_service_fp4_indexer_plan": {"localhost": True}},
                               inventory_vars={"dsv4_fp4_indexer": "auto"})
    return out


@pytest.fixture(scope="module")
def resolved(rendered):
    argvs = {f"{value}:{name}": _argv(units / name) for value, units in rendered.items()
             for name in SERVERS}
    env = {**os.environ, "PYTHONPATH": str(sglang_site())}
    done = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(argvs), text=True,
                          capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_tracked_default_is_off():
    pins = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    assert pins["dsv4_fp4_indexer"] is False


@pytest.mark.parametrize("name", SERVERS)
def test_sglang_resolves_the_setting_on_both_servers(resolved, name):
    assert resolved[f"True:{name}"]["fp4"] is True
    assert resolved[f"False:{name}"]["fp4"] is False
    assert resolved[f"auto:{name}"]["fp4"] is True  # resolved by provision to true
    assert resolved[f"True:{name}"]["mode"] == name.split("-")[1].split(".")[0]


def test_on_turns_the_tilelang_default_off_in_the_units_environment(rendered):
    env_on = (rendered[True].parents[1] / "dsv4kit").glob("*.env")
    on = "".join(p.read_text() for p in env_on)
    off = "".join(p.read_text() for p in (rendered[False].parents[1] / "dsv4kit").glob("*.env"))
    assert "\nSGLANG_OPT_USE_TILELANG_INDEXER=0\n" in on
    assert "SGLANG_OPT_USE_TILELANG_INDEXER" not in off


def test_the_role_takes_the_resolved_setting_and_refuses_a_literal_auto(tmp_path):
    """The role's own tasks (tasks/fp4_indexer.yml) under ansible-playbook, one host per case: a
    resolved 'auto' (sglang_service_fp4_indexer_plan) replaces the inventory's value; an 'auto'
    nothing resolved stops its host naming `dsv4kit provision`; true/false pass as they are."""
    role = REPO / "playbooks/roles/sglang_service"
    hosts = {"resolved": "auto", "unresolved": "auto", "off": False, "on": True}
    inventory = {"all": {"hosts": {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                          "dsv4_fp4_indexer": value} for name, value in hosts.items()}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [{"hosts": "all", "gather_facts": False, "vars_files": [str(role / "defaults/main.yml")],
             "tasks": [{"ansible.builtin.import_tasks": str(role / "tasks/fp4_indexer.yml")},
                       {"ansible.builtin.debug": {"msg": "RENDERED {{ inventory_hostname }} {{ dsv4_fp4_indexer | bool }} "
                                                         "{{ sglang_service_fp4_indexer_args | to_json }}"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".tmp")}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                           "-e", json.dumps({"sglang_service_fp4_indexer_plan": {"resolved": True}}),
                           str(tmp_path / "play.yml")], capture_output=True, text=True, timeout=300, env=env)
    out = done.stdout
    assert done.returncode != 0, out  # the unresolved host failed
    assert 'RENDERED resolved True [\\"--enable-deepseek-v4-fp4-indexer\\"]' in out
    assert "RENDERED on True" in out and 'RENDERED off False []' in out
    assert "RENDERED unresolved" not in out
    assert "dsv4_fp4_indexer is auto here and nothing resolved it" in out and "dsv4kit provision" in out
