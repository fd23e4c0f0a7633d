"""End to end with the REAL 0.5.23 client against the stand-in: /metrics in 0.5.23's real shapes,
a second client loading the server, a SIGKILLed bench, a spill that cannot be written. Each test reuses one stand-in for several checks (real client runs are slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.bench.test_bench_sweep import SMALL, clients_running, dsv4kit
from tests.bench_support import ForeignLoad, cli_running, in_process_sweep

pytestmark = pytest.mark.slow


def test_metrics_in_0523_shapes_are_read_by_label_and_provenance_is_recorded(bench_box, tokenizer_dir):
    # One stand-in, three repetitions of C=8, reshaped before each: (1) honest, with priority
    # series and one copy per TP rank; (2) priority scheduling, decoding 4 of 8 (summing every
    # series said 8); (3) all schedulers on TP4, decoding 2 of 8 (summing the ranks said 8).
    marker = tokenizer_dir / ".dsv4kit-weights.json"
    # the manifest names the inventory's revision (dsv4_model_revision): another would fail served_model
    marker.write_text(json.dumps({"repo": "deepseek-ai/DeepSeek-V4-Flash", "revision": "test-rev-1", "verified_at": 1,
                                  "files": {"model.safetensors": {"size": 10, "sha256": "b" * 64, "mtime_ns": 5}}}))
    server, inventory = bench_box(context_length=4096, enable_priority_scheduling=True,
                            enable_metrics_for_all_schedulers=True)
    shapes = {1: {"priority_scheduling": True, "all_schedulers": True, "tp_size": 4, "decode_cap": 0},
              2: {"priority_scheduling": True, "all_schedulers": False, "decode_cap": 4},
              3: {"priority_scheduling": False, "all_schedulers": True, "tp_size": 4, "decode_cap": 2}}

    def reshape(line):
        for rep, shape in shapes.items():
            if f"C=8 rep {rep}/3:" in line and "prompts" in line:
                server.post("/_test/config", shape)

    try:
        record, lines = in_process_sweep(inventory, reshape, concurrency=[8], repeat=3, num_prompts=16,
                                         warmup_requests=2)
    finally:
        marker.unlink()
    honest, priority, ranks = record["points"]
    assert honest["validity"]["passed"], (honest["validity"]["failed"], honest["window"])
    assert honest["window"]["running"]["max"] <= 8
    for point, cap in ((priority, 4), (ranks, 2)):
        assert "exact_occupancy" in point["validity"]["failed"], point["validity"]
        assert point["window"]["running"]["max"] <= cap, point["window"]["running"]
    # the box's parse agreed with prometheus_client's on the real texts
    assert not any(p["window"].get("parse_problem") for p in record["points"])

    sw, model, key = record["software"], record["model"], record["comparability_key"]
    assert "sgl_kernel" in sw and "flashinfer" in sw and sw["dsv4kit_wheel"]["reason"].startswith("dsv4kit")
    assert sw["sglang_wheel"]["sha256"] or sw["sglang_wheel"].get("record_sha256")
    assert model["weights_fingerprint"] and model["weights"]["revision"] == "test-rev-1"
    assert key["weights"] == model["weights_fingerprint"] and key["sglang_wheel"] and key["gates"]
    assert key["warmup_requests"] == {"8": 2} and key["launch_args"] and "driver" in key
    assert record["sweep"]["gates"]["min_exact_share"] == 0.98


def test_the_bench_owns_the_server_while_it_measures(bench_box):
    # rep 1: a second client is busy before the point: the point waits, then fails naming it.
    # rep 2 (after a --restarts restart): the second client starts right after the bench's flush,
    # through the 1 s pause and the measured run: the running batch goes above C and the point fails.
    server, inventory = bench_box(context_length=4096)
    before = ForeignLoad(server, 4, tokens=4000).start()  # 40 s: busy until stopped
    during = []
    restarts = []

    def restart_units(progress, timeout):
        restarts.append(1)
        server.post("/_test/config", {"restart": True})

    def on_line(line):
        if "C=4 rep 2/2:" in line and "prompts" in line:
            before.stop()
            deadline = time.monotonic() + 30
            while server.post("/_test/stats") and _busy(server) and time.monotonic() < deadline:
                time.sleep(0.1)
            during.append(ForeignLoad(server, 4, tokens=250, after_flushes=server.stats()["flush_count"]).start())

    from dsv4kit.bench.gates import GateConfig

    record, lines = in_process_sweep(inventory, on_line, concurrency=[4], repeat=2, num_prompts=8,
                                     warmup_requests=1, restarts=1, restart_units=restart_units,
                                     gates=GateConfig(idle_timeout_s=2.0))
    busy, loaded = record["points"]
    assert busy["not_run"] and busy["validity"]["failed"] == ["idle"]
    assert "not idle" in busy["validity"]["gates"]["idle"]["detail"] and "running" in busy["validity"]["gates"]["idle"]["detail"]
    assert "exact_occupancy" in loaded["validity"]["failed"], loaded["validity"]
    detail = loaded["validity"]["gates"]["exact_occupancy"]["detail"]
    assert "foreign load" in detail and loaded["window"]["running"]["max"] > 4
    # the restart between the repetitions, and each start's own record
    assert restarts == [1] and [s["before_repetition"] for s in record["starts"]] == [0, 1]
    assert [p["server_start"] for p in record["points"]] == [0, 1]
    assert loaded["validity"]["gates"]["same_server"]["passed"]
    assert record["summary"]["per_concurrency"]["4"]["valid_repetitions"] == 0
    during[0].join()


def _busy(server) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return any(line.startswith("sglang:num_running_reqs") and not line.endswith(" 0.0") for line in text.splitlines())


def test_a_sigkilled_bench_leaves_nothing_running_on_the_box(bench_box, tmp_path):
    server, inventory = bench_box(context_length=4096, token_delay_ms=200)
    with cli_running("bench", "--ctx", "4096", "--concurrency", "2", "--repeat", "1", *SMALL, "-i", str(inventory),
                     "--results-repo", str(tmp_path / "r"), stdout=subprocess.DEVNULL) as proc:
        for line in proc.stderr:
            if "[1/1] C=2" in line and "prompts" in line:
                break
        deadline = time.monotonic() + 120
        while not server.stats()["generate_count"] and time.monotonic() < deadline:
            time.sleep(0.2)  # the client is on the box and sending
        assert server.stats()["generate_count"], "the client never reached the server"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert clients_running(inventory) == []  # the session watchdog ended the client's group
    sent = server.stats()["generate_count"]
    time.sleep(2)
    assert server.stats()["generate_count"] == sent  # and nobody sends any more


def test_a_spill_that_cannot_be_written_stops_the_sweep_and_records_publish_recovers_it(bench_box, tmp_path):
    # After the first point the spill's details folder turns into a file (as a full disk refuses a
    # write) and the results path too: the sweep stops at once with exit 5, the first point stays
    # on disk, nothing half-made is left; `records publish` publishes it once the disk is back.
    server, inventory = bench_box(context_length=4096)
    repo = tmp_path / "results"
    seen = []
    with cli_running("bench", "--ctx", "4096", "--concurrency", "1,2,4", "--repeat", "1", *SMALL, "-i", str(inventory),
                     "--results-repo", str(repo)) as proc:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("[1/3] C=1") and "tok/s" in line:
                (spill,) = list((tmp_path / "spill").iterdir())
                (spill / "details").rename(tmp_path / "details.kept")
                (spill / "details").write_text("no room")
                repo.write_text("no room")
                break
        _, rest = proc.communicate(timeout=200)
    stderr = "".join(seen) + rest
    assert proc.returncode == 5, stderr
    assert "cannot spill" in stderr and "[3/3]" not in stderr and "records publish" in stderr
    assert not list(spill.rglob("*.tmp")) and (spill / "record.partial.json").is_file()
    # the disk is back
    (spill / "details").unlink()
    (tmp_path / "details.kept").rename(spill / "details")
    repo.unlink()
    published = dsv4kit("records", "publish", str(spill), "--results-repo", str(repo), "--json")
    assert published.returncode == 0, published.stderr
    out = json.loads(published.stdout)
    record = json.loads((repo / "records" / out["run_id"] / "record.json").read_text())
    assert record["incomplete"] and [p["max_concurrency"] for p in record["points"]] == [1]
    assert not spill.exists()
