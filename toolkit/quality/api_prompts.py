"""The ``api`` check's box side: seeded tool-use prompts asked through ``/v1/chat/completions``.

Standard library only: copied to the box beside ``box_eval.py``, which calls :func:`run_api`
against the router on 127.0.0.1 as clients reach it. Every prompt is asked twice at temperature 0
with the same seed, once whole and once streamed; the raw answers (the streamed one as its SSE
``data:`` lines) go into the result for ``dsv4kit.quality.api_check`` to judge. The prompts:

* ``one_tool``: one tool offered, one call wanted;
* ``choice``: several tools offered, the one the question needs wanted;
* ``parallel``: one tool, two calls wanted in one answer;
* ``no_call``: tools offered, a question no tool helps with (a plain answer wanted);
* ``nested``: a tool whose arguments hold an array of objects and an object;
* ``plain``: no tools, to check reasoning on and off.

Thinking is asked per request (``chat_template_kwargs.thinking``), on for some prompts, off for the
others, so both shapes are judged.
"""

from __future__ import annotations

import json
import random
import urllib.error

try:  # on the box: the bench's box-side package, beside box_eval.py (dsv4kit.serving.remote.Remote.setup)
    from dsv4box.http import open_request
except ImportError:  # on the control machine
    from dsv4kit.serving.box.http import open_request

CITIES = ("Paris", "Rome", "Tokyo", "Lima", "Oslo", "Cairo", "Seoul", "Quito", "Dakar", "Hanoi")
NAMES = ("Ada", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
CONVERT = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount of money between currencies.",
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
        "required": ["amount", "from", "to"], "additionalProperties": False}}}
BOOK = {"type": "function", "function": {
    "name": "book_trip", "description": "Book a trip for a group of travellers.",
    "parameters": {"type": "object", "properties": {
        "destination": {"type": "string"},
        "travellers": {"type": "array", "minItems": 1, "items": {
            "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
            "required": ["name", "age"], "additionalProperties": False}},
        "dates": {"type": "object", "properties": {"start": {"type": "string"}, "nights": {"type": "integer",
                                                                                             "minimum": 1}},
                  "required": ["start", "nights"], "additionalProperties": False}},
        "required": ["destination", "travellers", "dates"], "additionalProperties": False}}}


def api_prompts(seed: int) -> list[dict]:
    """The prompt set of ``seed``: each ``{"id", "kind", "thinking", "messages", "tools",
    "expect_calls"}`` (``expect_calls``: the function names a right answer calls, in order)."""
    rng = random.Random(seed)
    a, b, c = rng.sample(CITIES, 3)
    x, y = rng.randint(11, 99), rng.randint(11, 99)
    travellers = rng.sample(NAMES, 2)
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    prompts = [
        {"id": "one_tool", "thinking": True, "tools": [WEATHER], "expect_calls": ["get_weather"],
         "messages": user(f"What is the weather in {a} right now?")},
        {"id": "choice", "thinking": False, "tools": [WEATHER, TIME, CONVERT], "expect_calls": ["get_time"],
         "messages": user(f"What time is it in {b}?")},
        {"id": "parallel", "thinking": True, "tools": [WEATHER], "expect_calls": ["get_weather", "get_weather"],
         "messages": user(f"What is the weather in {a} and in {c}?")},
        {"id": "no_call", "thinking": False, "tools": [WEATHER, TIME], "expect_calls": [],
         "messages": user(f"What is {x} plus {y}?")},
        {"id": "nested", "thinking": True, "tools": [BOOK, WEATHER], "expect_calls": ["book_trip"],
         "messages": user(f"Book a trip to {c} for {travellers[0]} (age 3{x % 10}) and {travellers[1]} "
                          f"(age 4{y % 10}), starting 2027-0{1 + x % 9}-1{y % 10}, for {2 + x % 5} nights.")},
        {"id": "plain_thinking", "thinking": True, "tools": [], "expect_calls": [],
         "messages": user(f"What is {y} plus {x}?")},
        {"id": "plain_chat", "thinking": False, "tools": [], "expect_calls": [],
         "messages": user(f"What is {x} times 2?")},
    ]
    for prompt in prompts:
        prompt["kind"] = prompt["id"].split("_")[0] if prompt["id"].startswith("plain") else prompt["id"]
    return prompts


def request_body(prompt: dict, spec: dict, stream: bool) -> dict:
    body = {"model": spec["model"], "messages": prompt["messages"], "temperature": 0.0, "seed": spec["seed"],
            "max_tokens": spec["max_tokens"], "stream": stream,
            "chat_template_kwargs": {"thinking": prompt["thinking"]}}
    if prompt["tools"]:
        body["tools"] = prompt["tools"]
    return body


def _request(url: str, path: str, body, headers: dict, timeout: float):
    return open_request(url, path, body, timeout, sent_headers=headers)


def _ask(url: str, body: dict, headers: dict, timeout: float) -> dict:
    """One request: ``{"status", "body"}`` (JSON when it parses) or ``{"status", "lines"}`` streamed."""
    try:
        with _request(url, "/v1/chat/completions", body, headers, timeout) as response:
            if body.get("stream"):
                lines = [raw.decode("utf-8", "replace").rstrip("\r\n") for raw in response]
                return {"status": response.status, "lines": [line for line in lines if line]}
            raw = response.read().decode("utf-8", "replace")
            status = response.status
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "error": exc.read()[:2000].decode("utf-8", "replace")}
    except (urllib.error.URLError, OSError) as exc:
        return {"status": None, "error": str(getattr(exc, "reason", exc))}
    try:
        return {"status": status, "body": json.loads(raw)}
    except ValueError:
        return {"status": status, "error": f"not JSON: {raw[:2000]}"}


def run_api(url: str, spec: dict, headers: dict, timeout: float, progress=None) -> dict:
    """Ask every prompt whole and streamed; ``/v1/models`` once. Raw answers only (no judging)."""
    out = {"served_model": spec["model"], "seeds": spec["seeds"], "items": []}
    try:
        with _request(url, "/v1/models", None, headers, timeout) as response:
            out["models"] = {"status": response.status, "body": json.loads(response.read())}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        out["models"] = {"status": getattr(exc, "code", None), "error": str(getattr(exc, "reason", exc))}
    prompts = [(seed, prompt) for seed in spec["seeds"] for prompt in api_prompts(seed)]
    for done, (seed, prompt) in enumerate(prompts):
        if progress:
            progress(done, len(prompts))
        item = {key: prompt[key] for key in ("kind", "thinking", "expect_calls")}
        item["id"] = f"{prompt['id']}@{seed}"
        item["tools"] = [tool["function"] for tool in prompt["tools"]]
        asked = {**spec, "seed": seed}
        item["request"] = request_body(prompt, asked, False)
        item["whole"] = _ask(url, request_body(prompt, asked, False), headers, timeout)
        item["streamed"] = _ask(url, request_body(prompt, asked, True), headers, timeout)
        out["items"].append(item)
    if progress:
        progress(len(prompts), len(prompts))
    return out
