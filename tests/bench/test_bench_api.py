"""``dsv4kit bench --api``: the client's command line per API, the chat route's prompt-length rule,
and records that say which API they measured (never compared across APIs). The run itself, through
the real client against the chat stand-in, is in tests/bench/test_chat_standin_bench.py."""

from __future__ import annotations

import json

import pytest

from dsv4kit.bench import api as bench_api
from dsv4kit.bench.config import SweepConfig, client_argv, from_request
from dsv4kit.bench.run import BenchRequest
from dsv4kit.core.exitcodes import Abort
from dsv4kit.records.compare import compare, format_comparison
from dsv4kit.records.record import RecordError, check, comparability_key
from tests.bench_support import publish_record, synthetic_record


def argv(api: str) -> list:
    cfg = SweepConfig(context_length=8192, concurrency=[4], input_len=1024, output_len=64, api=api)
    return client_argv("/v/bin/python", cfg, concurrency=4, base_url="http://127.0.0.1:30000",
                       model_path="/models/m", output_file="/w/o.jsonl", tag="t", served_name="org/served")


def test_the_chat_api_drives_the_chat_backend_by_the_served_name_with_usage():
    chat, native = argv("chat"), argv("generate")
    assert chat[chat.index("--backend") + 1] == "sglang-oai-chat"
    assert chat[chat.index("--model") + 1] == "org/served" and chat[chat.index("--tokenizer") + 1] == "/models/m"
    assert json.loads(chat[chat.index("--extra-request-body") + 1]) == {"stream_options": {"include_usage": True}}
    assert "--tokenize-prompt" not in chat and "--disable-ignore-eos" not in chat
    assert native[native.index("--backend") + 1] == "sglang" and native[native.index("--model") + 1] == "/models/m"
    assert "--tokenize-prompt" in native and "--extra-request-body" not in native


def test_an_unknown_api_is_refused_before_anything_runs():
    with pytest.raises(Abort) as caught:
        from_request(BenchRequest(ctx=8192, input_len=1024, output_len=64, api="completions"))
    assert caught.value.exit_code == 2 and "--api must be one of generate, chat" in str(caught.value)
    assert from_request(BenchRequest(ctx=8192, input_len=1024, output_len=64, api="chat")).api == "chat"


def test_chat_prompt_lengths_are_bounded_from_below_and_generate_ones_are_exact():
    assert bench_api.input_lens_ok("generate", [100, 100], 100, 0.05)[0]
    assert not bench_api.input_lens_ok("generate", [100, 104], 100, 0.05)[0]
    assert bench_api.input_lens_ok("chat", [104, 131], 100, 0.05)[0]  # the template's tokens on top
    ok, detail = bench_api.input_lens_ok("chat", [104, 60], 100, 0.05)
    assert not ok and "fewer than 95 tokens" in detail and "e.g. 60" in detail


def chat_record(run_id: str) -> dict:
    record = synthetic_record(run_id, {1: [100.0, 101.0, 99.0]})
    record["client"].update(api="chat", backend="sglang-oai-chat", tokenize_prompt=False)
    record["comparability_key"] = comparability_key(record)
    return record


def test_records_of_different_apis_are_not_compared_and_say_which_api():
    native = synthetic_record("lo-ctx4096-20260101T000000Z", {1: [100.0, 101.0, 99.0]})
    chat = chat_record("lo-ctx4096-20260101T000100Z")
    assert comparability_key(native)["api"] == "generate"  # records from before --api measured /generate
    result = compare(native, chat)
    assert not result.comparable and {"field": "api", "old": "generate", "new": "chat"} in result.differences
    text = format_comparison(result)
    assert "(API generate)" in text and "(API chat)" in text and "api: 'generate' -> 'chat'" in text
    with pytest.raises(ValueError, match="api cannot be ignored"):
        compare(native, chat, ignore=["api", "backend", "tokenize_prompt"])
    assert compare(chat, chat_record("lo-ctx4096-20260101T000200Z")).comparable


def test_the_record_schema_knows_the_api_and_records_show_prints_it(tmp_path):
    from tests.cli_support import invoke

    chat = chat_record("lo-ctx4096-20260101T000300Z")
    check(chat)
    with pytest.raises(RecordError, match="client.api is 'grpc'"):
        check({**chat, "client": {**chat["client"], "api": "grpc"}})
    publish_record(tmp_path / "results", chat)
    shown = invoke(["records", "show", chat["run_id"], "--results-repo", tmp_path / "results"])
    assert shown.exit_code == 0 and "API chat (client backend sglang-oai-chat)" in shown.output, shown.output
