"""Remove secrets from anything that goes into a bench record or is printed.

SGLang's ``/server_info`` carries the resolved ``api_key`` and ``admin_api_key`` (only
``launch_command`` is redacted), and environments carry tokens. ``scrub`` walks nested dicts and
lists and replaces the value of every secret-looking key, every value that follows a secret
option in an argv list (``--api-key X``), and ``--api-key X`` / ``--api-key=X`` inside strings.
Keys such as ``max_total_num_tokens`` are not secrets: a name is secret when one of its
``_``/``-`` separated words is key-like (``api_key``, a final ``token``, ``secret``,
``password``...).
"""

from __future__ import annotations

import re
from typing import Any

SCRUBBED = "[SCRUBBED]"

_SECRET_WORDS = {"secret", "secrets", "password", "passwd", "passphrase", "authorization",
                 "credential", "credentials", "apikey", "cookie"}
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"), ("auth", "key")}
_SECRET_OPTION = re.compile(
    r"(--?[A-Za-z0-9_-]*(?:api[-_]?key|token|secret|password|passwd)[A-Za-z0-9_-]*)(=|\s+)(\"[^\"]*\"|'[^']*'|\S+)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """True for names like api_key, admin_api_key, HF_TOKEN, OPENAI_API_KEY, db-password."""
    words = [w for w in re.split(r"[_\-\s.]+", str(name).lower()) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    if words and words[-1] == "token":
        return True
    return any((a, b) in _SECRET_PAIRS for a, b in zip(words, words[1:]))


def _is_secret_option(arg: str) -> bool:
    return arg.startswith("-") and is_secret_name(arg.lstrip("-").split("=", 1)[0])


def scrub_text(text: str) -> str:
    """``--api-key X`` and ``--api-key=X`` (and other secret options) inside a string."""

    def repl(match: re.Match) -> str:
        if not is_secret_name(match.group(1).lstrip("-")) or match.group(3) == "[REDACTED]":
            return match.group(0)
        return f"{match.group(1)}{match.group(2)}{SCRUBBED}"

    return _SECRET_OPTION.sub(repl, text)


def scrub(value: Any) -> Any:
    """A deep copy of ``value`` with secrets replaced by ``[SCRUBBED]`` (see the module doc)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if is_secret_name(key) and item not in (None, "", False):
                out[key] = SCRUBBED
            else:
                out[key] = scrub(item)
        return out
    if isinstance(value, (list, tuple)):
        out_list = []
        hide_next = False
        for item in value:
            if hide_next:
                out_list.append(SCRUBBED)
                hide_next = False
                continue
            if isinstance(item, str) and _is_secret_option(item):
                if "=" in item:
                    out_list.append(item.split("=", 1)[0] + "=" + SCRUBBED)
                else:
                    out_list.append(item)
                    hide_next = True
                continue
            out_list.append(scrub(item))
        return out_list
    if isinstance(value, str):
        return scrub_text(value)
    return value


def find_secrets(value: Any, secrets: list[str]) -> list[str]:
    """Which of ``secrets`` (literal values) still occur anywhere in ``value`` (for checks)."""
    import json

    text = json.dumps(value, default=str)
    return [s for s in secrets if s and s in text]
