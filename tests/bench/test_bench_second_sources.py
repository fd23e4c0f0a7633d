"""Every headline agrees with a second source over the whole run (docs/benchmarking.md, "Two
sources"): the rules on synthetic scrapes here, and each fault of the stand-in server end to end
through the real client (``test_each_fault_of_the_standin_invalidates_its_point``). Each of these
points was recorded as valid before the rules existed."""

from __future__ import annotations

import pytest

from dsv4kit.bench import conservation, gpu_count, prefill
from dsv4kit.bench.window import exact_occupancy

N, C, OSL = 8, 4, 8


def scrapes(*, decode_scale: float = 1.0, started: int = N, finished: int = N, dip_at: int | None = None,
            crowd: float = 0.0, verify: float | None = None, port: int = 1) -> dict:
    """The evidence of an honest point on the decode server (port 1), unless told otherwise: a scrape
    before the run (the client's marker at t=0, the run from t=1), 20 during, one after. ``verify``:
    speculative verify passes over the run (``spec_verify_calls_total``)."""
    base = {"decode_tokens_total": 100.0, "generation_tokens_total": 1000.0, "requests_started_total": 50.0,
            "num_requests_total": 50.0, "prefill_tokens_total": 500.0, "decode_passes_total": 10.0}
    grow = {"decode_tokens_total": N * (OSL - 1) * decode_scale, "generation_tokens_total": N * OSL,
            "requests_started_total": started, "num_requests_total": finished, "prefill_tokens_total": N * 16,
            "decode_passes_total": N * (OSL - 1) / C}
    if verify is not None:
        base["spec_verify_calls_total"], grow["spec_verify_calls_total"] = 7.0, verify
    samples = [{"t": 0.9, "port": port, "num_running_reqs": 0.0, "num_queue_reqs": 0.0, **base}]
    for k in range(1, 21):
        share = k / 20
        sample = {"t": 1.0 + 0.1 * k, "port": port, "num_running_reqs": float(C) + crowd, "num_queue_reqs": 0.0,
                  **{name: base[name] + grow[name] * share for name in base}}
        if dip_at == k:
            sample["decode_tokens_total"] = 3.0
        samples.append(sample)
    samples.append({"t": 3.2, "port": port, "num_running_reqs": 0.0, "num_queue_reqs": 0.0,
                    **{name: base[name] + grow[name] for name in base}})
    return {"main_run_marker_time": 0.0, "ended": 4.0, "samples": samples}


def sources(evidence, *, server_info=None, occupancy=None, headline=10.0) -> dict:
    line = {"output_lens": [OSL] * N}
    return conservation.analyze(line, evidence, decode_port=1, metrics_ports=[1], num_prompts=N, concurrency=C,
                                server_info=server_info or {}, occupancy=occupancy, headline=headline)


def test_an_honest_run_passes_every_second_source():
    out = sources(scrapes())
    assert all(v["passed"] for v in out.values()), out


def test_a_decode_counter_that_counts_double_is_invalid_and_names_both_numbers():
    out = sources(scrapes(decode_scale=2.0))["conservation"]
    assert not out["passed"]
    assert "grew by 112" in out["detail"] and "received 64 output tokens of which 56" in out["detail"], out
    # inside the window: tokens and forward passes disagree (one token a request a pass)
    bad = sources(scrapes(), occupancy={"admissible": True, "decode_tokens": 100.0, "forward_passes": 20.0})
    assert "100 tokens in 20 forward passes" in bad["conservation"]["detail"]


def test_speculation_is_bounded_by_the_drafts_the_server_accepted():
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4}
    # 56 decode tokens in 20 verify passes: 3 tokens over the client's count fit
    assert sources(scrapes(decode_scale=59 / 56, verify=20), server_info=spec)["conservation"]["passed"]
    out = sources(scrapes(decode_scale=2.0, verify=20), server_info=spec)["conservation"]
    assert not out["passed"] and "grew by 112 in 20 verify passes" in out["detail"] and "56 more" in out["detail"], out
    # High acceptance: 56 tokens in 15 passes of at most 4 leave room for 4 past the requests'
    # lengths. Round five's bound (D - 1 = 3 a request, 24 in all) let a counter 14 over pass.
    out = sources(scrapes(decode_scale=70 / 56, verify=15), server_info=spec)["conservation"]
    assert not out["passed"] and "14 more, where at most 4 may be drafts" in out["detail"], out
    # SGLang's acceptance length over the run (accepted tokens / verify passes) lies in [1, D]
    out = sources(scrapes(decode_scale=2.0, verify=8), server_info=spec)["conservation"]
    assert "acceptance length over the run, 112 accepted tokens in 8 verify passes = 14.000" in out["detail"], out
    # more verify passes than decode tokens delivered is no run the client saw
    assert "60 verify passes for 8 requests" in sources(scrapes(verify=60), server_info=spec)["conservation"]["detail"]
    blind = sources(scrapes(), server_info=spec)["conservation"]
    assert not blind["passed"] and "no sglang:spec_verify_calls_total" in blind["detail"]
    blind = sources(scrapes(verify=20), server_info={"speculative_algorithm": "EAGLE"})["conservation"]
    assert not blind["passed"] and "cannot be bounded" in blind["detail"]


def test_a_separate_prefill_server_must_start_exactly_the_points_requests():
    """sglang-router sends every request to one prefill and one decode server, so the prefill server
    counts N too; one fewer there is a request of the point missing, one more a foreign one."""
    def pd(prefill_started: int) -> dict:
        decode, prefill = scrapes(), scrapes(started=prefill_started, port=2)
        evidence = dict(decode, samples=decode["samples"] + prefill["samples"])
        line = {"output_lens": [OSL] * N}
        return conservation.analyze(line, evidence, decode_port=1, metrics_ports=[1, 2], num_prompts=N, concurrency=C,
                                    server_info={}, occupancy=None, headline=10.0)["no_foreign_requests"]

    assert pd(N)["passed"]
    for started in (N - 1, N + 1, 0):  # before: anything up to N passed
        out = pd(started)
        assert not out["passed"] and "port 2 (the prefill server" in out["detail"], out
        assert f"{started} generation requests started" in out["detail"], out


def test_a_counter_that_goes_down_is_invalid_naming_the_series_and_both_values():
    out = sources(scrapes(dip_at=10))["counters_up"]
    assert not out["passed"] and "decode_tokens_total went down from" in out["detail"] and "to 3" in out["detail"], out
    assert "rate <= 0" in sources(scrapes(), headline=-5.0)["counters_up"]["detail"]


def test_a_foreign_request_seen_by_any_counter_or_gauge_is_invalid():
    out = sources(scrapes(started=N + 1, finished=N + 1))["no_foreign_requests"]
    assert not out["passed"] and "9 generation requests started" in out["detail"] and "sent 8" in out["detail"]
    assert not sources(scrapes(crowd=1.0))["no_foreign_requests"]["passed"]
    blind = scrapes()
    for s in blind["samples"]:
        del s["requests_started_total"]
    assert "cannot be ruled out" in sources(blind)["no_foreign_requests"]["detail"]


def test_exact_occupancy_must_cover_the_stated_share_of_the_decode_phase():
    # exact for 25 scrapes, then 75 scrapes at C - 1: the server held C a quarter of the time
    samples = [{"t": 0.1 * k, "num_running_reqs": float(C if k < 25 else C - 1), "num_queue_reqs": 0.0,
                "prefill_tokens_total": 0.0, "num_requests_total": 0.0, "decode_tokens_total": 10.0 * k,
                "decode_passes_total": float(k)} for k in range(100)]
    occupancy = exact_occupancy(samples, C, 0.98, 20)
    assert not occupancy["admissible"] and occupancy["window_share"] < 0.5, occupancy
    assert "of the decode phase" in occupancy["detail"]
    assert exact_occupancy(samples, C, 0.98, 20, min_window_share=0.2)["admissible"]


def test_gpu_counts_come_from_the_servers_and_a_disagreement_names_both():
    host = {"dsv4_decode_gpus": [4, 5, 6, 7], "dsv4_prefill_gpus": [0, 1, 2, 3], "dsv4_gpu_count": 8}
    assert gpu_count.check(host, {"tp_size": 4}, {"tp_size": 4}) == (8, None)
    total, problem = gpu_count.check(host, {"tp_size": 2}, {"tp_size": 4})
    assert total is None and "runs on 2 GPU(s)" in problem and "gives it 4 (dsv4_decode_gpus)" in problem
    assert gpu_count.check({"dsv4_gpu_count": 8}, {"tp_size": 4, "dp_size": 2}, None) == (8, None)
    assert gpu_count.check({"dsv4_gpu_count": 4}, {"tp_size": 4, "dp_size": 2, "enable_dp_attention": True}, None)[0] == 4
    assert "no tp_size" in gpu_count.check(host, {}, None)[1]


def test_a_cold_prefill_with_another_request_beside_it_is_invalid():
    clean = {"seconds": 0.5, "prefill_tokens": 64, "prefill_cached_tokens": 0, "requests_started": {"1": 1}}
    assert prefill.judge(64, {"ok": True, "samples": [clean]})["valid"]
    busy = dict(clean, requests_started={"1": 2})
    entry = prefill.judge(64, {"ok": True, "samples": [busy]})
    assert not entry["valid"] and "port 1: 2" in entry["problems"][0]
    uncounted = dict(clean, requests_started={"1": None})
    assert not prefill.judge(64, {"ok": True, "samples": [uncounted]})["valid"]
    warm = dict(clean, prefill_cached_tokens=64)
    assert "from the cache" in prefill.judge(64, {"ok": True, "samples": [warm]})["problems"][0]


@pytest.mark.slow
def test_each_fault_of_the_standin_invalidates_its_point(bench_box):
    """One stand-in, five repetitions at C=8, reshaped before each: 1 honest; 2 a decode counter
    that counts double (the headline twice the truth); 3 scheduler counters that restart from 0
    mid-run; 4 one foreign request of one token at the run's start, which no gauge refresh shows;
    5 a slow prefill, one prompt at a time (250 ms each, a pass 30 ms): each wave ramps up for 2 s
    and holds C for about a second (the long-prompt case). Then /server_info reports DP 2: the
    bench stops before any point. Each was valid before round five: 2-4 had no second source; 5's
    exact stretch alone is an admissible window (checked below); the GPU count was the inventory's."""
    import threading
    import time

    from dsv4kit.bench.config import BenchAbort
    from tests.bench_support import ForeignLoad, in_process_sweep

    server, inventory = bench_box(context_length=4096, gauge_refresh_passes=40)  # SGLang's default cadence

    def foreign_after_the_run_began(flushes: int) -> None:
        while server.stats()["flush_count"] <= flushes:  # the client flushes, then pauses 1 s
            time.sleep(0.02)
        time.sleep(1.3)
        ForeignLoad(server, 1, tokens=1).start().join()

    def reshape(line):
        if "prompts of" not in line:
            return
        if "rep 2/5:" in line:
            server.post("/_test/config", {"decode_counter_scale": 2.0})
        elif "rep 3/5:" in line:  # the reset comes 300 decode tokens on: after the warm-up, mid-run
            server.post("/_test/config", {"decode_counter_scale": 1.0, "counter_reset_at": 300})
        elif "rep 4/5:" in line:
            threading.Thread(target=foreign_after_the_run_began, args=(server.stats()["flush_count"],),
                             daemon=True).start()
        elif "rep 5/5:" in line:
            server.post("/_test/config", {"prefill_ms": 250, "serial_prefill": True, "token_delay_ms": 30})

    record, _ = in_process_sweep(inventory, reshape, concurrency=[8], repeat=5, num_prompts=16,
                                 warmup_requests=2, output_len=96, progress_every_s=0.5)
    honest, double, reset, burst, ramped = record["points"]
    assert honest["validity"]["passed"], {k: v for k, v in honest["validity"]["gates"].items() if not v["passed"]}
    gate = double["validity"]["gates"]["conservation"]
    assert not gate["passed"] and "received 1536 output tokens of which 1520" in gate["detail"], gate
    gate = reset["validity"]["gates"]["counters_up"]
    assert not gate["passed"] and "went down from" in gate["detail"], gate
    gate = burst["validity"]["gates"]["no_foreign_requests"]
    assert not gate["passed"] and "17 generation requests started" in gate["detail"], gate
    # 5: a window by round four's rule (>= 20 scrapes, >= 98% exact), but exact occupancy covers
    # under half the decode phase; nothing else is wrong with the point (the client kept C in flight)
    occupancy, gate = ramped["window"]["occupancy"], ramped["validity"]["gates"]["exact_occupancy"]
    assert ramped["validity"]["failed"] == ["exact_occupancy"], ramped["validity"]["gates"]
    assert occupancy["window_scrapes"] >= 20 and occupancy["exact_share"] >= 0.98, occupancy
    assert occupancy["window_share"] < 0.5 and f"{100 * occupancy['window_share']:.0f}% of the" in gate["detail"]
    assert honest["window"]["occupancy"]["window_share"] >= 0.5
    assert honest["window"]["occupancy"]["rule"]["gauge_refresh_passes"] == 40

    # the servers say they run on more GPUs than the inventory gives them: no point runs
    server.post("/_test/config", {"dp_size": 2})
    before = server.stats()["generate_count"]
    with pytest.raises(BenchAbort) as stopped:
        in_process_sweep(inventory, concurrency=[8], repeat=1, num_prompts=8, warmup_requests=1, output_len=16)
    message = str(stopped.value)
    assert "runs on 8 GPU(s) (tp_size 4 x pp_size 1 x dp_size 2" in message and "gives it 4" in message, message
    assert server.stats()["generate_count"] == before
