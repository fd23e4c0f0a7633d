"""Which API a sweep measures (``dsv4kit bench --api``): SGLang's native ``/generate`` (the default)
or the OpenAI chat route users call, ``/v1/chat/completions``.

Both are driven by the same real client (``sglang.benchmark.serving``), under the same headline
rules (docs/benchmarking.md, "Through the chat API"). What differs is how the client is driven and
what its line holds:

``generate``  ``--backend sglang --tokenize-prompt``: the prompt goes as token ids, so the server's
              prompt is exactly ISL tokens; the client's output count is ``meta_info.completion_tokens``.
``chat``      ``--backend sglang-oai-chat``: the prompt goes as text in one user message, named by the
              served model name; the server renders it with the model's chat encoding and re-encodes
              the text, so its prompt is ISL plus the template's tokens, give or take re-encoding
              (``--tokenize-prompt`` is the native backend's only). ``stream_options.include_usage``
              is asked for, so the client's per-request output and prompt counts are the server's
              ``usage`` (without it the client keeps the planned lengths, which prove nothing).
              ``ignore_eos`` is the client's default on both routes: every answer is OSL tokens.
"""

from __future__ import annotations

import json
from typing import Optional

from dsv4kit.core import exitcodes

APIS = ("generate", "chat")
DEFAULT = "generate"
#: The client's ``--backend`` per API.
BACKENDS = {"generate": "sglang", "chat": "sglang-oai-chat"}
#: The chat requests' extra body: the server's usage in the stream's last chunk.
CHAT_EXTRA_BODY = {"stream_options": {"include_usage": True}}


def check(api: str) -> str:
    """``api`` when it is one of ``APIS``, else Abort(USAGE) naming the choices."""
    if api not in APIS:
        raise exitcodes.Abort(exitcodes.USAGE, f"--api must be one of {', '.join(APIS)}, got {api!r}")
    return api


def client_flags(api: str, *, model_path: str, served_name: Optional[str]) -> list:
    """The client options that depend on the API: backend, model name, tokenizer, prompt form."""
    if api == "chat":
        return ["--backend", BACKENDS[api], "--model", served_name or model_path, "--tokenizer", model_path,
                "--extra-request-body", json.dumps(CHAT_EXTRA_BODY, separators=(",", ":"))]
    return ["--backend", BACKENDS[api], "--model", model_path, "--tokenizer", model_path, "--tokenize-prompt"]


def input_lens_ok(api: str, input_lens: list, input_len: int, tolerance: float) -> tuple:
    """(passed, detail) of the server-reported prompt lengths against ISL. ``generate``: exactly ISL.
    ``chat``: no prompt shorter than ISL by more than ``tolerance`` (the retokenization tolerance): the
    template adds tokens and re-encoding the text may merge a few; a shorter one was cut."""
    if api != "chat":
        off = [x for x in input_lens if x != input_len]
        return not off, (f"{len(off)} request(s) with prompt length != {input_len} (e.g. {off[0]})" if off
                         else f"all prompts {input_len} tokens")
    floor = input_len * (1 - tolerance)
    short = [x for x in input_lens if x < floor]
    if short:
        return False, (f"{len(short)} chat request(s) with a prompt of fewer than {floor:g} tokens (ISL {input_len} "
                       f"less {tolerance:g}; e.g. {short[0]}): the server did not read the whole prompt")
    return True, (f"all chat prompts {min(input_lens, default=0)} to {max(input_lens, default=0)} tokens as the "
                  f"server rendered them (ISL {input_len} plus the chat template)")
