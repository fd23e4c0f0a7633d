"""``dsv4kit bench`` against a stand-in server that behaves as real servers do, with the REAL client.

Each fault of a real server gets a sweep here: the record must mark the point invalid, or report
the number the server really delivered. The stand-in (tests/fake_sglang_server.py) decodes with
a cap below C, serialises prefill, slows its decode step as the batch grows, or leaves fields
out; its ``/metrics`` tells the truth about its batch, and ``/_test/stats`` gives the wall-clock
time of every token it emitted, which is what the headline is checked against.
"""

from __future__ import annotations

import json

import pytest

from tests.bench.test_bench_sweep import dsv4kit

pytestmark = pytest.mark.slow

# 16 prompts of 16 + 64 tokens at C=8: two waves of 0.64 s or more; /metrics every 20 ms.
POINT = ["--ctx", "4096", "--concurrency", "8", "--repeat", "1", "--input-len", "16", "--output-len", "64",
         "--num-prompts", "16", "--warmup-requests", "2", "--metrics-interval", "0.02"]


def sweep(server_inventory, tmp_path, *extra):
    server, inventory = server_inventory
    repo = tmp_path / "results"
    proc = dsv4kit("bench", *POINT, *extra, "-i", str(inventory), "--results-repo", str(repo), "--json")
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    record = json.loads((repo / out["record_path"]).read_text())
    return proc, record


def delivered(server, point) -> float:
    """Output tokens per second the stand-in emitted in the point's steady-state window."""
    window = point["window"]
    anchor = window["run_start_box_clock"]
    lo, hi = anchor + window["start_s"], anchor + window["end_s"]
    times = server.stats()["token_times"]
    return sum(1 for t in times if lo < t <= hi) / (hi - lo)


def delivered_in_occupancy(server, point) -> float:
    """Output tokens per second the stand-in emitted in the point's exact-occupancy window."""
    lo, hi = point["window"]["occupancy"]["window_wall"]
    times = server.stats()["token_times"]
    return sum(1 for t in times if lo < t <= hi) / (hi - lo)


def test_an_honest_server_is_valid_and_the_headline_is_what_it_delivered(bench_box, tmp_path):
    server, inventory = bench_box(context_length=4096,
                            inventory_extra={"dsv4_bench_slo_ttft_ms": 5000, "dsv4_bench_slo_tpot_ms": 1.0})
    proc, record = sweep((server, inventory), tmp_path)
    point = record["points"][0]
    assert proc.returncode == 0 and point["validity"]["passed"], point["validity"]
    assert point["window"]["occupancy"]["admissible"] and point["window"]["running"]["max"] == 8
    # the gauge cadence the server reported in /server_info (decode_log_interval 8), not the default 40
    assert point["window"]["occupancy"]["rule"]["gauge_refresh_passes"] == 8
    assert point["derived"]["decode_tok_s"] == pytest.approx(delivered_in_occupancy(server, point), rel=0.10)
    # the SLOs come from the inventory and are recorded; no request makes a 1 ms TPOT; no p99 from 16 requests
    assert record["sweep"]["slo"]["ttft_ms"] == 5000 and record["sweep"]["slo"]["tpot_ms"] == 1.0
    goodput = point["latency"]["goodput"]
    assert goodput["good_requests"] == 0 and goodput["goodput_req_s"] == 0.0
    assert goodput["p99_within_limits"] is None and point["derived"]["p99_ttft_ms"] is None
    assert point["latency"]["ttft_ms"]["p50"]["ci95"] and "299" in point["latency"]["tpot_ms"]["p99"]["reason"]
    # the box's DCGM exporter observed the GPUs (no nvidia-smi on this box's PATH, and the record says so)
    assert point["validity"]["gates"]["gpu_throttle"]["sources"] == ["dcgm-exporter"]
    assert "nvidia-smi" in point["gpu_telemetry"]["unanswered"]


def test_a_decode_cap_below_c_makes_the_point_invalid_and_the_headline_true(bench_box, tmp_path):
    # The server says max_running_requests 256 but decodes 2 at a time (KV capacity does this);
    # the rest queue. Every request still sees ~10 ms per token, so C x 1000 / TPOT is ~4x too high,
    # and the client's achieved concurrency (sum of latencies / duration) counts the queued ones.
    server, inventory = bench_box(context_length=4096, decode_cap=2)
    proc, record = sweep((server, inventory), tmp_path)
    point = record["points"][0]
    assert proc.returncode == 1
    assert "exact_occupancy" in point["validity"]["failed"], point["validity"]
    assert point["validity"]["gates"]["concurrency"]["passed"]  # the client-side check is fooled
    assert point["window"]["running"]["max"] <= 2
    # never 8 decoding at once: no decode headline; what the window delivered is the stand-in's count
    assert point["derived"]["decode_tok_s"] is None and "never had all 8" in point["window"]["decode_evidence"]
    assert point["window"]["window_tok_s"] == pytest.approx(delivered(server, point), rel=0.10)
    assert point["derived"]["tpot_formula_tok_s"] > 3 * point["window"]["window_tok_s"]
    assert record["summary"]["per_concurrency"]["8"]["decode_tok_s"]["n"] == 0


def test_serialised_prefill_makes_the_point_invalid(bench_box, tmp_path):
    # One prompt at a time, 100 ms each: about 3 of 8 requests decode at once.
    server, inventory = bench_box(context_length=4096, prefill_ms=100, serial_prefill=True)
    proc, record = sweep((server, inventory), tmp_path, "--output-len", "32")  # a decode shorter than the ramp
    point = record["points"][0]
    assert proc.returncode == 1 and "exact_occupancy" in point["validity"]["failed"], point["validity"]
    # the gate says why and what would fill the batch (the prefill ramp outlasts a decode)
    assert "--output-len of about" in point["validity"]["gates"]["exact_occupancy"]["detail"], point["validity"]
    assert point["window"]["window_tok_s"] == pytest.approx(delivered(server, point), rel=0.10)
    assert point["derived"]["tpot_formula_tok_s"] > 1.5 * point["window"]["window_tok_s"]


def test_omitted_fields_and_a_small_kv_pool_fail_their_gates(bench_box, tmp_path):
    # The server reuses 12 of 16 prompt tokens but does not say so (the client writes 0), leaves
    # out prompt_tokens (the client keeps the planned length) and startup_time, and its KV pool
    # holds fewer than C x (ISL + OSL) tokens.
    server, inventory = bench_box(context_length=4096, cached_tokens=12, omit="cached_tokens,prompt_tokens,startup_time",
                            max_total_num_tokens=300)
    proc, record = sweep((server, inventory), tmp_path)
    point = record["points"][0]
    assert proc.returncode == 1
    gates = point["validity"]["gates"]
    assert not gates["cold_cache"]["passed"] and "cached_tokens" in gates["cold_cache"]["detail"]
    assert point["validity"]["cache_hit_pct"] == 0.0  # what the client alone would have believed
    assert not gates["input_lens"]["passed"] and "prompt_tokens" in gates["input_lens"]["detail"]
    assert not gates["same_server"]["passed"] and "startup_time" in gates["same_server"]["detail"]
    assert not gates["kv_capacity"]["passed"] and "640" in gates["kv_capacity"]["detail"]


def test_ab_interleaves_the_arms_with_a_restart_before_each_and_records_both_with_a_verdict(bench_box, tmp_path):
    # A flag whose arm B slows every decode step from 10 to 20 ms: B must come out regressed in
    # throughput and TPOT, from one record holding both arms.
    from dsv4kit.bench.sweep import SweepConfig, parse_ab, run_sweep
    from dsv4kit.core.inventory import load_inventory
    from dsv4kit.core.ssh import open_session

    server, inventory = bench_box(context_length=4096)
    host = load_inventory(inventory).host()
    ab = parse_ab("SGLANG_SM120_TRITON_INDEXER=0,1")
    applied = []

    def apply_arm(inventory_path, host_, context_length, ab_, arm, progress, timeout):
        applied.append(arm)
        server.post("/_test/config", {"restart": True, "token_delay_ms": 10.0 if arm == "A" else 20.0})

    cfg = SweepConfig(context_length=4096, concurrency=[4], input_len=16, output_len=64, repeat=3, num_prompts=8,
                      warmup_requests=1, metrics_interval_s=0.02)
    lines = []
    with open_session(host) as session:
        result = run_sweep(cfg, host=host, session=session, inventory_path=inventory, progress=lines.append,
                           ab=ab, apply_arm=apply_arm)
    record = result.record
    assert applied == ["A", "B", "A", "B", "A", "B"]
    assert [p["arm"] for p in record["points"]] == applied
    assert record["validity_passed"], [p["validity"]["failed"] for p in record["points"]]
    assert record["ab"]["key"] == "SGLANG_SM120_TRITON_INDEXER" and record["ab"]["values"] == {"A": "0", "B": "1"}
    verdicts = record["ab"]["comparison"]["metric_verdicts"]
    assert verdicts["decode_tok_s"] == "regressed" and verdicts["median_tpot_ms"] == "regressed", record["ab"]
    assert record["ab"]["outcome"] == "regressed" and "throughput regressed" in record["ab"]["summary"]
    # each arm's own provenance, taken after its restart (not the one read before arm A's)
    prov = record["ab"]["provenance"]
    assert prov["A"]["server"]["startup_time"] != prov["B"]["server"]["startup_time"]
    assert prov["A"]["server"]["startup_time"] != record["server"]["startup_time"]
    assert "C=4 regressed" in record["ab"]["summary"]
    per_arm = record["summary"]["per_arm"]
    assert per_arm["A"]["per_concurrency"]["4"]["valid_repetitions"] == 3
    assert any("arm B (SGLANG_SM120_TRITON_INDEXER=1)" in line for line in lines)
