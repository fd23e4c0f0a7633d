"""The ``api`` check against the stand-in server's chat route (tests/chat_standin.py: SGLang 0.5.23's
own DeepSeek-V4 chat encoding and output parser): the clean model passes, and each planted fault
fails with a message that names it."""

from __future__ import annotations

import json

import pytest

from dsv4kit.quality import api_check
from dsv4kit.quality.api_prompts import run_api
from tests.conftest import SERVED_MODEL, chat_faults

SPEC = {"model": SERVED_MODEL, "seeds": [3], "max_tokens": 4096}


@pytest.fixture(scope="module")
def chat_server(chat_server_factory):
    return chat_server_factory("chat", token_delay_ms=0)


def ask(server, faults=()) -> dict:
    chat_faults(server, faults)
    return run_api(f"http://127.0.0.1:{server.port}", SPEC, {"Content-Type": "application/json"}, 120)


def judge(*results) -> dict:
    return api_check.api_check({arm: {"checks": {"api": r}} for arm, r in zip("AB", results)}, [SERVED_MODEL])


@pytest.fixture(scope="module")
def clean(chat_server):
    return ask(chat_server)


def test_the_clean_model_passes_and_the_record_holds_the_raw_answers(clean):
    verdict = judge(clean)
    assert verdict["outcome"] == "pass", verdict["why"]
    assert verdict["per_arm"]["A"]["tool_right"] == verdict["per_arm"]["A"]["prompts"] == 7
    kinds = {item["kind"] for item in clean["items"]}
    assert kinds == {"one_tool", "choice", "parallel", "no_call", "nested", "plain"}
    nested = next(i for i in clean["items"] if i["kind"] == "nested")
    call = nested["whole"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "book_trip" and json.loads(call["arguments"])["travellers"][0]["age"] >= 30
    assert any('"tool_calls"' in line for line in nested["streamed"]["lines"])  # the raw stream is kept


@pytest.mark.parametrize("fault,named", [
    ("parsers_off", "content holds DSML tool-call markup"),
    ("malformed", "are not JSON"),
    ("bad_arguments", "break the tool's schema"),
    ("thinking_leak", "the thinking leaked into content"),
    ("stream_drop", "the streamed deltas do not add up to the whole answer"),
    ("json_body", "break the tool's schema"),
])
def test_each_planted_fault_fails_naming_it_and_the_prompt(chat_server, fault, named):
    verdict = judge(ask(chat_server, [fault]))
    assert verdict["outcome"] == "fail" and named in verdict["why"], verdict["why"]
    assert any(problem.split(":")[0].split("@")[0] in {"one_tool", "choice", "parallel", "nested", "no_call",
                                                       "plain_thinking", "plain_chat"}
               for problem in verdict["problems"]), verdict["problems"]


def test_a_served_name_missing_from_v1_models_fails(clean):
    verdict = api_check.api_check({"A": {"checks": {"api": clean}}}, ["/models/DeepSeek-V4-Flash"])
    assert verdict["outcome"] == "fail" and "/v1/models lists 'deepseek-ai/DeepSeek-V4-Flash', not the served name" \
        in verdict["why"]


def test_arms_are_paired_per_prompt(chat_server, clean):
    verdict = judge(clean, ask(chat_server, ["bad_arguments"]))
    assert verdict["outcome"] == "fail" and verdict["paired"] == 7
    assert set(verdict["lost"]) == {"one_tool@3", "choice@3", "parallel@3", "nested@3"} and not verdict["gained"]
    assert "arm B: one_tool@3" in verdict["why"]
    ask(chat_server)


def test_the_api_prompts_stay_under_the_indexer_threshold_as_the_docs_say(clean):
    """docs/quality.md: the api check is no evidence for the indexer flags, its prompts being under
    2,048 tokens. The prompt lengths the server reports (SGLang's DeepSeek-V4 encoding with the tools,
    in the stand-in's byte tokens): under 2 x 2,048 bytes, so under 2,048 tokens for a tokenizer that
    averages 2 bytes a token or more (the real one has no copy here to count with)."""
    from pathlib import Path

    from dsv4kit.quality.checks import Thresholds

    longest = max(item["whole"]["body"]["usage"]["prompt_tokens"] for item in clean["items"])
    assert 0 < longest < 2 * Thresholds().indexer_threshold_tokens and Thresholds().indexer_threshold_tokens == 2048
    text = (Path(__file__).resolve().parents[2] / "docs/quality.md").read_text()
    assert "Not `api` either: its prompts are under 2,048 tokens" in text and "under 4,096 bytes" in text
