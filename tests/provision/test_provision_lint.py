"""Static checks of the provisioning playbook: ansible-lint (production profile), syntax check,
documented role defaults, pins only in inventory/group_vars/all.yml, and the summary parser."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dsv4kit.core.inventory_schema import FIELDS
from dsv4kit.provision.playbook import PlaybookSummary, format_summary

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "playbooks" / "roles"
STAGES = ["preflight", "nvidia_driver", "cuda_toolkit", "host_tuning", "sglang_venv", "model_weights", "flash_attn",
          "kernel_rollout", "sglang_service", "monitoring"]
PLAY_VARS = {"dsv4_root", "dsv4_etc_dir", "dsv4_restart_flag", "dsv4_rollout_unverified_flag", "dsv4_venv_key",
             "dsv4_venv_build_dir"}  # playbooks/site.yml
RESTART = "Restart the serving units"


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed")
    return path


def test_ansible_lint_production_profile_passes():
    proc = subprocess.run([_tool("ansible-lint"), "--profile", "production", "--nocolor"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "production" in proc.stdout + proc.stderr


def test_syntax_check():
    proc = subprocess.run([_tool("ansible-playbook"), "--syntax-check", "-i", "inventory/fleet.yml",
                           "playbooks/site.yml"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_first_provision_runs_the_p2p_check_once_the_venv_has_torch_and_dsv4kit():
    """ansible-playbook --list-tasks: in a full play the P2P measurement comes after kernel_rollout
    installed dsv4kit into the venv sglang_venv built (host_tuning runs before both), and before
    the servers take the GPUs."""
    proc = subprocess.run([_tool("ansible-playbook"), "--list-tasks", "-i", "inventory/fleet.yml", "playbooks/site.yml"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tasks = [line.strip() for line in proc.stdout.splitlines()]
    wheel = tasks.index(next(t for t in tasks if t.startswith("kernel_rollout : Record the installed wheel")))
    venv = max(i for i, t in enumerate(tasks) if t.startswith("sglang_venv :"))
    served = min(i for i, t in enumerate(tasks) if t.startswith("sglang_service :"))
    p2p = [i for i, t in enumerate(tasks) if "GPU-to-GPU" in t and i > wheel]
    assert p2p and venv < wheel < p2p[0] < served, tasks[wheel:served + 1]


def test_a_failed_run_never_flushes_handlers():
    """force_handlers would restart the servers into what a failed run left half-done: a restart is
    kept in dsv4_restart_flag for the next successful run instead (tests/provision/test_provision_run.py)."""
    play = yaml.safe_load((REPO / "playbooks/site.yml").read_text())[0]
    assert "force_handlers" not in play
    assert play["vars"]["dsv4_restart_flag"].startswith("{{ dsv4_state_dir }}/")


def _writes(task: dict, flag: str) -> bool:
    return task.get("ansible.builtin.copy", {}).get("dest") == "{{ %s }}" % flag


def _restart_notifications(tasks: list, block: dict | None = None):
    """(task, the block it is in or None, the list it is in, its index there) for every task, in
    blocks too, that notifies the restart handler (the debug carrying out a pending one aside)."""
    for index, task in enumerate(tasks):
        if "block" in task:
            yield from _restart_notifications(task["block"], task)
            for part in ("rescue", "always"):
                yield from _restart_notifications(task.get(part, []), None)
        elif task.get("notify") == RESTART and "ansible.builtin.debug" not in task:
            yield task, block, tasks, index


def test_every_restart_notification_also_records_the_flag():
    """Each change that notifies "Restart the serving units" also writes dsv4_restart_flag, so a run
    that fails after it leaves the restart to the next successful run. Either the change sits in a
    block whose `always:` writes the flag when the task's registered result (guarded with default,
    for a task a failure came before) changed, or the flag is written right before the task, under
    the same condition (the wheel install: written before the change)."""
    seen = 0
    for tasks_file in ROLES.glob("*/tasks/*.yml"):
        tasks = yaml.safe_load(tasks_file.read_text()) or []
        for task, block, siblings, index in _restart_notifications(tasks):
            seen += 1
            where = f"{tasks_file.relative_to(REPO)}: {task['name']!r}"
            if block is not None:
                register = task.get("register")
                assert register, f"{where} notifies a restart inside a block but registers no result for its always:"
                writes = [t for t in block.get("always", []) if _writes(t, "dsv4_restart_flag")]
                assert writes, f"{where}: its block has no always: task writing dsv4_restart_flag"
                assert any(re.search(rf"\(\s*{register}\s*\|\s*default\(\{{\}}\)\s*\)\s+is\s+changed", str(t.get("when")))
                           for t in writes), f"{where}: the always: flag write does not test ({register} | default({{}})) is changed"
            else:
                before = siblings[max(0, index - 2):index]
                writes = [t for t in before if _writes(t, "dsv4_restart_flag") and t.get("when") == task.get("when")]
                assert writes, (f"{where} notifies a restart outside a block and records no dsv4_restart_flag right "
                                "before it under the same condition")
    assert seen >= 7  # preflight script, env file, 2 unit tasks, NCCL env, wheel, kernel flags


def test_an_unverified_rollout_stops_every_restart():
    """kernel_rollout marks the rollout unverified before the wheel install (and with new flags) and
    clears the mark only after its status check; sglang_service and the restart handler refuse while
    it is there."""
    rollout = yaml.safe_load((ROLES / "kernel_rollout/tasks/main.yml").read_text())
    names = [t["name"] for t in rollout]
    install = names.index("Install the wheel into the venv without dependencies")
    marks = [i for i, t in enumerate(rollout[:install]) if _writes(t, "dsv4_rollout_unverified_flag")]
    assert marks and rollout[marks[0]]["when"] == rollout[install]["when"]
    flags_block = next(t for t in rollout if "block" in t and any("kernel_rollout_flags" == b.get("register") for b in t["block"]))
    assert any(_writes(t, "dsv4_rollout_unverified_flag") for t in flags_block["always"])
    cleared = next(i for i, t in enumerate(rollout) if t.get("ansible.builtin.file", {}).get("path") == "{{ dsv4_rollout_unverified_flag }}")
    assert cleared > names.index("Check the rollout status")
    assert rollout[cleared]["ansible.builtin.file"]["state"] == "absent"

    service = yaml.safe_load((ROLES / "sglang_service/tasks/main.yml").read_text())
    assert service[0]["ansible.builtin.stat"]["path"] == "{{ dsv4_rollout_unverified_flag }}"
    assert "ansible.builtin.fail" in service[1]
    handlers = yaml.safe_load((ROLES / "sglang_service/handlers/main.yml").read_text())
    assert all(h.get("listen") == RESTART for h in handlers)
    assert handlers[0]["ansible.builtin.stat"]["path"] == "{{ dsv4_rollout_unverified_flag }}"
    assert "ansible.builtin.fail" in handlers[1]
    assert "--tags kernel_rollout" in yaml.safe_load((ROLES / "sglang_service/defaults/main.yml").read_text())[
        "sglang_service_unverified_msg"]


def test_every_stage_is_a_tagged_role():
    play = yaml.safe_load((REPO / "playbooks/site.yml").read_text())[0]
    assert [(r["role"], r["tags"]) for r in play["roles"]] == [(s, [s]) for s in STAGES]
    for stage in STAGES:
        assert (ROLES / stage / "tasks/main.yml").is_file()


@pytest.mark.parametrize("stage", STAGES)
def test_role_defaults_are_documented_and_hold_no_pins(stage):
    text = (ROLES / stage / "defaults/main.yml").read_text()
    lines = text.splitlines()
    assert lines[1].startswith("# "), f"{stage}: defaults/main.yml must open with a comment saying what the role does"
    for number, line in enumerate(lines):
        if re.match(r"^[a-z_0-9]+:", line):
            name = line.split(":")[0]
            assert name.startswith(stage + "_"), f"{stage}: {name} must carry the role prefix"
            above = lines[number - 1]
            assert above.startswith("#"), f"{stage}: {name} has no comment above it"
            value = line.split(":", 1)[1]
            assert not re.search(r"""["' ]\d+\.\d+(\.\d+)?["']?\s*$""", value), \
                f"{stage}: {name} looks like a version pin; pins belong in inventory/group_vars/all.yml"


def test_every_dsv4_variable_is_in_the_schema_and_pinned_in_group_vars():
    all_vars = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    assert {name for name in all_vars if not name.startswith("ansible_")} == set(FIELDS)
    used = set()
    for path in list((REPO / "playbooks").rglob("*.yml")) + list((REPO / "playbooks").rglob("*.j2")):
        used |= set(re.findall(r"\bdsv4_[a-z0-9_]+\b", path.read_text()))
    used -= {"dsv4_boxes"}  # the inventory group
    unknown = used - PLAY_VARS - set(FIELDS)
    assert not unknown, f"dsv4_* variables used by the playbook but not in the schema: {sorted(unknown)}"


def test_summary_table_and_exit_codes():
    counts = dict(ok=3, changed=1, unreachable=0, failed=0, skipped=2, rescued=0, ignored=0)
    ok = PlaybookSummary(hosts={"box1": counts}, returncode=0, command=[], duration_s=1.0)
    assert ok.exit_code == 0 and not ok.failed and "ok, 1 changed" in format_summary(ok)
    down = PlaybookSummary(hosts={"box1": {**counts, "unreachable": 1}}, returncode=4, command=[], duration_s=1.0)
    assert down.exit_code == 3 and "unreachable" in format_summary(down)
    failed = PlaybookSummary(hosts={"box1": {**counts, "failed": 1}}, returncode=2, command=[], duration_s=1.0)
    assert failed.exit_code == 6
    stopped = PlaybookSummary(hosts={}, returncode=-15, command=[], duration_s=1.0, timed_out=True)
    assert stopped.failed and stopped.exit_code == 4 and stopped.to_dict()["timed_out"] is True
    table = format_summary(failed).splitlines()
    assert table[0].split() == ["HOST", "OK", "CHANGED", "FAILED", "UNREACHABLE", "SKIPPED"]
    assert table[1].split() == ["box1", "3", "1", "1", "0", "2"]
