"""Fast tests of the bench pieces: statistics, secret scrubbing, validity gates, sweep arguments."""

from __future__ import annotations

import math

import pytest

from dsv4kit import stats
from dsv4kit.bench import (BenchAbort, SweepConfig, check_config, client_argv, default_lengths, parse_concurrency,
                           run_names)
from dsv4kit.bench_gates import GateConfig, PointExpectation, evaluate
from dsv4kit.records import derive, split_client_line
from dsv4kit.scrub import SCRUBBED, find_secrets, is_secret_name, scrub
from tests.bench_support import client_line

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
        "empty_key": {"api_key": None},
    }
    clean = scrub(data)
    assert find_secrets(clean, [SECRET, "adm-secret-9", "hf_x"]) == []
    assert clean["server_info"]["api_key"] == SCRUBBED and clean["server_info"]["tp_size"] == 4
    assert clean["argv"][3:7] == ["--api-key", SCRUBBED, "--tp", "4"]
    assert clean["argv"][7] == f"--admin-api-key={SCRUBBED}"
    assert clean["launch_command"].endswith(f"--api-key {SCRUBBED} --tp 4")
    assert clean["empty_key"]["api_key"] is None
    assert data["server_info"]["api_key"] == SECRET  # the input is not modified


# ------------------------------------------------------------------------------------ gates
def expectation(**kw):
    base = dict(num_prompts=8, input_len=16, output_len=8, max_concurrency=4, startup_time=1.0)
    base.update(kw)
    return PointExpectation(**base)


def test_a_clean_point_passes_every_gate():
    validity = evaluate(client_line(), expectation())
    assert validity["passed"], validity
    assert set(validity["gates"]) == {"completed", "no_errors", "output_tokens", "ttft_positive", "input_lens",
                                      "concurrency", "cold_cache", "same_server"}


def test_the_error_chunk_trap_is_caught():
    # The client counts the rejected requests as completed with the requested output length.
    line = client_line(error_chunks=2)
    assert line["completed"] == 8 and line["total_output_tokens"] == 64
    validity = evaluate(line, expectation())
    assert not validity["passed"]
    assert {"output_tokens", "ttft_positive"} <= set(validity["failed"])
    assert "completed" not in validity["failed"]
    assert "empty text" in validity["gates"]["output_tokens"]["detail"]


def test_one_error_chunk_among_many_is_still_caught():
    # 1 of 64 is within the 5% retokenization tolerance; the per-request checks still catch it.
    validity = evaluate(client_line(n=64, error_chunks=1), expectation(num_prompts=64))
    assert validity["retok_ratio"] > 0.95
    assert {"output_tokens", "ttft_positive"} <= set(validity["failed"])


def test_other_gates():
    line = client_line()
    line["completed"] = 7
    line["errors"][3] = "Traceback ... ClientConnectorError"
    v = evaluate(line, expectation())
    assert {"completed", "no_errors"} <= set(v["failed"])
    assert "ClientConnectorError" in v["gates"]["no_errors"]["detail"]

    assert "cold_cache" in evaluate(client_line(cached=8), expectation())["failed"]
    assert "cold_cache" not in evaluate(client_line(cached=8), expectation(), GateConfig(expect_cold=False))["gates"]

    low = client_line()
    low["concurrency"] = 2.0
    assert "concurrency" in evaluate(low, expectation())["failed"]

    assert "same_server" in evaluate(client_line(startup_time=2.0), expectation())["failed"]
    assert "input_lens" in evaluate(client_line(isl=15), expectation())["failed"]

    bare = {k: v for k, v in client_line().items() if k not in ("ttfts", "errors", "input_lens")}
    v = evaluate(bare, expectation())
    assert {"ttft_positive", "no_errors", "input_lens"} <= set(v["failed"])


def test_split_and_derive():
    raw, details, server_info = split_client_line(client_line(concurrency=16, tpot_ms=40.0))
    assert "server_info" not in raw and "ttfts" not in raw and "generated_texts" not in details
    assert details["generated_text_chars"] and server_info["api_key"] == SECRET
    derived = derive(raw, 8)
    assert derived["decode_tok_s"] == pytest.approx(16 * 1000 / 40.0)
    assert derived["decode_tok_s_per_gpu"] == pytest.approx(400.0 / 8)
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
    assert run_names("box 1", 131072, "20260101T000000Z") == (
        "box-1-ctx131072-20260101T000000Z", "bench/box-1/131072/20260101T000000Z")


def test_the_restart_reruns_the_serving_tag_with_the_new_context_length(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from dsv4kit import provision
    from dsv4kit.bench import default_restart

    calls = []

    def fake_run_playbook(inventory_path, **kwargs):
        calls.append((inventory_path, kwargs))
        return SimpleNamespace(failed=len(calls) > 1, returncode=2, timed_out=len(calls) > 2,
                               stdout_tail="fatal: [box1]: FAILED!")

    monkeypatch.setattr(provision, "run_playbook", fake_run_playbook)
    host = SimpleNamespace(name="box1")
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
    from dsv4kit.provenance import _launch_args

    quoted = "python -m sglang.launch_server --model-path '/models/DeepSeek V4' --tp 4"
    assert _launch_args({"launch_command": quoted}, []) == [
        "python", "-m", "sglang.launch_server", "--model-path", "/models/DeepSeek V4", "--tp", "4"]
    assert _launch_args({"launch_command": "python -m x --flag 'unbalanced"}, []) == [
        "python", "-m", "x", "--flag", "'unbalanced"]
    assert _launch_args({}, [{"argv": ["python", "-m", "sglang.launch_server"]}])[-1] == "sglang.launch_server"
