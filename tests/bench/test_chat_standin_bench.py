"""The chat stand-in is honest for a bench: ``max_completion_tokens``/``max_tokens``, ``ignore_eos`` and
``stream_options.include_usage`` as SGLang 0.5.23's ``serving_chat`` applies them, and its tokens in the
server's counters the way a streamed ``/generate``'s are (tests/chat_standin.py, tests/fake_sglang_server.py)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from dsv4kit.serving.box.metrics import read_metrics
from tests.chat_standin import EOS, byte_tokenizer

QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]


@pytest.fixture(scope="module")
def server(chat_server_factory):
    return chat_server_factory("chat-bench", token_delay_ms=1)


def chat(server, **body) -> tuple:
    """(the whole answer or the stream's payloads, the /metrics counters it moved)."""
    before, _, _ = read_metrics(server.port)
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/chat/completions",
                                     data=json.dumps({"model": "m", "messages": QUESTION, **body}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read().decode()
    after, _, _ = read_metrics(server.port)
    moved = {k: after[k] - before.get(k, 0) for k in ("generation_tokens_total", "decode_tokens_total",
                                                      "num_requests_total", "requests_started_total",
                                                      "prompt_tokens_total")}
    if not body.get("stream"):
        return json.loads(raw), moved
    return [line[len("data: "):] for line in raw.split("\n") if line.startswith("data: ")], moved


def test_a_plain_answer_stops_at_eos_and_counts_eos_as_a_completion_token(server):
    answer, moved = chat(server, max_completion_tokens=200)
    text = answer["choices"][0]["message"]["content"]
    assert text == "2 plus 3 is 5." and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == len(text) + 1  # byte tokens and the EOS
    assert moved["generation_tokens_total"] == answer["usage"]["completion_tokens"]
    assert moved["decode_tokens_total"] == answer["usage"]["completion_tokens"] - 1  # the first from prefill
    assert moved["prompt_tokens_total"] == answer["usage"]["prompt_tokens"]
    assert moved["num_requests_total"] == moved["requests_started_total"] == 1


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_the_token_limit_cuts_the_answer(server, field):
    answer, moved = chat(server, **{field: 5})
    assert answer["choices"][0]["message"]["content"] == "2 plu"
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 5
    assert moved["generation_tokens_total"] == 5


def test_ignore_eos_runs_to_exactly_max_tokens_streamed_with_usage_and_counters(server):
    payloads, moved = chat(server, max_completion_tokens=64, ignore_eos=True, stream=True,
                           stream_options={"include_usage": True})
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    assert len(byte_tokenizer().encode(text).ids) == 64 and text.startswith("2 plus 3 is 5.")
    assert EOS not in text
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == ["length"]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 64
    assert moved["generation_tokens_total"] == 64 and moved["decode_tokens_total"] == 63
    assert moved["prompt_tokens_total"] == usage["usage"]["prompt_tokens"]


def test_a_stream_carries_usage_only_when_asked_and_cached_details_in_sglext(server):
    payloads, _ = chat(server, max_completion_tokens=8, ignore_eos=True, stream=True)
    assert not any('"usage"' in p for p in payloads)
    payloads, _ = chat(server, max_completion_tokens=8, stream=True, return_cached_tokens_details=True)
    sglext = [json.loads(p)["sglext"] for p in payloads[:-1] if '"sglext"' in p]
    assert sglext == [{"cached_tokens_details": {"device": 0, "host": 0}}]


def test_ignore_eos_without_a_limit_is_refused_with_400(server):
    with pytest.raises(urllib.error.HTTPError) as caught:
        chat(server, ignore_eos=True)
    assert caught.value.code == 400 and "ignore_eos" in caught.value.read().decode()


# --------------------------------------------------------------- bench --api chat through the real client
@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A model directory whose tokenizer is the chat stand-in's (byte-level, DeepSeek-V4's special
    tokens): the client and the server read text with one tokenizer, as on a real box."""
    import subprocess
    import sys
    from pathlib import Path

    directory = tmp_path_factory.mktemp("chat-model") / "DeepSeek-V4-Flash-test"
    script = ("import sys; from transformers import PreTrainedTokenizerFast; from tests.chat_standin import byte_tokenizer; "
              "PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(), clean_up_tokenization_spaces=False)"
              ".save_pretrained(sys.argv[1])")  # in a child: transformers stays out of this process
    subprocess.run([sys.executable, "-c", script, str(directory)], check=True, timeout=300,
                   cwd=Path(__file__).resolve().parents[2])
    (directory / "config.json").write_text(json.dumps({"model_type": "dsv4kit-test", "vocab_size": 270}))
    return directory


@pytest.mark.slow
def test_bench_api_chat_runs_the_real_chat_client_valid_when_honest_invalid_when_usage_overcounts(
        tmp_path, loopback_ssh, bench_venv, chat_model_dir, chat_server_factory, box_dcgm, monkeypatch):
    """``--api chat`` through ``sglang.benchmark.serving --backend sglang-oai-chat`` against the chat
    stand-in: rep 1 honest, valid under every gate; rep 2 the chat route's usage says one token more
    per request than it streamed, so the client's count and the server's counters disagree."""
    from tests.bench_support import in_process_sweep
    from tests.bench_support import FakeServer, bench_inventory
    from tests.conftest import SERVED_MODEL

    monkeypatch.setenv("DSV4KIT_SPILL_DIR", str(tmp_path / "spill"))
    server = FakeServer(tmp_path / "server", chat_model_dir, served_model_name=SERVED_MODEL).start()
    try:
        inventory = bench_inventory(tmp_path / "inv", loopback_ssh, venv=bench_venv, model_path=chat_model_dir,
                                    port=server.port, context_length=4096, dsv4_served_model_name=SERVED_MODEL,
                                    monitoring_dcgm_exporter_port=box_dcgm.port)

        def reshape(line):
            if "prompts of" in line and "rep 2/2:" in line:
                server.post("/_test/config", {"chat": {"faults": ["usage_overcount"]}})

        record, _ = in_process_sweep(inventory, reshape, concurrency=[4], repeat=2, num_prompts=8,
                                     warmup_requests=2, output_len=64, api="chat", progress_every_s=0.5)
    finally:
        server.stop()
    assert record["client"]["api"] == "chat" and record["client"]["backend"] == "sglang-oai-chat"
    assert record["comparability_key"]["api"] == "chat"
    honest, over = record["points"]
    argv = honest["argv"]
    assert argv[argv.index("--backend") + 1] == "sglang-oai-chat" and "--tokenize-prompt" not in argv
    assert argv[argv.index("--model") + 1] == SERVED_MODEL
    assert honest["validity"]["passed"], {k: v for k, v in honest["validity"]["gates"].items() if not v["passed"]}
    assert "chat prompts" in honest["validity"]["gates"]["input_lens"]["detail"]
    gate = over["validity"]["gates"]["conservation"]
    assert not over["validity"]["passed"] and not gate["passed"], over["validity"]
    assert "generation_tokens_total grew by 512, the client received 520 output tokens" in gate["detail"], gate
