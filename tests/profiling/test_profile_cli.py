"""``dsv4kit profile`` end to end over the loopback box: the REAL bench client (SGLang 0.5.23's
``sglang.benchmark.serving``) drives the stand-in server, whose ``/start_profile`` writes REAL
torch-profiler traces (tests/fake_profiler.py); the traces come back over SFTP and are parsed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
# 2 requests of 16 + 1000 tokens at 10 ms a token: about 10 s of steady decode, far more than the
# profile needs even on a loaded machine (the load is stopped once the traces are written).
LOAD = ["-c", "2", "--input-len", "16", "--output-len", "1000", "--num-steps", "3", "--steady-timeout", "120",
        "--timeout", "120"]


def dsv4kit(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


def profiler_state(server) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/_test/profiler", timeout=10) as resp:
        return json.loads(resp.read())


def settled(server, timeout: float = 20.0) -> dict:
    """The stand-in's profiler state once it is not profiling (or the last seen after ``timeout``)."""
    deadline = time.monotonic() + timeout
    state = profiler_state(server)
    while state["profiling"] and time.monotonic() < deadline:
        time.sleep(0.2)
        state = profiler_state(server)
    return state


def leftovers(inventory: Path) -> list[str]:
    """Scratch directories and bench clients the profile left on the box."""
    scratch = inventory.parent / "state" / "scratch"
    found = [p.name for p in scratch.glob("bench-*")]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "sglang.benchmark.serving" in text and str(scratch) in text:
            found.append(text)
    return found


def test_profile_breaks_the_decode_time_down_and_gates_a_class_share(bench_box, tmp_path):
    server, inventory = bench_box(context_length=4096)
    png = tmp_path / "breakdown.png"
    proc = dsv4kit("profile", "--ctx", "4096", *LOAD, "-i", str(inventory), "--json", "-o", str(png),
                   "--max-class-share", "dense_gemm=1%")
    # The stand-in's matmuls (its torch indexer fallback's bmm among them) are far above 1% of the
    # step: the gate fails (exit 1).
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "gate failed: dense GEMM is" in proc.stderr and "above the limit 1%" in proc.stderr
    out = json.loads(proc.stdout)
    (profile,) = out["profiles"]
    assert profile["ranks"] == 4 and profile["context_length"] == 4096 and profile["concurrency"] == 2
    assert profile["mode"] == "cpu" and profile["decode_steps"] == 3
    assert all(r["decode_steps"] == 3 and r["batch_size"] == 2 for r in profile["per_rank"])
    classes = profile["classes"]
    # Profiled without stacks and shapes (as the box's server is asked): the torch fallback's
    # generic kernels cannot be scoped to it, and the profile says so.
    asked = profiler_state(server)["last_request"]
    assert asked["with_stack"] is False and asked["record_shapes"] is False
    assert classes["indexer"]["us_per_step"] == 0 and profile["indexer_by_name"] is False
    assert "torch indexer fallback" in profile["indexer_note"]
    assert classes["dense_gemm"]["us_per_step"] > 0 and classes["elementwise"]["us_per_step"] > 0
    assert classes["topk"]["us_per_step"] > 0 and classes["memcpy"]["us_per_step"] > 0
    assert abs(sum(c["share"] for c in classes.values()) - 1.0) < 1e-3
    assert any(u["name"] == "aten::fft_rfft" for u in profile["unknown"])  # unknown names are listed
    assert profile["step_time_ms"] > 0 and profile["metrics_tok_s"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = settled(server)
    assert state["starts"] == 1 and not state["profiling"]
    assert leftovers(inventory) == []


def test_bad_num_steps_is_refused_before_connecting(tmp_path, loopback_ssh):
    from tests.remote_inventory import write_inventory

    inventory = write_inventory(tmp_path, loopback_ssh, dsv4_model_path="/nonexistent")
    for steps, words in (("0", "--num-steps must be between 1 and 256"), ("1000", "got 1000")):
        proc = dsv4kit("profile", "--ctx", "4096", "--num-steps", steps, "-i", str(inventory))
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    proc = dsv4kit("profile", "--ctx", "4096", "--num-steps", "abc", "-i", str(inventory))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = dsv4kit("profile", "--ctx", "4096", "--max-class-share", "indexr=2%", "-i", str(inventory))
    assert proc.returncode == 2 and "give CLASS=PERCENT%" in proc.stderr


def test_a_server_without_the_profiler_is_a_clear_error(bench_box):
    server, inventory = bench_box(context_length=4096, no_profiler=True)
    proc = dsv4kit("profile", "--ctx", "4096", *LOAD, "-i", str(inventory))
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert "has no /start_profile (HTTP 404)" in proc.stderr and "Traceback" not in proc.stderr
    assert leftovers(inventory) == []


def test_a_trace_too_large_is_refused_and_removed(bench_box, tmp_path):
    server, inventory = bench_box(context_length=4096)
    proc = dsv4kit("profile", "--ctx", "4096", *LOAD, "--max-trace-mb", "0.002", "-i", str(inventory))
    assert proc.returncode == 6, proc.stderr[-3000:]
    assert "above the limit of 0.002 MB (--max-trace-mb)" in proc.stderr
    state = settled(server)
    assert not state["profiling"]
    assert leftovers(inventory) == []


def test_ctrl_c_mid_profile_stops_the_server_profiling(bench_box):
    server, inventory = bench_box(context_length=4096)
    proc = subprocess.Popen([sys.executable, "-m", "dsv4kit.cli", "profile", "--ctx", "4096", "-c", "2",
                             "--input-len", "16", "--output-len", "900", "--num-steps", "200", "-i", str(inventory)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    deadline = time.monotonic() + 120
    while not profiler_state(server)["profiling"]:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted during the profile at context 4096" in err and "Traceback" not in err
    state = settled(server)
    assert not state["profiling"] and state["stops"] == 1
    assert leftovers(inventory) == []


def test_compare_ctx_reports_the_context_tax_and_flags_the_class_that_grows(bench_box):
    """8192 against 512 with the same request lengths: the stand-in's torch indexer scores the
    whole configured context every step, so it grows (16x in work) and is flagged; throughput is
    retained. The wide ratio and six steps keep the flag above a loaded machine's scheduling noise:
    at 4096 against 512 one preempted step of three once inflated the small side past the large."""
    from dsv4kit.profile import breakdown, run

    server, inventory = bench_box(context_length=8192)
    restarts = []

    def restart(inventory_path, host, context_length, progress, timeout):
        restarts.append(context_length)
        server.post("/_test/config", {"context_length": context_length})

    request = run.ProfileRequest(ctx=8192, compare_ctx=512, concurrency=2, num_steps=6, input_len=16,
                                 output_len=450, inventory=inventory, steady_timeout=120, timeout=120)
    lines: list[str] = []
    outcome = run.execute(run.plan(request), lines.append, restart=restart)
    assert restarts == [512]
    tax = outcome["context_tax"]
    assert tax["large_ctx"] == 8192 and tax["small_ctx"] == 512 and tax["same_actual_lengths"]
    # No stacks: the fallback's bmm is dense GEMM, and the flag says whose kernels those are.
    assert "dense_gemm" in tax["grows_with_configured_context"], json.dumps(tax, default=str)[:3000]
    assert "dense_gemm" in tax["indexer_in"] and tax["growth"]["dense_gemm"]["ratio"] > 1.5
    assert 0.5 < tax["retention"] < 1.5
    text = breakdown.format_comparison(tax)
    assert "FLAG: dense GEMM grows with the configured context" in text and "throughput retention" in text
    assert "the torch indexer fallback's kernels are counted here" in text


def test_a_box_without_sglangs_client_is_exit_5_named(bench_box, tmp_path, loopback_ssh, tokenizer_dir):
    """The venv python runs but has no SGLang (a half-provisioned box): exit 5 naming the client."""
    from tests.bench_support import bench_inventory

    venv = tmp_path / "bare-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)  # this test venv: no sglang in it
    server, _ = bench_box(context_length=4096)
    inventory = bench_inventory(tmp_path / "inv-bare", loopback_ssh, venv=venv, model_path=tokenizer_dir,
                                port=server.port, context_length=4096)
    proc = dsv4kit("profile", "--ctx", "4096", *LOAD, "-i", str(inventory))
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert "sglang.benchmark.serving) is not installed in" in proc.stderr and "Traceback" not in proc.stderr
    assert "ModuleNotFoundError" not in proc.stderr
