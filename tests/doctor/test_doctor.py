"""``dsv4kit doctor`` against a box reached through a real sshd on 127.0.0.1: its login PATH puts
stand-ins for ``nvidia-smi`` and ``systemctl`` first (each reads a state file the test sets), and
a loopback HTTP server answers for the router and both servers; sudo is the real one. One passing box, then one failing check
each: no SSH, sudo asking for a password (a real non-root login whose sudoers rule wants one), a GPU
missing, a unit down, the router's /health failing."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from dsv4kit.core import exitcodes
from tests.cli_support import cli, waiting_venv
from tests.remote_inventory import closed_port, write_inventory
from tests.sshd import LoopbackSSHD

_TOOLS = {
    "nvidia-smi": '[ -e "$BOX/gpus-hang" ] && exec sleep 600\nn=$(cat "$BOX/gpus"); i=0\nwhile [ $i -lt $n ]; do\n'
                  '  echo "GPU $i: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-$i)"; i=$((i+1))\ndone\n',
    "systemctl": '[ "$1" = is-active ] || { echo "stand-in: only is-active" >&2; exit 2; }\nshift; rc=0\n'
                 'for u in "$@"; do s=$(cat "$BOX/units/$u" 2>/dev/null || echo inactive); echo "$s"\n'
                 '  [ "$s" = active ] || rc=3; done\nexit $rc\n',
}


class _Router(http.server.BaseHTTPRequestHandler):
    healthy = True

    def do_GET(self):  # noqa: N802 - http.server's name
        code = 200 if self.path == "/health" and _Router.healthy else 503
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok" if code == 200 else b"unhealthy")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor")
    state, tools = root / "box", root / "bin"
    (state / "units").mkdir(parents=True)
    tools.mkdir()
    for name, body in _TOOLS.items():
        (tools / name).write_text("#!/bin/sh\n" + body)
        (tools / name).chmod(0o755)
    path = f"{tools}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    sshd = LoopbackSSHD(root / "sshd", extra_config=(f"SetEnv PATH={path} BOX={state}",)).start()
    router = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    threading.Thread(target=router.serve_forever, daemon=True).start()
    venv = waiting_venv(root / "venv")  # the box venv's python: the bench's readiness helper runs there
    port = router.server_address[1]  # the router and both servers: one stand-in answers for all
    inventory = write_inventory(root / "inv", sshd, dsv4_venv_dir=str(venv), dsv4_router_port=port,
                                dsv4_prefill_port=port, dsv4_decode_port=port)
    yield {"state": state, "sshd": sshd, "inventory": inventory, "root": root}
    router.shutdown()
    sshd.stop()


@pytest.fixture
def healthy(box):
    state = box["state"]
    (state / "gpus").write_text("8\n")
    (state / "gpus-hang").unlink(missing_ok=True)
    from dsv4kit.bench.restart_plan import serving_units

    for unit in serving_units():
        (state / "units" / unit).write_text("active\n")
    _Router.healthy = True
    return box


def _doctor(inventory, *extra):
    code, out, err = cli("doctor", "-i", inventory, "--timeout", "20", "--json", *extra)
    report = json.loads(out)
    return code, report, {(c["name"]): c for c in report["checks"]}, err


def test_a_ready_box_passes_every_check(healthy):
    code, report, checks, err = _doctor(healthy["inventory"])
    assert code == exitcodes.OK and report["ok"], err
    assert list(checks) == ["python", "ansible-core", "ssh client", "dsv4kit", "inventory", "ssh", "sudo", "gpus",
                            "units", "health"]
    assert all(c["ok"] for c in checks.values())
    assert "8 GPU(s)" in checks["gpus"]["detail"]
    code, out, _ = cli("doctor", "-i", healthy["inventory"], "--timeout", "20")
    assert code == 0 and "PASS  health [lo]" in out and "10 of 10 checks passed" in out


@pytest.mark.parametrize("breakage, failed, code, fix", [
    ("gpu", "gpus", exitcodes.ENVIRONMENT, "dsv4_gpu_count"),
    ("hang", "gpus", exitcodes.TIMEOUT, "--timeout"),
    ("unit", "units", exitcodes.CHECK_FAILED, "journalctl -u dsv4-decode.service"),
    ("health", "health", exitcodes.CHECK_FAILED, "dsv4-decode.service"),
])
def test_one_failing_check_names_its_fix(healthy, breakage, failed, code, fix):
    state = healthy["state"]
    if breakage == "gpu":
        (state / "gpus").write_text("7\n")
    elif breakage == "hang":  # a command past --timeout is a failed check, never a traceback
        (state / "gpus-hang").write_text("")
    elif breakage == "unit":
        (state / "units" / "dsv4-decode.service").write_text("failed\n")
    else:
        _Router.healthy = False
    got, report, checks, err = _doctor(healthy["inventory"], "--timeout",
                                       "3" if breakage in ("health", "hang") else "20")
    assert got == code and report["exit_code"] == code and not report["ok"], (report, err)
    assert not checks[failed]["ok"] and fix in checks[failed]["fix"], checks[failed]
    assert [c for c in report["checks"] if not c["ok"]] == [checks[failed]]  # the others still pass


def test_no_ssh_is_unreachable_and_stops_that_box(box, tmp_path):
    inventory = write_inventory(tmp_path / "inv", box["sshd"], ansible_port=closed_port())
    code, report, checks, _ = _doctor(inventory)
    assert code == exitcodes.UNREACHABLE
    assert not checks["ssh"]["ok"] and "ssh -p" in checks["ssh"]["fix"]
    assert "sudo" not in checks and "gpus" not in checks  # nothing more is tried on that box


def test_a_broken_inventory_is_bad_input(tmp_path):
    bad = tmp_path / "hosts.yml"
    bad.write_text("all:\n  hosts:\n    lo:\n      dsv4_gpu_count: eight\n")
    code, report, checks, _ = _doctor(bad)
    assert code == exitcodes.USAGE and not checks["inventory"]["ok"]
    assert checks["python"]["ok"] and checks["ssh client"]["ok"]


def test_a_sudo_that_asks_for_a_password_fails_the_sudo_check(tmp_path):
    """The real sudo, for a non-root login: passwordless passes; a rule that wants a password fails."""
    from tests.sudo_login import sudo_login

    with sudo_login() as login:
        inventory = write_inventory(tmp_path / "inv", login.sshd, ansible_user=login.user)
        _, _, checks, err = _doctor(inventory)
        assert checks["ssh"]["ok"] and login.user in checks["ssh"]["detail"], err
        assert checks["sudo"]["ok"], checks["sudo"]
        rule = Path(f"/etc/sudoers.d/dsv4kit-test-{login.user}")
        rule.write_text(f"{login.user} ALL=(ALL) ALL\n")
        code, report, checks, _ = _doctor(inventory)
        assert code == exitcodes.ENVIRONMENT and not checks["sudo"]["ok"]
        assert "password" in checks["sudo"]["detail"] and "NOPASSWD" in checks["sudo"]["fix"], checks["sudo"]
        assert "-K" in checks["sudo"]["fix"]
