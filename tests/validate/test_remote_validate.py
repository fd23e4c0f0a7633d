"""``dsv4kit validate --gpu N`` against the real loopback sshd, the harness on the Triton interpreter.

The "box" is this machine reached over SSH: its venv is a venv that sees this interpreter's
packages (tests/remote_inventory.py). Each failure mode must end with a clear message and the
documented exit code, keep no report, and leave no scratch directory behind.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from dsv4kit.core import exitcodes

from dsv4kit.validate import remote as remote_validate

from dsv4kit.core import wheelbuild
from tests.remote_inventory import BOX_VENV_LAYOUT, closed_port, keygen, write_inventory
from tests.cli_support import cli

CASE = "indexer:1x2x100x16"  # one tiny case: a few seconds in the interpreter
SECRET = "s3cr3t-value-never-logged"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """This checkout's wheel, built once per session."""
    return wheelbuild.build_wheel(tmp_path_factory.mktemp("wheel")).path


@pytest.fixture
def box(tmp_path, loopback_ssh):
    """(inventory path, results dir, scratch root) for a fresh loopback box."""
    inventory = write_inventory(tmp_path / "inv", loopback_ssh)
    return inventory, tmp_path / "results", tmp_path / "inv" / "state" / "scratch"


def validate(*args: str):
    return cli("validate", *args)


def no_leftovers(results: Path, scratch: Path) -> None:
    assert not results.exists() or not any(results.iterdir()), "a report was kept for a failed run"
    assert not scratch.exists() or not any(scratch.iterdir()), f"scratch left behind: {list(scratch.iterdir())}"


# --------------------------------------------------------------------------- the working path
def test_wheel_builds_are_reproducible(wheel, tmp_path):
    again = wheelbuild.build_wheel(tmp_path / "again")
    assert again.sha256 == wheelbuild.sha256_of(wheel)


def test_wheel_holds_the_three_packages(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("dsv4kit/core/ssh.py", "dsv4kit/validation/harness.py", "dsv4kit/kernels/__init__.py"):
        assert module in names
    assert not any("__pycache__" in n for n in names)


def test_validate_ships_the_wheel_runs_the_harness_and_keeps_the_report(box, wheel, monkeypatch):
    inventory, results, scratch = box
    monkeypatch.setenv("DSV4KIT_TEST_SECRET_TOKEN", SECRET)
    code, out, err = validate("--gpu", "3", "-i", str(inventory), "--interpret", "--cases", CASE,
                              "--wheel", str(wheel), "--results-dir", str(results),
                              "--output", str(results.parent / "copy.json"))
    assert code == exitcodes.OK, out + err
    # Progress streamed from the box, then the table, then where the report is.
    assert "[lo] == indexer: 1 case(s) on cpu (Triton interpreter)" in out
    table = out[out.index("validation table: lo GPU 3"):]
    assert re.search(r"indexer\s+kernel\s+B=1 H=16 pages=2 seqlen<=100 .*PASS", table)
    assert "VERDICT: PASS" in table
    assert "--interpret: kernels run on the box's CPU" in err and "installed dsv4kit-" in err and "(pip install --target; the venv is not modified)" in err
    kept = list(results.iterdir())
    assert len(kept) == 1 and re.fullmatch(r"lo-gpu3-\d{8}T\d{6}Z\.json", kept[0].name), kept
    assert f"report: {kept[0]}" in out
    report = json.loads(kept[0].read_text())
    assert report == json.loads((results.parent / "copy.json").read_text())
    assert report["passed"] and report["environment"]["interpret"] is True
    remote = report["remote"]
    assert remote["gpu"] == 3 and remote["host"] == "lo" and remote["interpret"] is True
    assert remote["wheel"]["sha256"] == wheelbuild.sha256_of(wheel)
    assert remote["host_key_fingerprint"].startswith("SHA256:")
    assert remote["sglang_on_box"] is None  # so the harness reports its SGLang rows as skipped
    assert any(r["impl"].startswith("sglang-") and r["status"] == "skipped"
               for r in report["suites"]["indexer"]["rows"])
    # No secrets, no leftovers on the box, the venv untouched.
    assert SECRET not in out + err + kept[0].read_text()
    assert not any(scratch.iterdir())
    venv = inventory.parent / "venv"
    assert sorted(str(p.relative_to(venv)) for p in venv.rglob("*")) == BOX_VENV_LAYOUT


def test_installed_uses_the_rolled_out_dsv4kit(box):
    inventory, results, scratch = box
    code, out, err = validate("--gpu", "0", "-i", str(inventory), "--interpret", "--cases", CASE,
                              "--installed", "--results-dir", str(results))
    assert code == exitcodes.OK, out + err
    assert "building" not in err and "installed dsv4kit" not in err
    report = json.loads(next(results.iterdir()).read_text())
    assert report["remote"]["installed"] is True and report["remote"]["wheel"] is None
    assert not any(scratch.iterdir())


# --------------------------------------------------------------------------- bad input: exit 2
def test_bad_cases_fail_before_any_connection(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=1)  # would be exit 3
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--cases", "indexer:3x3", "--installed")
    assert code == exitcodes.USAGE and "--cases" in err and "BxPxN" in err


def test_infinite_timeout_fails_before_any_connection(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=1)  # would be exit 3
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--timeout", "inf", "--installed")
    assert code == exitcodes.USAGE and "--timeout must be a finite number" in err


def test_inventory_errors_are_usage_errors(tmp_path, loopback_ssh):
    code, _, err = validate("--gpu", "0", "-i", str(tmp_path / "nope.yml"))
    assert code == exitcodes.USAGE and "not found" in err
    inventory = write_inventory(tmp_path / "inv", loopback_ssh)
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--host", "box9")
    assert code == exitcodes.USAGE and "no host named 'box9'" in err
    inventory = write_inventory(tmp_path / "inv2", loopback_ssh, ansible_ssh_private_key_file=str(tmp_path / "k"))
    code, _, err = validate("--gpu", "0", "-i", str(inventory))
    assert code == exitcodes.USAGE and "does not exist" in err


def test_bad_wheel_argument(box, tmp_path):
    inventory, results, _ = box
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--wheel", str(tmp_path / "x.whl"))
    assert code == exitcodes.USAGE and "no such file" in err


# --------------------------------------------------------------------------- connection: exit 3
def test_unreachable_host(tmp_path, loopback_ssh):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=closed_port())
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed")
    assert code == exitcodes.UNREACHABLE
    assert re.search(r"error: .*@127\.0\.0\.1:\d+ \(lo\): cannot connect: .*refused", err), err


def test_bad_credentials(tmp_path, loopback_ssh):
    wrong = keygen(tmp_path / "wrong")
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_ssh_private_key_file=str(wrong))
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed")
    assert code == exitcodes.UNREACHABLE and f"authentication failed with key file {wrong}" in err
    assert "PRIVATE KEY" not in err


def test_changed_host_key_is_refused(tmp_path, loopback_ssh):
    pub = keygen(tmp_path / "impostor").with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{loopback_ssh.port} {pub[0]} {pub[1]}\n")
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_known_hosts=str(known))
    for extra in ([], ["--trust-new-host-key"]):
        code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed", *extra)
        assert code == exitcodes.UNREACHABLE and "HOST KEY CHANGED" in err and "Refusing" in err
    assert known.read_text().split()[2] == pub[1]


def test_unknown_host_key_needs_the_explicit_flag(tmp_path, loopback_ssh):
    known = tmp_path / "known_hosts"
    # The venv is missing, so a connection that gets through ends at the preflight (exit 5).
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_known_hosts=str(known),
                                dsv4_venv_dir=str(tmp_path / "no-venv"))
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed")
    assert code == exitcodes.UNREACHABLE and "is not in" in err and "--trust-new-host-key" in err
    assert not known.exists()
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed", "--trust-new-host-key")
    assert code == exitcodes.ENVIRONMENT
    fingerprint = re.search(r"trusted new host key for \[127\.0\.0\.1\]:\d+: ssh-ed25519 (SHA256:\S+)", err)
    assert fingerprint, err
    assert known.read_text().startswith(f"[127.0.0.1]:{loopback_ssh.port} ssh-ed25519 ")
    # Recorded: the next run needs no flag and gets as far as the box.
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed")
    assert code == exitcodes.ENVIRONMENT and "trusted new host key" not in err


# --------------------------------------------------------------------------- the box: exit 5
def test_no_venv_on_the_box(tmp_path, loopback_ssh):
    missing = tmp_path / "opt" / "venv"
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_venv_dir=str(missing))
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed", "--interpret")
    assert code == exitcodes.ENVIRONMENT and f"no venv on lo: dsv4_venv_dir {missing} does not exist" in err


def test_no_python_in_the_venv(tmp_path, loopback_ssh):
    venv = tmp_path / "empty-venv"
    (venv / "bin").mkdir(parents=True)
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_venv_dir=str(venv))
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed", "--interpret")
    assert code == exitcodes.ENVIRONMENT and f"no usable python on lo: {venv}/bin/python does not exist" in err


def test_gpu_absent_without_interpret(box, wheel):
    inventory, results, scratch = box
    code, out, err = validate("--gpu", "7", "-i", str(inventory), "--cases", CASE, "--wheel", str(wheel),
                              "--results-dir", str(results))
    assert code == exitcodes.ENVIRONMENT
    assert "GPU 7 absent on lo: no NVIDIA GPU found" in err and "--interpret" in err
    assert "sees 0 CUDA devices" in err or "nvidia-smi" in err
    assert "running the harness" not in err
    no_leftovers(results, scratch)


NVIDIA_SMI_L = """\
GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-0f1e2d3c-aaaa-bbbb-cccc-000000000000)
GPU 1: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-0f1e2d3c-aaaa-bbbb-cccc-000000000001)
GPU 2: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-0f1e2d3c-aaaa-bbbb-cccc-000000000002)
GPU 3: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-0f1e2d3c-aaaa-bbbb-cccc-000000000003)
"""


def test_gpu_query_parsing_and_the_absent_gpu_message():
    output = "venv=ok\n" + "".join(f"nvidia_smi={l}\n" for l in NVIDIA_SMI_L.splitlines()) + (
        'nvidia_smi_rc=0\nprobe={"python": "3.12.3", "torch": "2.14.1", "cuda_count": 4, '
        '"cuda_names": [], "triton": "/x", "sglang": null, "dsv4kit": null}\n')
    facts = remote_validate.parse_preflight(output)
    assert facts.gpus[3] == (3, "NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert facts.gpu_source == "nvidia-smi -L" and facts.python_version == "3.12.3"
    assert remote_validate.check_gpu(3, facts, False, "box1") is None
    message = remote_validate.check_gpu(7, facts, False, "box1")
    assert message.startswith("GPU 7 absent on box1: it has 4 GPU(s) (0: NVIDIA RTX PRO 6000")
    assert "3: NVIDIA RTX PRO 6000 Blackwell Server Edition; from nvidia-smi -L)" in message
    assert remote_validate.check_gpu(7, facts, True, "box1") is None  # --interpret: CPU, explicitly
    # nvidia-smi broken (driver not loaded): the message says so; torch is asked instead.
    broken = remote_validate.parse_preflight(
        "venv=ok\nnvidia_smi_rc=9\nnvidia_smi_error=NVIDIA-SMI has failed because it couldn't "
        "communicate with the NVIDIA driver.\nprobe={\"python\": \"3.12.3\", \"cuda_count\": 0, "
        "\"cuda_names\": [], \"torch\": \"2.14.1\"}\n")
    message = remote_validate.check_gpu(0, broken, False, "box1")
    assert "no NVIDIA GPU found" in message and "couldn't communicate with the NVIDIA driver" in message
    # nvidia-smi lists the GPU but torch cannot use it.
    facts.torch_cuda_count = 0
    assert "torch in the venv sees only 0" in remote_validate.check_gpu(3, facts, False, "box1")


def test_report_name_is_host_gpu_utc():
    from datetime import datetime, timezone

    when = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
    assert remote_validate.report_filename("box1", 7, when) == "box1-gpu7-20260304T050607Z.json"
    assert remote_validate.report_filename("a/b c", 0, when) == "a_b_c-gpu0-20260304T050607Z.json"


# --------------------------------------------------------------------------- timeout: exit 4
def test_remote_timeout_kills_the_process_group(box):
    inventory, results, scratch = box
    sleep = f"9{int(time.time() * 1000) % 100000}.5"  # a sleep length nothing else uses
    lines: list[str] = []
    started = time.monotonic()
    code = remote_validate.run(
        gpu=0, inventory=inventory, timeout=3, cases=CASE, interpret=True, installed=True,
        results_dir=results, _test_remote_sleep_s=float(sleep),
        output=remote_validate.Output(out=lines.append, err=lines.append))
    assert code == exitcodes.TIMEOUT, lines
    assert time.monotonic() - started < 40
    assert any("timed out after 3s" in l and "process group" in l for l in lines), lines
    left = subprocess.run(["pgrep", "-f", f"^sleep {sleep}$"], capture_output=True, text=True).stdout
    assert left == "", f"remote processes survived: {left}"
    no_leftovers(results, scratch)


# --------------------------------------------------------------------------- Ctrl-C: exit 130
def test_interrupt_kills_the_remote_run_and_keeps_nothing(box):
    import os
    import signal
    import sys

    inventory, results, scratch = box
    sleep = f"8{int(time.time() * 1000) % 100000}.5"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dsv4kit.validate import remote as remote_validate\n"
        f"sys.exit(remote_validate.run(gpu=0, inventory=Path({str(inventory)!r}), timeout=300, "
        f"cases={CASE!r}, interpret=True, installed=True, results_dir=Path({str(results)!r}), "
        f"_test_remote_sleep_s={float(sleep)}))\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        seen = []
        while time.monotonic() < deadline:  # wait until the box is running our command
            line = proc.stderr.readline()
            seen.append(line)
            if "running the harness" in line or not line:
                break
        assert "running the harness" in seen[-1], "".join(seen)
        for _ in range(50):
            if subprocess.run(["pgrep", "-f", f"^sleep {sleep}$"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == exitcodes.INTERRUPTED, err
    assert "interrupted" in err
    left = subprocess.run(["pgrep", "-f", f"^sleep {sleep}$"], capture_output=True, text=True).stdout
    assert left == "", f"remote processes survived Ctrl-C: {left}"
    no_leftovers(results, scratch)


def test_unwritable_state_dir_is_named(tmp_path, loopback_ssh):
    import os

    if os.geteuid() == 0:
        state = "/proc/dsv4kit-state"  # not creatable, even for root
    else:
        state = str(tmp_path / "ro")
        os.mkdir(state, 0o500)
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_state_dir=state)
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed", "--interpret", "--cases", CASE)
    assert code == exitcodes.ENVIRONMENT
    assert f"cannot create the scratch directory {state}/scratch/validate-" in err
    assert f"needs write access to {state}/scratch" in err


def test_broken_python_in_the_venv(tmp_path, loopback_ssh):
    venv = tmp_path / "broken-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 'error while loading shared libraries: libpython3.12.so' >&2\nexit 127\n")
    (venv / "bin" / "python").chmod(0o755)
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_venv_dir=str(venv))
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--installed", "--interpret")
    assert code == exitcodes.ENVIRONMENT
    assert f"no usable python on lo: {venv}/bin/python broken" in err and "libpython3.12.so" in err


# --------------------------------------------------------------------------- a failing case: exit 1
BREAK_KERNEL_ROWS = '''

# --- appended by tests/validate/test_remote_validate.py: every kernel row fails ---
_tested_run = run


def run(specs, options):
    for row in _tested_run(specs, options):
        if row.impl == "kernel":
            row.passed = False
            row.note = "forced failure (test wheel)"
        yield row
'''


def test_a_failed_case_exits_1_and_keeps_the_report(box, wheel, tmp_path):
    """A wheel whose indexer suite fails its kernel rows: the table says FAIL, exit 1, report kept."""
    broken = tmp_path / wheel.name
    suite = "dsv4kit/validation/indexer_suite.py"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(broken, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == suite:
                data += BREAK_KERNEL_ROWS.encode()
            dst.writestr(item, data)
    inventory, results, scratch = box
    code, out, err = validate("--gpu", "1", "-i", str(inventory), "--interpret", "--cases", CASE,
                              "--wheel", str(broken), "--results-dir", str(results))
    assert code == exitcodes.CHECK_FAILED, out + err
    table = out[out.index("validation table: lo GPU 1"):]
    assert re.search(r"indexer\s+kernel\s+.*FAIL\s+forced failure", table) and "VERDICT: FAIL" in table
    report = json.loads(next(results.iterdir()).read_text())
    assert report["passed"] is False and report["remote"]["wheel"]["sha256"] == wheelbuild.sha256_of(broken)
    assert not any(scratch.iterdir())


def test_a_venv_without_pip_gets_the_wheel_unpacked(tmp_path, loopback_ssh, wheel):
    """A uv-style venv (no pip) where only the shipped wheel can provide dsv4kit."""
    from tests.remote_inventory import venv_without_pip

    venv = venv_without_pip(tmp_path / "uv-venv")
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_venv_dir=str(venv))
    results = tmp_path / "results"
    code, out, err = validate("--gpu", "0", "-i", str(inventory), "--interpret", "--cases", CASE,
                              "--wheel", str(wheel), "--results-dir", str(results))
    assert code == exitcodes.OK, out + err
    assert "(unpacked: the venv has no pip; the venv is not modified)" in err
    report = json.loads(next(results.iterdir()).read_text())
    assert report["remote"]["install_method"] == "unzip" and report["passed"]
    # --installed on the same venv: there is no dsv4kit to use, and the run says so.
    code, _, err = validate("--gpu", "0", "-i", str(inventory), "--interpret", "--cases", CASE, "--installed")
    assert code == exitcodes.ENVIRONMENT and "--installed: dsv4kit is not installed in" in err
