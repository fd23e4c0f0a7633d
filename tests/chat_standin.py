"""``/v1/chat/completions`` of the stand-in SGLang server, through SGLang 0.5.23's own chat path.

What a DeepSeek-V4 server started with ``--tool-call-parser deepseekv4 --reasoning-parser
deepseek-v4`` does with a chat request is SGLang's ``DeepSeekRecipeChatEncodingAdapter``
(``srt/entrypoints/openai/serving_deepseek_recipe.py``, from the cached wheel): it renders the
request into prompt ids with the ``deepseek-recipe`` encoding, and parses the generated ids into
``reasoning_content``, ``content`` and ``tool_calls`` (``parse_chat_response``; streamed:
``stream_chat_chunks``). Both are used here as they are; only the tokenizer (a byte-level one with
DeepSeek-V4's special tokens, built in memory) and the model are stood in for. With the parsers
off (the ``parsers_off`` fault) the answer is the raw text, as SGLang's plain text path returns it.

The model reads its rendered prompt: thinking is on when the prompt ends in ``<think>``; it calls
only tools the prompt lists; it understands the question shapes of
``dsv4kit.quality.api_prompts`` (weather, time, a trip, a sum) and answers anything else plainly.
Its tool calls use DSML parameter tags, ``string="true"`` for strings and ``string="false"`` with a
JSON value for the rest. Faults (``POST /_test/config {"chat": {"faults": [...]}}``):

* ``parsers_off``: the server runs without the two parsers (raw DSML and thinking in ``content``);
* ``malformed``: the tool-call block is cut off before its closing tags;
* ``bad_arguments``: arguments that break the tool's schema (a number for a string, an age in words);
* ``thinking_leak``: the thinking is written again into the answer, after ``</think>``;
* ``stream_drop``: the stream leaves out one chunk, so its deltas do not add up to the whole answer;
* ``json_body``: the invoke's arguments as one JSON object instead of parameter tags (the V3.2-era
  form SGLang's text detector reads; 0.5.23's DeepSeek-V4 chat path returns them as ``{}``).
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
import uuid
from types import SimpleNamespace

SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜System｜>",
            "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>", "<｜deepseek_image｜>")
EOS = "<｜end▁of▁sentence｜>"
FAULTS = ("parsers_off", "malformed", "bad_arguments", "thinking_leak", "stream_drop", "json_body")


def _sglang_on_path() -> None:
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.append(root)
    try:
        import sglang  # noqa: F401
    except ImportError:
        from tests.sglang_wheel import sglang_site

        sys.path.insert(0, str(sglang_site()))
    from tests import standins  # torchvision, which SGLang's config package imports

    standins.install(("torchvision",))


@functools.lru_cache(maxsize=1)
def byte_tokenizer():
    """A lossless byte-level tokenizer with DeepSeek-V4's special tokens as single ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


@functools.lru_cache(maxsize=2)
def adapter(parsers: bool):
    """SGLang's DeepSeek-V4 chat adapter as ``serving_chat`` builds it (hooks as its own methods)."""
    _sglang_on_path()
    import sglang.srt.entrypoints.openai.serving_deepseek_recipe as recipe_serving
    from sglang.srt.entrypoints.openai.chat_encoding_adapters import ChatOutputHooks

    # serving_chat publishes the server's settings; SGLang's default is non-incremental output ids.
    recipe_serving.get_serving = lambda: SimpleNamespace(incremental_streaming_output=False)
    hooks = ChatOutputHooks(
        thinking_requested=lambda r: bool((r.chat_template_kwargs or {}).get("thinking", False)),
        tool_call_parsing_active=lambda r: parsers and bool(r.tools) and r.tool_choice != "none",
        history_tool_calls_count=lambda r: 0,
        tool_call_id=lambda item, history: f"call_{uuid.uuid4().hex[:24]}")
    return recipe_serving.DeepSeekRecipeChatEncodingAdapter(
        chat_encoding_spec="dsv4", tokenizer=SimpleNamespace(backend_tokenizer=byte_tokenizer()),
        reasoning_parser="deepseek-v4" if parsers else None, tool_call_parser="deepseekv4" if parsers else None,
        chat_hooks=hooks, default_chat_template_kwargs=None)


# ------------------------------------------------------------------------------------ the model
def _calls_for(question: str, offered: set) -> list:
    found = re.search(r"weather in (\w+) and in (\w+)", question)
    if found and "get_weather" in offered:
        return [("get_weather", {"city": found[1]}), ("get_weather", {"city": found[2]})]
    found = re.search(r"weather in (\w+)", question)
    if found and "get_weather" in offered:
        return [("get_weather", {"city": found[1], "unit": "celsius"})]
    found = re.search(r"time is it in (\w+)", question)
    if found and "get_time" in offered:
        return [("get_time", {"city": found[1]})]
    found = re.search(r"trip to (\w+) for (\w+) \(age (\d+)\) and (\w+) \(age (\d+)\), starting ([\d-]+), "
                      r"for (\d+) nights", question)
    if found and "book_trip" in offered:
        return [("book_trip", {"destination": found[1],
                               "travellers": [{"name": found[2], "age": int(found[3])},
                                              {"name": found[4], "age": int(found[5])}],
                               "dates": {"start": found[6], "nights": int(found[7])}})]
    return []


def _answer_for(question: str) -> str:
    found = re.search(r"What is (\d+) (plus|times) (\d+)", question)
    if found:
        a, b = int(found[1]), int(found[3])
        return f"{a} {found[2]} {b} is {a + b if found[2] == 'plus' else a * b}."
    return "I can help with that."


def _invoke(name: str, args: dict, faults) -> str:
    if "bad_arguments" in faults:
        args = {k: (42 if isinstance(v, str) else v) for k, v in args.items()}
        if "travellers" in args:
            args["travellers"] = [{**t, "age": "thirty"} for t in args["travellers"]]
    if "json_body" in faults:
        body = json.dumps(args) + "\n"
    else:
        body = "".join(f'<｜DSML｜parameter name="{k}" string="true">{v}</｜DSML｜parameter>\n' if isinstance(v, str)
                       else f'<｜DSML｜parameter name="{k}" string="false">{json.dumps(v)}</｜DSML｜parameter>\n'
                       for k, v in args.items())
    return f'<｜DSML｜invoke name="{name}">\n{body}</｜DSML｜invoke>\n'


def model_text(prompt: str, faults=()) -> str:
    """What the stand-in model generates after ``prompt`` (the rendered text), EOS included."""
    thinking = prompt.endswith("<think>")
    question = prompt.rsplit("<｜User｜>", 1)[-1].split("<｜Assistant｜>", 1)[0]
    offered = set(re.findall(r'\{"name": "([^"]+)"', prompt.split("<｜User｜>", 1)[0]))
    calls = _calls_for(question, offered)
    plan = ("call " + " and ".join(name for name, _ in calls)) if calls else "answer directly"
    reasoning = f"The user asks: {question.strip()} I should {plan}."
    text = f"{reasoning}</think>" if thinking else ""
    if "thinking_leak" in faults:
        text += f"<think>{reasoning}</think>\n"
    if calls:
        block = "<｜DSML｜tool_calls>\n" + "".join(_invoke(n, a, faults) for n, a in calls) + "</｜DSML｜tool_calls>"
        if "malformed" in faults:
            block = block[:block.rindex("</｜DSML｜invoke>")]
        text += "\n\n" + block
    else:
        text += _answer_for(question)
    return text + EOS


# ------------------------------------------------------------------------------------ the route
class ChatStandIn:
    def __init__(self, served_name: str):
        self.served_name = served_name
        self.faults: list = []

    def configure(self, body: dict) -> None:
        unknown = set(body.get("faults") or []) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown chat faults {sorted(unknown)}")
        self.faults = list(body.get("faults") or [])

    def _generate(self, body: dict):
        _sglang_on_path()
        from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

        request = ChatCompletionRequest(**body)
        parsers = "parsers_off" not in self.faults
        encoder = adapter(parsers)
        tools = [t.model_dump() for t in request.tools] if request.tools and request.tool_choice != "none" else None
        prompt_ids = encoder.encode_messages(messages=[m.model_dump() for m in request.messages], request=request,
                                             tools=tools, thinking=bool((request.chat_template_kwargs or {})
                                                                        .get("thinking", False)), image_data=[])
        tok = encoder.deepseek_recipe.tokenizer
        prompt = byte_tokenizer().decode(prompt_ids, skip_special_tokens=False)
        output = tok.encode(model_text(prompt, self.faults))
        limit = request.max_completion_tokens or request.max_tokens
        eos = tok.encode(EOS)[0]
        finish = {"type": "stop", "matched": eos}
        if limit is not None and len(output) > limit:
            output, finish = output[:limit], {"type": "length", "length": limit}
        return request, encoder, prompt_ids, output, finish, parsers

    def complete(self, body: dict) -> dict:
        request, encoder, prompt_ids, output, finish, parsers = self._generate(body)
        if parsers:
            reasoning, content, calls, finish = encoder.parse_chat_response(request=request, output_ids=output,
                                                                            finish_reason=finish)
            calls = [c.model_dump() for c in calls] if calls else None
        else:  # SGLang's text path: the matched stop cut, the special tokens kept (tools were given)
            ids = output[:-1] if finish["type"] == "stop" else output
            reasoning, content, calls = None, byte_tokenizer().decode(ids, skip_special_tokens=False), None
        message = {"role": "assistant", "content": content or None, "reasoning_content": reasoning,
                   "tool_calls": calls}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": request.model, "choices": [{"index": 0, "message": message, "logprobs": None,
                                                     "finish_reason": finish["type"],
                                                     "matched_stop": finish.get("matched")}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(output),
                          "total_tokens": len(prompt_ids) + len(output)}}

    def stream(self, body: dict) -> list:
        """The SSE ``data:`` payloads, one decode step (token) at a time, then ``[DONE]``."""
        request, encoder, _, output, finish, parsers = self._generate(body)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta: dict, reason=None) -> str:
            return json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created,
                               "model": request.model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                                    "finish_reason": reason}]})

        out = [chunk({"role": "assistant", "content": ""})]
        parser_dict, has_calls = {}, {}
        ids = output[:-1] if (finish["type"] == "stop" and not parsers) else output
        for n in range(1, len(ids) + 1):
            last = n == len(ids)
            if parsers:
                content = {"output_ids": ids[:n], "meta_info": {"id": rid, "completion_tokens": n,
                                                                "finish_reason": finish if last else None}}
                out += [line[len("data: "):].strip() for line in encoder.stream_chat_chunks(
                    content=content, index=0, request=request, created=created, parser_dict=parser_dict,
                    has_tool_calls=has_calls, choice_logprobs=None,
                    finish_reason_type=finish["type"] if last else None, usage=None)]
            else:
                text = byte_tokenizer().decode(ids[:n], skip_special_tokens=False)[
                    len(byte_tokenizer().decode(ids[:n - 1], skip_special_tokens=False)):]
                if text:
                    out.append(chunk({"content": text}))
        reason = "tool_calls" if has_calls.get(0) and finish["type"] == "stop" else finish["type"]
        out.append(chunk({}, reason))
        if "stream_drop" in self.faults and len(out) > 3:
            del out[len(out) // 2]
        return out + ["[DONE]"]


def respond(handler, standin: ChatStandIn, body: dict) -> None:
    """Answer one ``POST /v1/chat/completions`` on ``handler`` (an HTTP/1.1 BaseHTTPRequestHandler)."""
    try:
        if body.get("stream"):
            payloads = standin.stream(body)
        else:
            answer = json.dumps(standin.complete(body)).encode()
    except Exception as exc:  # SGLang answers a request it cannot take with 400 and its message
        data = json.dumps({"object": "error", "message": f"{type(exc).__name__}: {exc}", "code": 400}).encode()
        handler.send_response(400)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        return
    if not body.get("stream"):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(answer)))
        handler.end_headers()
        handler.wfile.write(answer)
        return
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for payload in payloads:
        data = f"data: {payload}\n\n".encode()
        handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()
