"""Fast tests of the bench pieces: statistics, secret scrubbing, validity gates, sweep arguments."""

from __future__ import annotations

import math

import pytest

from dsv4kit.records import stats
from dsv4kit.bench.sweep import (BenchAbort, SweepConfig, check_config, client_argv, default_lengths, parse_concurrency,
                           run_names)
from dsv4kit.bench.gates import GateConfig, PointExpectation, evaluate
from dsv4kit.records.record import derive, split_client_line
from dsv4kit.core.scrub import SCRUBBED, find_secrets, is_secret_name, scrub
from tests.bench_support import client_line, good_evidence

SECRET = "sk-dsv4kit-FAKE-SECRET-3f9a"


# ------------------------------------------------------------------------------------ stats
@pytest.mark.parametrize("df,expected", [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042),
                                         (120, 1.980), (1e9, 1.960)])
def test_t_table_matches_the_printed_quantiles(df, expected):
    assert stats.t975(df) == pytest.approx(expected, abs=0.001)


def test_t_table_interpolation_is_close_to_the_exact_quantile():
    scipy_t = pytest.importorskip("scipy.stats").t
    for df in [1.02, 1.3, 1.77, 2.4, 3.3, 5.9, 12.5, 37.0, 75.0, 300.0, 5000.0]:
        assert stats.t975(df) == pytest.approx(float(scipy_t.ppf(0.975, df)), abs=0.03 if df < 3 else 0.005)


def test_summary_mean_std_and_interval():
    s = stats.summarize([10.0, 12.0, 14.0])
    assert s["n"] == 3 and s["mean"] == 12.0 and s["std"] == pytest.approx(2.0)
    half = stats.t975(2) * 2.0 / math.sqrt(3)
    assert s["ci95"] == pytest.approx([12.0 - half, 12.0 + half])
    one = stats.summarize([5.0])
    assert one["n"] == 1 and one["std"] is None and one["ci95"] is None
    assert stats.summarize([])["mean"] is None


def test_welch_interval():
    assert stats.welch_diff_ci95([1.0], [2.0, 3.0]) is None
    lo, hi = stats.welch_diff_ci95([100.0, 101.0, 99.0], [90.0, 91.0, 89.0])
    assert lo < -10 < hi < 0
    assert stats.welch_diff_ci95([5.0, 5.0], [6.0, 6.0]) == (1.0, 1.0)


# ------------------------------------------------------------------------------------ scrub
def test_secret_names():
    for name in ("api_key", "admin_api_key", "HF_TOKEN", "OPENAI_API_KEY", "db-password", "ssh_private_key_file"):
        assert is_secret_name(name), name
    for name in ("max_total_num_tokens", "token_ids_logprob", "tokenize_prompt", "cached_tokens",
                 "total_output_tokens_retokenized", "tokenizer_path", "key_fields"):
        assert not is_secret_name(name), name


def test_scrub_walks_nested_dicts_lists_and_argv_strings():
    data = {
        "server_info": {"api_key": SECRET, "admin_api_key": "adm-secret-9", "tp_size": 4, "nested": [{"hf_token": "hf_x"}]},
        "argv": ["python", "-m", "sglang.launch_server", "--api-key", SECRET, "--tp", "4", "--admin-api-key=adm-secret-9"],
        "launch_command": f"python -m sglang.launch_server --api-key {SECRET} --tp 4",
        "empty": {"api_key": None},
    }
    clean = scrub(data)
    assert find_secrets(clean, [SECRET, "adm-secret-9", "hf_x"]) == []
    assert clean["server_info"]["api_key"] == SCRUBBED and clean["server_info"]["tp_size"] == 4
    assert clean["argv"][3:7] == ["--api-key", SCRUBBED, "--tp", "4"]
    assert clean["argv"][7] == f"--admin-api-key={SCRUBBED}"
    assert clean["launch_command"].endswith(f"--api-key {SCRUBBED} --tp 4")
    assert clean["empty"]["api_key"] is None
    assert data["server_info"]["api_key"] == SECRET  # the input is not modified


# ------------------------------------------------------------------------------------ gates
def expectation(**kw):
    base = dict(num_prompts=8, input_len=16, output_len=8, max_concurrency=4, startup_time=1.0,
                max_running_requests=256, max_total_num_tokens=1_000_000)
    base.update(kw)
    return PointExpectation(**base)


def check(line, expected=None, config=GateConfig(), **evidence_kw):
    """evaluate() with the evidence an honest server leaves (``good_evidence``), unless overridden."""
    expected = expected or expectation()
    evidence, window = good_evidence(expected.max_concurrency, **evidence_kw)
    return evaluate(line, expected, config, evidence, window)


def test_a_clean_point_passes_every_gate():
    validity = check(client_line())
    assert validity["passed"], validity
    assert set(validity["gates"]) == {"completed", "no_errors", "output_tokens", "ttft_positive", "input_lens",
                                      "concurrency", "exact_occupancy", "conservation", "counters_up",
                                      "no_foreign_requests", "max_running", "kv_capacity", "cold_cache",
                                      "same_server"}


def test_missing_evidence_fails_its_gate_never_passes_it():
    # The client writes cached_tokens 0 and the planned prompt length when the server omits them.
    v = check(client_line(), meta_keys=("completion_tokens",))
    assert {"cold_cache", "input_lens"} <= set(v["failed"])
    assert "default, not evidence" in v["gates"]["cold_cache"]["detail"]
    # no probe result at all, no window, no limits, no startup_time
    v = evaluate(client_line(), expectation(startup_time=None, max_running_requests=None, max_total_num_tokens=None))
    assert {"cold_cache", "input_lens", "exact_occupancy", "conservation", "counters_up", "no_foreign_requests",
            "max_running", "kv_capacity", "same_server"} <= set(v["failed"])
    line = client_line()
    del line["server_info"]["startup_time"]
    assert "no startup_time" in check(line)["gates"]["same_server"]["detail"]
    # the prefill server counts for same_server: missing or changed startup_time on it fails
    evidence, window = good_evidence(4)
    pd = expectation(prefill_port=31000, prefill_startup_time=5.0)
    evidence["startup_after"] = {"31000": {"reported": True, "startup_time": 6.0}}
    assert "prefill server's startup_time changed" in evaluate(client_line(), pd, GateConfig(), evidence, window)[
        "gates"]["same_server"]["detail"]
    evidence["startup_after"] = {"31000": {"reported": False, "startup_time": None}}
    assert "same_server" in evaluate(client_line(), pd, GateConfig(), evidence, window)["failed"]
    evidence["startup_after"] = {"31000": {"reported": True, "startup_time": 5.0}}
    assert evaluate(client_line(), pd, GateConfig(), evidence, window)["passed"]


def test_the_effective_max_running_requests_is_the_schedulers():
    from dsv4kit.bench.gates import effective_max_running

    assert effective_max_running({"max_running_requests": None, "internal_states": [
        {"effective_max_running_requests_per_dp": 48}, {"effective_max_running_requests_per_dp": 48}]}) == 96
    assert effective_max_running({"max_running_requests": 64}) == 64
    assert effective_max_running({"max_running_requests": None}) is None
    assert effective_max_running({"decode": [{"max_running_requests": 32}], "prefill": []}) == 32


def test_server_side_gates():
    # a server that decoded 2 of C=8 at a time: the client still saw concurrency ~8 (queued requests count)
    line = client_line(concurrency=8)
    v = check(line, expectation(max_concurrency=8), running=2)
    assert v["failed"] == ["exact_occupancy"] and "ran 2 to 2 requests" in v["gates"]["exact_occupancy"]["detail"]
    # one short of C is not C: no tolerance (it passed as 0.8 x C before round four)
    assert check(line, expectation(max_concurrency=8), running=7)["failed"] == ["exact_occupancy"]
    assert "max_running" in check(line, expectation(max_concurrency=8, max_running_requests=4))["failed"]
    # C x (ISL + OSL) = 8 x 24 = 192 tokens must fit the KV pool
    assert "kv_capacity" in check(line, expectation(max_concurrency=8, max_total_num_tokens=191))["failed"]
    assert check(line, expectation(max_concurrency=8, max_total_num_tokens=192))["passed"]


def test_the_error_chunk_trap_is_caught():
    # The client counts the rejected requests as completed with the requested output length.
    line = client_line(error_chunks=2)
    assert line["completed"] == 8 and line["total_output_tokens"] == 64
    validity = check(line)
    assert not validity["passed"]
    assert {"output_tokens", "ttft_positive"} <= set(validity["failed"])
    assert "completed" not in validity["failed"]
    assert "empty text" in validity["gates"]["output_tokens"]["detail"]


def test_one_error_chunk_among_many_is_still_caught():
    # 1 of 64 is within the 5% retokenization tolerance; the per-request checks still catch it.
    validity = check(client_line(n=64, error_chunks=1), expectation(num_prompts=64))
    assert validity["retok_ratio"] > 0.95
    assert {"output_tokens", "ttft_positive"} <= set(validity["failed"])


def test_other_gates():
    line = client_line()
    line["completed"] = 7
    line["errors"][3] = "Traceback ... ClientConnectorError"
    v = check(line)
    assert {"completed", "no_errors"} <= set(v["failed"])
    assert "ClientConnectorError" in v["gates"]["no_errors"]["detail"]

    assert "cold_cache" in check(client_line(cached=8))["failed"]
    assert "cold_cache" not in check(client_line(cached=8), config=GateConfig(expect_cold=False))["gates"]

    low = client_line()
    low["concurrency"] = 2.0
    assert "concurrency" in check(low)["failed"]

    assert "same_server" in check(client_line(startup_time=2.0))["failed"]
    assert "input_lens" in check(client_line(isl=15))["failed"]

    bare = {k: v for k, v in client_line().items() if k not in ("ttfts", "errors", "input_lens")}
    v = check(bare)
    assert {"ttft_positive", "no_errors", "input_lens"} <= set(v["failed"])


def test_split_and_derive():
    raw, details, server_info = split_client_line(client_line(concurrency=16, tpot_ms=40.0))
    assert "server_info" not in raw and "ttfts" not in raw and "generated_texts" not in details
    assert details["generated_text_chars"] and server_info["api_key"] == SECRET
    derived = derive(raw, 8, {"decode_tok_s": 320.0})
    assert derived["decode_tok_s"] == 320.0 and derived["tpot_formula_tok_s"] == pytest.approx(16 * 1000 / 40.0)
    assert derived["decode_tok_s_per_gpu"] == pytest.approx(320.0 / 8)
    assert derive(raw, 8)["decode_tok_s"] is None  # no window, no headline
    assert derived["interactivity_tok_s_user"] == pytest.approx(25.0)


# ------------------------------------------------------------------------------------ sweep args
def test_default_lengths_leave_room_for_the_output():
    assert default_lengths(131072, None, None) == (130048, 512)
    assert default_lengths(8192, 512, 512) == (512, 512)


def test_bad_sweep_arguments_are_usage_errors():
    def cfg(**kw):
        base = dict(context_length=4096, concurrency=[1, 4], input_len=16, output_len=8)
        base.update(kw)
        return SweepConfig(**base)

    check_config(cfg())
    for bad, words in [(dict(input_len=4000, output_len=200), "exceeds --ctx 4096"),
                       (dict(concurrency=[1, 1]), "duplicates"), (dict(concurrency=[0]), ">= 1"),
                       (dict(output_len=1), "TPOT"), (dict(repeat=0), "--repeat")]:
        with pytest.raises(BenchAbort) as info:
            check_config(cfg(**bad))
        assert info.value.exit_code == 2 and words in str(info.value)
    with pytest.raises(BenchAbort):
        parse_concurrency("1,x")
    assert parse_concurrency("1, 16,64") == [1, 16, 64]


def test_client_command_line_has_the_trap_fixes():
    cfg = SweepConfig(context_length=131072, concurrency=[64], input_len=130048, output_len=512, seed=7)
    argv = client_argv("/v/bin/python", cfg, concurrency=64, base_url="http://127.0.0.1:30000",
                       model_path="/models/m", output_file="/w/c64.jsonl", tag="t")
    joined = " ".join(argv)
    assert argv[:3] == ["/v/bin/python", "-m", "sglang.benchmark.serving"]
    for flag in ("--random-range-ratio 1.0", "--flush-cache", "--tokenize-prompt", "--output-details",
                 "--cache-report", "--seed 7", "--dataset-name random-ids", "--tokenizer /models/m",
                 "--num-prompts 128", "--max-concurrency 64", "--warmup-requests 64", "--backend sglang"):
        assert flag in joined, flag
    assert "--disable-ignore-eos" not in joined and "--apply-chat-template" not in joined
    assert cfg.prompts_for(1) == 8 and SweepConfig(8192, [1], 512, 512).prompts_for(64) == 640


def test_run_names():
    assert run_names("box 1", 131072, "20260101T000000Z-a1b2c3") == (
        "box-1-ctx131072-20260101T000000Z-a1b2c3", "bench/box-1/131072/20260101T000000Z-a1b2c3")


def test_the_restart_reruns_the_serving_tag_with_the_new_context_length(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from dsv4kit.provision import playbook as provision
    from dsv4kit.bench.sweep import default_restart

    calls = []

    def fake_run_playbook(inventory_path, **kwargs):
        calls.append((inventory_path, kwargs))
        return SimpleNamespace(failed=len(calls) > 1, returncode=2, timed_out=len(calls) > 2,
                               stdout_tail="fatal: [box1]: FAILED!")

    monkeypatch.setattr(provision, "run_playbook", fake_run_playbook)
    host = SimpleNamespace(name="box1", get=lambda key, default=None: default)  # an inventory host's reads
    default_restart(tmp_path / "hosts.yml", host, 131072, lambda line: None, 900.0)
    inventory_path, kwargs = calls[0]
    assert inventory_path == tmp_path / "hosts.yml"
    assert kwargs["limit"] == "box1" and kwargs["tags"] == ["sglang_service"]
    assert kwargs["extra_vars"] == {"dsv4_context_length": 131072} and kwargs["timeout"] == 900.0
    with pytest.raises(BenchAbort) as info:
        default_restart(tmp_path / "hosts.yml", host, 131072, lambda line: None, 900.0)
    assert info.value.exit_code == 6 and "FAILED" in str(info.value) and "exit 2" in str(info.value)
    with pytest.raises(BenchAbort) as info:  # stopped by the timeout: exit 4, as documented
        default_restart(tmp_path / "hosts.yml", host, 131072, lambda line: None, 900.0)
    assert info.value.exit_code == 4


def test_launch_command_string_keeps_quoted_arguments_whole():
    from dsv4kit.records.provenance import _launch_args

    quoted = "python -m sglang.launch_server --model-path '/models/DeepSeek V4' --tp 4"
    assert _launch_args({"launch_command": quoted}, []) == [
        "python", "-m", "sglang.launch_server", "--model-path", "/models/DeepSeek V4", "--tp", "4"]
    assert _launch_args({"launch_command": "python -m x --flag 'unbalanced"}, []) == [
        "python", "-m", "x", "--flag", "'unbalanced"]
    assert _launch_args({}, [{"argv": ["python", "-m", "sglang.launch_server"]}])[-1] == "sglang.launch_server"


# ------------------------------------------------------------------------------------ window
def test_the_window_measures_what_was_delivered_not_c_over_tpot():
    from dsv4kit.bench.window import analyze, steady_window, token_timeline

    # C=4 on an honest server: 4 requests of 10 tokens, 10 ms apart, then 4 more: 400 tok/s.
    ttfts, itls = [0.01] * 8, [[0.01] * 9] * 8
    requests = token_timeline(ttfts, itls, 4)
    assert [r["start"] for r in requests] == pytest.approx([0.0] * 4 + [0.1] * 4)
    a, b = steady_window(requests, 4)
    assert (a, b) == pytest.approx((0.01, 0.2))
    assert analyze({"ttfts": ttfts, "itls": itls}, 4, None, 1)["client_decode_tok_s"] == pytest.approx(400.0, rel=0.02)

    # C=4 on a server that decodes 2 at a time: requests 3, 4 wait 100 ms for a slot (their TTFT
    # includes it). Every request still sees 10 ms per token, so C x 1000 / TPOT says 400 tok/s;
    # what was delivered is 200.
    ttfts, itls = [0.01, 0.01] + [0.11] * 10, [[0.01] * 9] * 12
    window = analyze({"ttfts": ttfts, "itls": itls}, 4, None, 1)
    assert window["window_tok_s"] == pytest.approx(200.0, rel=0.1)
    # never 4 decoding at once: no decode headline at all
    assert window["decode_tok_s"] is None and "never had all 4" in window["decode_evidence"]
    assert window["running"] is None and "no /metrics evidence" in window["evidence"]


def test_a_prefill_ramp_longer_than_a_decode_is_named_with_the_output_len_that_would_fill():
    from dsv4kit.bench.window import analyze

    # C=4, long prompts on one prefill server: each prompt takes 0.5 s to prefill, one after the
    # other; a request then decodes 10 tokens at 20 ms (0.18 s). The first finishes at 0.68 s,
    # before the fourth's first token at 2.0 s: four never decode together, whatever the server.
    ttfts, itls = [0.5, 1.0, 1.5, 2.0] + [2.0] * 4, [[0.02] * 9] * 8
    evidence = analyze({"ttfts": ttfts, "itls": itls, "output_lens": [10] * 8}, 4, None, 1)["decode_evidence"]
    assert "never had all 4" in evidence and "1.50 s after the first" in evidence, evidence
    assert "an --output-len of about 105 or more" in evidence, evidence  # 10 x 1.25 x 1.5 / 0.18
    # an honest C=4 point has its stretch of four decoding together, and no such evidence
    honest = analyze({"ttfts": [0.01] * 8, "itls": [[0.01] * 9] * 8}, 4, None, 1)
    assert honest["client_decode_tok_s"] and "decode_evidence" not in honest


def test_window_samples_are_placed_on_the_box_clock():
    from dsv4kit.bench.window import analyze

    ttfts, itls = [0.01] * 8, [[0.01] * 9] * 8
    marker = 1000.0  # the run starts 1 s after the marker line
    samples = [{"t": marker + 1.0 + i * 0.02, "port": 7, "num_running_reqs": 4.0, "num_queue_reqs": 0.0,
                "token_usage": 0.1, "gen_throughput": 390.0} for i in range(11)]
    samples += [{"t": marker + 0.5, "port": 7, "num_running_reqs": 0.0}]  # warm-up time: outside
    samples += [{"t": marker + 1.1, "port": 8, "num_running_reqs": 0.0}]  # another server
    evidence = {"main_run_marker_time": marker, "samples": samples}
    window = analyze({"ttfts": ttfts, "itls": itls}, 4, evidence, 7)
    assert window["samples"] >= 2 and window["running"]["median"] == 4.0
    assert window["server_gen_throughput_mean"] == 390.0
    assert analyze({"ttfts": ttfts, "itls": itls}, 4, {**evidence, "main_run_marker_time": None}, 7)["running"] is None


def test_prometheus_text_is_parsed_as_sglang_serves_it():
    from dsv4kit.serving.box.metrics import parse_exposition, select_metrics

    text = (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="m",engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 3.0\n'
        'sglang:num_running_reqs{model_name="m",engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="1"} 2.0\n'
        'sglang:token_usage{model_name="m",engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"} 0.25\n'
        'sglang:token_usage{model_name="m",engine_type="decode",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="1"} 0.5\n'
        'sglang:generation_tokens_total{model_name="m",engine_type="decode",is_streaming="true"} 120.0\n'
        'sglang:generation_tokens_created{model_name="m",engine_type="decode",is_streaming="true"} 1.7e9\n'
        'sglang:cache_hit_rate{model_name="m"} 0.0\n'
    )
    values, problems = select_metrics(parse_exposition(text))
    assert values == {"num_running_reqs": 5.0, "token_usage": 0.5, "generation_tokens_total": 120.0}
    assert "missing" in problems["num_queue_reqs"]


def test_scrubber_cases_that_used_to_slip_through():
    from dsv4kit.core.scrub import scrub_text

    text = f"python -m sglang.launch_server --skip-tokenizer-init --api-key {SECRET} --tp 4"
    assert scrub_text(text) == f"python -m sglang.launch_server --skip-tokenizer-init --api-key {SCRUBBED} --tp 4"
    assert SECRET not in scrub_text(f"--enable-metrics --admin-api-key={SECRET}")
    for name in ("NGC_KEY", "S3_KEY", "ngc-key", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN"):
        assert is_secret_name(name), name
        assert scrub({name: "nvapi-123"}) == {name: SCRUBBED}
        assert "nvapi-123" not in scrub_text(f"Environment={name}=nvapi-123 CUDA_VISIBLE_DEVICES=0")
    assert not is_secret_name("comparability_key") and not is_secret_name("watermark_key")
    assert scrub_text("CUDA_VISIBLE_DEVICES=0,1 max_total_num_tokens=5") == "CUDA_VISIBLE_DEVICES=0,1 max_total_num_tokens=5"
    urls = scrub_text("pip install --index-url https://user:hunter2@pypi.example.com/simple "
                      "git+https://ghp_abc123@github.com/x/y.git "
                      "https://bucket.s3.amazonaws.com/w.bin?X-Amz-Signature=deadbeef&X-Amz-Date=1&token=t0k")
    for secret in ("hunter2", "ghp_abc123", "deadbeef", "t0k"):
        assert secret not in urls, urls
    assert "pypi.example.com/simple" in urls and "X-Amz-Date=1" in urls
    assert scrub_text("see https://docs.sglang.ai/x?page=2") == "see https://docs.sglang.ai/x?page=2"


# ------------------------------------------------------------------------------------ SLOs
def test_percentiles_need_enough_requests_and_carry_bootstrap_intervals():
    from dsv4kit.bench.slo import latency_block, min_requests, percentiles_with_ci

    assert (min_requests(50), min_requests(90), min_requests(99)) == (5, 29, 299)
    few = percentiles_with_ci([float(i) for i in range(64)])
    assert few["p50"]["value"] == pytest.approx(31.5) and few["p50"]["ci95"][0] < 31.5 < few["p50"]["ci95"][1]
    assert few["p99"]["value"] is None and "at least 299 requests" in few["p99"]["reason"]
    many = percentiles_with_ci([float(i) for i in range(400)])
    assert many["p99"]["value"] == pytest.approx(395.01) and many["p99"]["ci95"][1] >= many["p99"]["value"]
    assert percentiles_with_ci([float(i) for i in range(400)]) == many  # fixed seed: the same interval

    # goodput: requests within both limits per second; p99 judged only with enough requests
    line = client_line(n=8, osl=8, ttft_ms=12.0, tpot_ms=10.0)
    line["ttfts"][0] = 0.5  # one slow first token
    block = latency_block(line, {"ttft_ms": 100.0, "tpot_ms": 20.0})
    goodput = block["goodput"]
    assert goodput["good_requests"] == 7 and goodput["attainment_pct"] == pytest.approx(87.5)
    assert goodput["goodput_req_s"] == pytest.approx(7 / line["duration"])
    assert goodput["p99_within_limits"] is None and "too few" in goodput["p99_reason"]
    assert latency_block(line, None)["goodput"] is None
    derived = derive(split_client_line(line)[0], 8, None, block)
    assert derived["goodput_req_s"] == goodput["goodput_req_s"] and derived["p99_ttft_ms"] is None


# ------------------------------------------------------------------------------------ telemetry
@pytest.mark.parametrize("old_driver", [False, True])
def test_gpu_telemetry_is_sampled_with_lms_and_summarised(fake_nvidia_smi, tmp_path, monkeypatch, old_driver):
    import time as _time

    from dsv4kit.serving.box.telemetry import Telemetry, gpu_settings

    if old_driver:
        monkeypatch.setenv("FAKE_NVSMI_OLD", "1")
    with Telemetry(100, str(tmp_path / "t.csv")) as telemetry:
        _time.sleep(0.6)
    result = telemetry.result()
    assert result["available"], result
    assert len(result["samples"]) >= 4 and {s["index"] for s in result["samples"]} == {0, 1}
    per = result["per_gpu"]
    assert per["0"]["sm_clock_mhz"]["max"] == 2400 and per["0"]["event_reasons"] == []
    assert per["1"]["event_reasons"] == ["sw_power_cap"] and per["1"]["temperature_c_max"] == 85
    assert per["1"]["power_w"]["max"] == pytest.approx(550.5)
    settings = gpu_settings()
    assert settings["available"] and settings["devices"][0]["persistence_mode"] == "Enabled"
    assert settings["devices"][0]["ecc.mode.current"] == "Disabled"
    assert settings["devices"][0]["clocks.applications.graphics"] is None  # [N/A]


def test_no_nvidia_smi_is_said_not_hidden(tmp_path, monkeypatch):
    from dsv4kit.serving.box.telemetry import Telemetry

    monkeypatch.setenv("PATH", str(tmp_path))
    with Telemetry(100, str(tmp_path / "t.csv")) as telemetry:
        pass
    assert telemetry.result() == {"available": False, "reason": "nvidia-smi not found on PATH", "samples": [],
                                  "per_gpu": {}}


# ------------------------------------------------------------------------------------ A/B
def test_ab_argument_and_what_each_arm_restarts_with():
    from types import SimpleNamespace

    from dsv4kit.bench.sweep import arm_extra_vars, parse_ab

    ab = parse_ab("SGLANG_SM120_TRITON_INDEXER=0,1")
    assert ab.kind == "env" and ab.values == {"A": "0", "B": "1"}
    host = SimpleNamespace(get=lambda k, d=None: {"dsv4_kernel_flags": {"SGLANG_SM120_TRITON_INDEXER": "1",
                                                                         "SGLANG_SM120_MMA_ATTENTION": "1"},
                                                   "dsv4_server_extra_args": ["--enable-metrics",
                                                                              "--attention-backend", "dsv4"]}.get(k, d))
    tags, extra = arm_extra_vars(host, 131072, ab, "A")
    assert tags == ["kernel_rollout", "sglang_service"] and extra["dsv4_context_length"] == 131072
    assert extra["dsv4_kernel_flags"] == {"SGLANG_SM120_TRITON_INDEXER": "0", "SGLANG_SM120_MMA_ATTENTION": "1"}
    flag = parse_ab("--attention-backend=triton,dsv4")
    tags, extra = arm_extra_vars(host, 8192, flag, "A")
    assert tags == ["sglang_service"]
    assert extra["dsv4_server_extra_args"] == ["--enable-metrics", "--attention-backend", "triton"]
    for bad, words in [("X=1", "exactly two"), ("lower=0,1", "not an inventory setting"), ("Lower-x=0,1", "KEY must be"), ("K=1,1", "the same"),
                       ("K=1,2,3", "exactly two")]:
        with pytest.raises(BenchAbort) as info:
            parse_ab(bad)
        assert info.value.exit_code == 2 and words in str(info.value), bad


def test_an_unwritable_spill_directory_stops_the_sweep(tmp_path):
    from dsv4kit.bench.sweep import Spill, SpillError
    from dsv4kit.core import exitcodes

    (tmp_path / "file").write_text("x")
    spill = Spill(tmp_path / "file" / "run")
    with pytest.raises(SpillError) as caught:
        spill.point({"max_concurrency": 1, "repetition": 0, "raw": {}}, "details/c1_r0.json.gz", {})
    assert caught.value.exit_code == exitcodes.ENVIRONMENT and "cannot spill" in str(caught.value)
    good = Spill(tmp_path / "spill" / "run")
    good.create()
    good.point({"max_concurrency": 4, "repetition": 0, "arm": "B", "raw": {"api_key": "sk-x"}},
               "details/c4_r0_B.json.gz", {"ttfts": [0.1]})
    written = (tmp_path / "spill" / "run" / "point-c4-r0-B.json").read_text()
    assert "sk-x" not in written and (tmp_path / "spill" / "run" / "details" / "c4_r0_B.json.gz").is_file()
    good.remove()
    assert not (tmp_path / "spill" / "run").exists()
