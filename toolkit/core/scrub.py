"""Remove secrets from anything that goes into a bench record or is printed.

SGLang's ``/server_info`` carries the resolved ``api_key`` and ``admin_api_key`` (only
``launch_command`` is redacted), and environments carry tokens. ``scrub`` walks nested dicts and
lists and replaces the value of every secret-looking key, every value that follows a secret
option in an argv list (``--api-key X``), and inside strings: ``--api-key X`` / ``--api-key=X``
(also right after another option, as in ``--skip-tokenizer-init --api-key X``), ``NAME=value``
assignments of secret names (``NGC_KEY=...`` in a unit line), and credentials in URLs
(``https://user:PASS@host``, ``https://TOKEN@host``, ``?token=...&X-Amz-Signature=...``).
Keys such as ``max_total_num_tokens`` are not secrets: a name is secret when one of its
``_``/``-`` separated words is key-like (``api_key``, a final ``token`` or ``key`` as in
``NGC_KEY``/``S3_KEY``, ``secret``, ``password``, ``signature``...).
"""

from __future__ import annotations

import re
from typing import Any

SCRUBBED = "[SCRUBBED]"

_SECRET_WORDS = {"secret", "secrets", "password", "passwd", "passphrase", "authorization",
                 "credential", "credentials", "apikey", "cookie", "signature", "sig"}
#: A final word "key" makes a name secret (NGC_KEY, S3_KEY) unless the words before it say otherwise.
_BENIGN_KEY_PREFIXES = {"comparability", "public", "sort", "cache", "primary", "partition", "routing", "foreign",
                        "lookup", "watermark", "host", "dict", "group", "kv", "rope", "hash"}
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"), ("auth", "key")}
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.-]*)(=|\s+)(\"[^\"]*\"|'[^']*'|\S+)")
_ASSIGNMENT = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_.-]*)(=)(\"[^\"]*\"|'[^']*'|[^\s&\"']+)")
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^/\s@:]+)(:[^/\s@]*)?@")
_URL_PARAM = re.compile(r"([?&;])([^=&\s#]+)=([^&\s#\"']*)")


def is_secret_name(name: str) -> bool:
    """True for names like api_key, admin_api_key, HF_TOKEN, OPENAI_API_KEY, db-password."""
    words = [w for w in re.split(r"[_\-\s.]+", str(name).lower()) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    if words and words[-1] == "token":
        return True
    if words and words[-1] in ("key", "keys") and len(words) > 1 and not (set(words[:-1]) & _BENIGN_KEY_PREFIXES):
        return True
    return any((a, b) in _SECRET_PAIRS for a, b in zip(words, words[1:]))


def _is_secret_option(arg: str) -> bool:
    return arg.startswith("-") and is_secret_name(arg.lstrip("-").split("=", 1)[0])


def _scrub_pairs(text: str, pattern: re.Pattern, strip: str) -> str:
    """Replace the value of every ``name<sep>value`` match whose name is secret. A match whose name
    is not secret consumes only its name, so its "value" can still be the next name
    (``--flag --api-key X``, ``Environment=NGC_KEY=X``)."""
    out = []
    pos = 0
    while True:
        match = pattern.search(text, pos)
        if match is None:
            out.append(text[pos:])
            return "".join(out)
        name, sep, value = match.group(1), match.group(2), match.group(3)
        if is_secret_name(name.lstrip(strip)) and value not in ("[REDACTED]", SCRUBBED, ""):
            out.append(text[pos:match.start()] + f"{name}{sep}{SCRUBBED}")
            pos = match.end()
        else:
            out.append(text[pos:match.start(2)])
            pos = match.start(2)


def scrub_text(text: str) -> str:
    """Secrets inside a string: secret options and their values, secret ``NAME=value``
    assignments, URL credentials and secret URL query parameters (see the module doc)."""
    text = _scrub_pairs(text, _OPTION, "-")
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{SCRUBBED}@", text)
    text = _URL_PARAM.sub(lambda m: f"{m.group(1)}{m.group(2)}={SCRUBBED}" if is_secret_name(m.group(2))
                          and m.group(3) else m.group(0), text)
    return _scrub_pairs(text, _ASSIGNMENT, "")


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
