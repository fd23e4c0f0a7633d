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


def test_a_whole_answer_is_paced_like_a_streamed_one(chat_server_factory):
    """A non-streamed request takes its decode steps too (SGLang answers it after the last one):
    64 tokens at 20 ms a step take at least 1.26 s, whole or streamed, and occupy a decode slot."""
    import threading
    import time

    paced = chat_server_factory("chat-paced", token_delay_ms=20)
    chat(paced, max_completion_tokens=1)  # SGLang's chat path imported: the time below is the answer's
    seen = []

    def watch(stop):
        while not stop.is_set():
            seen.append(read_metrics(paced.port)[0].get("num_running_reqs"))
            time.sleep(0.05)

    for stream in (False, True):
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
        watcher.start()
        started = time.monotonic()
        answer, moved = chat(paced, max_completion_tokens=64, ignore_eos=True, stream=stream)
        took = time.monotonic() - started
        stop.set()
        watcher.join(timeout=10)
        assert took >= 63 * 0.020 and 1 in seen, (stream, took, seen)
        assert moved["generation_tokens_total"] == 64, (stream, moved)
        seen.clear()


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
def test_bench_api_chat_runs_the_real_chat_client_valid_when_honest_invalid_when_usage_lies(
        bench_box, chat_model_dir):
    """``--api chat`` through ``sglang.benchmark.serving --backend sglang-oai-chat`` against the chat
    stand-in: rep 1 honest, valid under every gate, its prompt lengths chat's own usage.prompt_tokens
    and exactly the server's prompt_tokens_total; rep 2 the chat route's usage says one token more per
    request than it streamed, so the client's count and the server's counters disagree; rep 3 its
    usage has no prompt_tokens, so the client keeps its planned lengths and they fall short of the
    server's count by the template's tokens."""
    from tests.bench_support import in_process_sweep
    from tests.conftest import SERVED_MODEL

    server, inventory = bench_box(model=chat_model_dir, served_model_name=SERVED_MODEL,
                                  inventory_extra={"dsv4_served_model_name": SERVED_MODEL})
    faults = {"rep 2/3:": ["usage_overcount"], "rep 3/3:": ["usage_no_prompt_tokens"]}

    def reshape(line):
        for rep, planted in faults.items():
            if "prompts of" in line and rep in line:
                server.post("/_test/config", {"chat": {"faults": planted}})

    record, _ = in_process_sweep(inventory, reshape, concurrency=[4], repeat=3, num_prompts=8,
                                 warmup_requests=2, output_len=64, api="chat", progress_every_s=0.5)
    assert record["client"]["api"] == "chat" and record["client"]["backend"] == "sglang-oai-chat"
    assert record["comparability_key"]["api"] == "chat"
    honest, over, unreported = record["points"]
    argv = honest["argv"]
    assert argv[argv.index("--backend") + 1] == "sglang-oai-chat" and "--tokenize-prompt" not in argv
    assert argv[argv.index("--model") + 1] == SERVED_MODEL
    assert honest["validity"]["passed"], {k: v for k, v in honest["validity"]["gates"].items() if not v["passed"]}
    lens = honest["validity"]["gates"]["input_lens"]["detail"]
    assert "chat prompts" in lens and "exactly what the decode server's prompt_tokens_total counted" in lens, lens
    gate = over["validity"]["gates"]["conservation"]
    assert not over["validity"]["passed"] and not gate["passed"], over["validity"]
    assert "generation_tokens_total grew by 512, the client received 520 output tokens" in gate["detail"], gate
    gate = unreported["validity"]["gates"]["input_lens"]
    assert not unreported["validity"]["passed"] and not gate["passed"], unreported["validity"]
    assert "usage.prompt_tokens, as the client kept them, add up to 128" in gate["detail"], gate  # 8 x ISL 16
    assert "the chat answers carried no usage.prompt_tokens" in gate["detail"], gate
