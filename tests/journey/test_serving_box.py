"""The serving units on one simulated box, started for real: what the sglang_service role renders
(through Ansible) is started by the ``systemctl`` stand-in, the servers' command lines go through
SGLang 0.5.23's own parser and the router's through sglang-router 0.3.2's, and the checks the role
and the CLI run read what that box holds: the role's health waits, `dsv4kit rollout status --host`
over real SSH, and the listening sockets. Then one seam broken at a time, each caught with a
clear message: a mistyped extra argument (and the start limit it runs into), a router with no
worker, units under another name. (A report kept in another directory: tests/rollout/test_results_dir.py.)
"""

from __future__ import annotations

import json
import time

import pytest
from tests.cli_support import invoke

from dsv4kit.core import exitcodes
from tests.journey.simulated_box import SimulatedBox
from tests.listening import listeners
from tests.remote_inventory import write_inventory
from tests.cli_support import cli

pytestmark = pytest.mark.slow

INDEXER, ATTENTION = "SGLANG_SM120_TRITON_INDEXER", "SGLANG_SM120_MMA_ATTENTION"
KEY = "sk-journey-7f2"


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    """A box whose 'auto' flags were resolved (indexer on, attention off) and whose router has a key."""
    box = SimulatedBox(tmp_path_factory.mktemp("box"), {
        "dsv4_kernel_flags": {INDEXER: "1", ATTENTION: "0"}, "dsv4_router_api_key": KEY}).build()
    box.start_all()
    yield box
    box.stop_all()


@pytest.fixture(scope="module")
def broken_box(tmp_path_factory):
    """A box whose inventory adds an extra server argument SGLang does not know."""
    box = SimulatedBox(tmp_path_factory.mktemp("broken"), {
        "dsv4_kernel_flags": {INDEXER: "0", ATTENTION: "0"}, "dsv4_server_extra_args": ["--enable-metrcs"]}).build()
    yield box
    box.stop_all()


def test_the_role_waits_find_both_servers_and_a_router_that_serves(box):
    for argv in box.server_waits():
        code, result = box.wait(argv)
        assert code == 0, result
    code, result = box.wait(box.router_wait())
    assert code == 0, result
    # nvidia_uvm was loaded, and its device nodes made, before the GPU servers started.
    assert (box.root / "module-calls").read_text().splitlines() == ["modprobe nvidia_uvm", "nvidia-modprobe -u -c=0"]


def test_the_servers_require_the_routers_key(box):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{box.vars['dsv4_decode_port']}/server_info", timeout=10)
    assert refused.value.code == 401
    ps = " ".join(open(f"/proc/{pid}/cmdline").read().replace("\0", " ") for pid in _all_pids(box))
    assert KEY not in ps, "an API key is on a command line"


def _all_pids(box) -> list[int]:
    from tests.listening import _descendants

    return sorted(set().union(*(_descendants(pid) for pid in box.pids())))


def test_the_quickstarts_rollout_status_line_reads_the_flags_the_units_run_with(box, loopback_ssh, tmp_path):
    """docs/quickstart.md's own line, with its inventory in $DSV4KIT_INVENTORY as its section 2 sets it."""
    import shlex

    from tests.docs.test_quickstart import QUICKSTART, shown_commands

    (line,) = [c for c, complete in shown_commands(QUICKSTART.read_text()) if complete
               and c.startswith("dsv4kit rollout status --host")]
    argv = shlex.split(line)[1:]
    host = argv[argv.index("--host") + 1]
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, name=host, dsv4_prefix=str(box.prefix),
                                dsv4_venv_dir=str(box.venv))
    result = invoke(argv, env={"DSV4KIT_INVENTORY": str(inventory)})
    out = result.stdout
    assert f"Flags read from the serving units' environment on {host}: {box.units}/dsv4-prefill.service" in out, out
    assert f"Flag {INDEXER}: on ('1')" in out and f"Flag {ATTENTION}: off" in out, out


def test_rollout_status_host_reads_the_flags_from_the_units_the_role_wrote(box, loopback_ssh, tmp_path):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_prefix=str(box.prefix),
                                dsv4_venv_dir=str(box.venv))
    code, out, err = cli("rollout", "status", "--host", "lo", "-i", str(inventory), "--json")
    report = json.loads(out)
    used = report["environment_from"]
    assert used[0] == str(box.units / "dsv4-prefill.service") and str(box.units / "dsv4-decode.service") in used, used
    assert str(box.prefix / "etc/dsv4kit/kernel-flags.env") in used
    assert report["flags"][INDEXER]["enabled"] and not report["flags"][ATTENTION]["enabled"], report["flags"]


def test_a_closed_box_listens_on_loopback_only_and_on_no_port_the_inventory_did_not_open(box):
    found = listeners(*box.pids())
    opened = {box.vars[name] for name in ("dsv4_router_port", "dsv4_prefill_port", "dsv4_decode_port",
                                          "sglang_service_metrics_port")}  # the router's /metrics
    assert {l.port for l in found} == opened, found
    assert all(l.loopback for l in found), [l for l in found if not l.loopback]


def test_a_mistyped_extra_argument_is_named_within_seconds_and_the_start_limit_is_reset(broken_box):
    box = broken_box
    assert box.systemctl("start", "dsv4-decode.service").returncode == 0
    (argv,) = [a for a in box.server_waits(timeout=1800) if "dsv4-decode.service" in a]
    started = time.monotonic()
    code, result = box.wait(argv)
    waited = time.monotonic() - started
    assert code == 1, result
    assert waited < 300, f"a unit that died was waited on for {waited:.0f} s"
    error = result["error"]
    assert error.startswith("dsv4-decode.service ") and "exit status 2" in error, error
    assert "unrecognized arguments: --enable-metrcs" in error, error
    # Two more attempts (StartLimitBurst=3), then systemd refuses every start, manual ones too ...
    for _ in range(2):
        assert box.systemctl("start", "dsv4-decode.service").returncode == 0
        box.systemctl("stop", "dsv4-decode.service")
    refused = box.systemctl("start", "dsv4-decode.service")
    assert refused.returncode == 1 and box.show("dsv4-decode.service")["Result"] == "start-limit-hit"
    # ... until the role's reset-failed, which it runs before every start.
    assert box.systemctl("reset-failed", "dsv4-decode.service").returncode == 0
    assert box.systemctl("start", "dsv4-decode.service").returncode == 0
    box.systemctl("stop", "dsv4-decode.service")


def test_a_router_with_no_worker_is_not_ready(broken_box):
    box = broken_box
    assert box.systemctl("start", "dsv4-router.service").returncode == 0
    health = box.wait([*box.router_wait(timeout=60)[:4], "/health", "--timeout", "60", "--interval", "1"])
    assert health[0] == 0  # what the old check waited for: 200 with no worker
    code, result = box.wait(box.router_wait(timeout=5))
    assert code == 4 and "503" in result["error"], result
    box.systemctl("stop", "dsv4-router.service")


def test_units_under_another_name_are_named_not_read_from_the_login(broken_box, loopback_ssh, tmp_path):
    box = broken_box
    for name in ("dsv4-prefill.service", "dsv4-decode.service"):
        (box.units / name).rename(box.units / name.replace("dsv4-", "dsv4-server-"))
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_prefix=str(box.prefix),
                                dsv4_venv_dir=str(box.venv))
    code, out, err = cli("rollout", "status", "--host", "lo", "-i", str(inventory))
    assert code == exitcodes.ENVIRONMENT, out + err
    assert f"{box.units}/dsv4-prefill.service" in err and "no serving unit on lo" in err


def test_the_role_health_waits_keep_the_key_out_of_ps_sudos_log_and_vvv(box, tmp_path):
    """The role's own health.yml, run by the real ansible-playbook -vvv as a non-root login that becomes
    root with sudo: the router's key is in no process's argv (every user's `ps`), in no environment a
    non-root user can read, not in sudo's log and not in the -vvv output, and the waits still pass
    (the router and the servers refuse a request without it). The router is paused while its wait
    runs, so the watch sees that wait's processes for certain."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    from pathlib import Path

    import yaml

    from tests.listening import _descendants
    from tests.service_units import ROLE
    from tests.sudo_login import ProcessWatch, sudo_login

    if os.geteuid() != 0:
        pytest.skip("needs root to add a login user with sudo")
    site_vars = yaml.safe_load((ROLE.parents[2] / "playbooks/site.yml").read_text())[0]["vars"]
    pins = yaml.safe_load((ROLE.parents[2] / "inventory/group_vars/all.yml").read_text())
    extra = {**{k: v for k, v in pins.items() if not k.startswith("ansible_")}, **site_vars,
             "dsv4_prefix": str(box.prefix), "dsv4_venv_dir": str(box.venv),
             "dsv4_state_dir": str(box.prefix / "var/lib/dsv4kit"), "dsv4_health_timeout": 120, **box.vars}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    play = [{"hosts": "box", "gather_facts": False, "vars_files": [str(ROLE / "defaults/main.yml")],
             # the systemctl stand-in, as site.yml's provision_task_environment passes a test box's tools
             "environment": {"PATH": box.env["DSV4KIT_STANDIN_PATH"],
                             **{k: v for k, v in box.env.items() if k.startswith("DSV4KIT_STANDIN_")}},
             "tasks": [{"name": "The role's health waits",
                        "ansible.builtin.include_tasks": str(ROLE / "tasks/health.yml")}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    router = int(box.show("dsv4-router.service")["MainPID"])
    with sudo_login() as login:
        (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": login.host_vars()}}}))
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROLE.parents[2] / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
        paused = sorted(_descendants(router))
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        watch = ProcessWatch(KEY)

        def resume_once_the_router_wait_is_seen():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not any("--generate" in line for line in watch.seen):
                time.sleep(0.05)
            time.sleep(0.5)  # the watch reads every process a few more times while the wait hangs
            for pid in paused:
                os.kill(pid, signal.SIGCONT)

        resumer = threading.Thread(target=resume_once_the_router_wait_is_seen, daemon=True)
        try:
            with watch.running():
                resumer.start()
                run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-vvv",
                                      "-i", str(tmp_path / "hosts.yml"), "-e", f"@{tmp_path / 'extra.json'}",
                                      str(tmp_path / "play.yml")], capture_output=True, text=True, timeout=400,
                                     env=env)
                resumer.join(timeout=130)
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        sudo_log = login.sudo_log.read_text() if login.sudo_log.exists() else ""
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert any("--generate" in line for line in watch.seen), "the watch never saw the router's wait"
    assert f"{login.user} :" in sudo_log and "COMMAND=" in sudo_log, sudo_log[-2000:]
    assert "<127.0.0.1> SSH: EXEC" in run.stdout  # -vvv output indeed
    assert not watch.found, sorted(watch.found)
    assert KEY not in sudo_log, "the key is in sudo's log"
    assert KEY not in run.stdout + run.stderr, "the key is in the -vvv output"
