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
The request's ``max_completion_tokens`` (or ``max_tokens``) cuts the answer (``finish_reason``
``length``); ``ignore_eos`` (SGLang's extra body field) drops the stop token and the model writes on
(``FILLER``) to exactly that many tokens; ``usage`` is in every whole answer and, streamed, in a last
``choices: []`` chunk only with ``stream_options.include_usage``; ``return_cached_tokens_details``
adds ``sglext``. The stand-in server runs each request (``ChatRun``), streamed or whole, through the
queue, decode pacing and counters of a streamed ``/generate``: a whole answer comes only after its
last decode step. Its tool calls use DSML parameter tags, ``string="true"`` for strings and ``string="false"`` with a
JSON value for the rest. Faults (``POST /_test/config {"chat": {"faults": [...]}}``):

* ``parsers_off``: the server runs without the two parsers (raw DSML and thinking in ``content``);
* ``malformed``: the tool-call block is cut off before its closing tags;
* ``bad_arguments``: arguments that break the tool's schema (a number for a string, an age in words);
* ``thinking_leak``: the thinking is written again into the answer, after ``</think>``;
* ``stream_drop``: the stream leaves out one chunk, so its deltas do not add up to the whole answer;
* ``json_body``: the invoke's arguments as one JSON object instead of parameter tags (the V3.2-era
  form SGLang's text detector reads; 0.5.23's DeepSeek-V4 chat path returns them as ``{}``);
* ``usage_overcount``: ``usage.completion_tokens`` says one token more than the answer has (a first
  token counted twice), while the server's counters count what was generated;
* ``usage_no_prompt_tokens``: ``usage`` leaves ``prompt_tokens`` out (the client then keeps its planned
  prompt lengths), while the server's counters count the rendered prompt.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
import uuid
from types import SimpleNamespace
from typing import Optional

SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜System｜>",
            "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>", "<｜deepseek_image｜>")
EOS = "<｜end▁of▁sentence｜>"
FAULTS = ("parsers_off", "malformed", "bad_arguments", "thinking_leak", "stream_drop", "json_body",
          "usage_overcount", "usage_no_prompt_tokens")


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
#: What the model writes after its answer when ``ignore_eos`` keeps it going (SGLang's extra body
#: field): plain ASCII, one byte token a character, so any byte-level tokenizer counts it the same.
FILLER = " and so on"


class ChatStandIn:
    def __init__(self, served_name: str):
        self.served_name = served_name
        self.faults: list = []

    def configure(self, body: dict) -> None:
        unknown = set(body.get("faults") or []) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown chat faults {sorted(unknown)}")
        self.faults = list(body.get("faults") or [])

    def run(self, body: dict, cached: int = 0) -> "ChatRun":
        """One request as the server runs it (ValueError or pydantic's error: SGLang's 400)."""
        return ChatRun(self, body, cached)


class ChatRun:
    """One ``/v1/chat/completions`` request: its prompt ids, the ids the model generates (with
    ``max_tokens``/``max_completion_tokens`` and ``ignore_eos`` as SGLang 0.5.23 applies them), and
    the answer, whole (:meth:`whole`) or streamed one decode step at a time (:meth:`opening`,
    :meth:`step`, :meth:`closing`), with ``usage`` as ``serving_chat`` writes it: always in the whole
    answer, in a last ``choices: []`` chunk of a stream only with ``stream_options.include_usage``."""

    def __init__(self, standin: ChatStandIn, body: dict, cached: int = 0):
        _sglang_on_path()
        from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

        request = ChatCompletionRequest(**body)
        self.faults = list(standin.faults)
        self.parsers = "parsers_off" not in self.faults
        encoder = adapter(self.parsers)
        tools = [t.model_dump() for t in request.tools] if request.tools and request.tool_choice != "none" else None
        self.prompt_ids = encoder.encode_messages(
            messages=[m.model_dump() for m in request.messages], request=request, tools=tools,
            thinking=bool((request.chat_template_kwargs or {}).get("thinking", False)), image_data=[])
        tok = encoder.deepseek_recipe.tokenizer
        prompt = byte_tokenizer().decode(self.prompt_ids, skip_special_tokens=False)
        output = tok.encode(model_text(prompt, self.faults))
        limit = request.max_completion_tokens or request.max_tokens
        eos = tok.encode(EOS)[0]
        finish = {"type": "stop", "matched": eos}
        if request.ignore_eos:  # SGLang drops the stop tokens: the model writes on to the limit
            if not limit:
                raise ValueError("the stand-in needs max_completion_tokens (or max_tokens) with ignore_eos")
            output = output[:-1]
            filler = tok.encode(FILLER)
            while len(output) < limit:
                output += filler
        if limit is not None and (len(output) > limit or request.ignore_eos):
            output, finish = output[:limit], {"type": "length", "length": limit}
        self.request, self.encoder, self.output, self.finish = request, encoder, output, finish
        self.cached = min(cached, len(self.prompt_ids))
        self.rid, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        options = request.stream_options
        self.include_usage = bool(options and options.include_usage)
        # The text path (parsers off) leaves out the matched stop token.
        self.text_ids = output[:-1] if (finish["type"] == "stop" and not self.parsers) else output
        self._sent = 0
        self._parser_dict, self._has_calls = {}, {}
        self._dropped = False

    def usage(self) -> dict:
        completion = len(self.output) + (1 if "usage_overcount" in self.faults else 0)
        usage = {"prompt_tokens": len(self.prompt_ids), "completion_tokens": completion,
                 "total_tokens": len(self.prompt_ids) + completion}
        if "usage_no_prompt_tokens" in self.faults:
            del usage["prompt_tokens"]
        return usage

    def _sglext(self) -> Optional[dict]:
        if not self.request.return_cached_tokens_details:
            return None
        return {"cached_tokens_details": {"device": self.cached, "host": 0}}

    def whole(self) -> dict:
        request, finish = self.request, self.finish
        if self.parsers:
            reasoning, content, calls, finish = self.encoder.parse_chat_response(
                request=request, output_ids=self.output, finish_reason=finish)
            calls = [c.model_dump() for c in calls] if calls else None
        else:  # SGLang's text path: the matched stop cut, the special tokens kept (tools were given)
            reasoning, content, calls = None, byte_tokenizer().decode(self.text_ids, skip_special_tokens=False), None
        message = {"role": "assistant", "content": content or None, "reasoning_content": reasoning,
                   "tool_calls": calls}
        answer = {"id": self.rid, "object": "chat.completion", "created": self.created, "model": request.model,
                  "choices": [{"index": 0, "message": message, "logprobs": None,
                               "finish_reason": finish["type"], "matched_stop": finish.get("matched")}],
                  "usage": self.usage()}
        if self._sglext():
            answer["sglext"] = self._sglext()
        return answer

    def _chunk(self, delta: Optional[dict], reason=None, **top) -> str:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        return json.dumps({"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.request.model, "choices": choices, **top})

    def opening(self) -> list:
        return [self._chunk({"role": "assistant", "content": ""})]

    def step(self, n: int) -> list:
        """The SSE payloads once the model has generated its first ``n`` ids."""
        last = n >= len(self.output)
        if self.parsers:
            content = {"output_ids": self.output[:n], "meta_info": {
                "id": self.rid, "completion_tokens": n, "finish_reason": self.finish if last else None}}
            out = [line[len("data: "):].strip() for line in self.encoder.stream_chat_chunks(
                content=content, index=0, request=self.request, created=self.created, parser_dict=self._parser_dict,
                has_tool_calls=self._has_calls, choice_logprobs=None,
                finish_reason_type=self.finish["type"] if last else None, usage=None)]
        else:
            ids, tok = self.text_ids, byte_tokenizer()
            upto = min(n, len(ids))
            text = tok.decode(ids[:upto], skip_special_tokens=False)[
                len(tok.decode(ids[:self._sent], skip_special_tokens=False)):]
            self._sent = upto
            out = [self._chunk({"content": text})] if text else []
        if out and "stream_drop" in self.faults and not self._dropped and n >= len(self.output) // 2:
            self._dropped = True  # the fault: one step's deltas never reach the client
            return []
        return out

    def closing(self) -> list:
        """The finish chunk, the ``sglext`` and ``usage`` chunks when asked for, then ``[DONE]``."""
        reason = "tool_calls" if self._has_calls.get(0) and self.finish["type"] == "stop" else self.finish["type"]
        out = [self._chunk({}, reason)]
        if self._sglext():
            out.append(self._chunk(None, sglext=self._sglext()))
        if self.include_usage:
            out.append(self._chunk(None, usage=self.usage()))
        return out + ["[DONE]"]


def send_error(handler, exc: Exception) -> None:
    """SGLang answers a chat request it cannot take with 400 and its message."""
    data = json.dumps({"object": "error", "message": f"{type(exc).__name__}: {exc}", "code": 400}).encode()
    handler.send_response(400)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
