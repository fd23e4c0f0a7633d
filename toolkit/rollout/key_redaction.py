"""Keep the servers' API keys out of what SGLang 0.5.23 logs and serves.

The units hand the key to SGLang in ``--config`` (a root-and-service-user file), out of argv. But
0.5.23 merges the config file into the argument list before it parses it (``server_args.py``
``prepare_server_args``), so the key comes back in ``launch_command`` (``/server_info``) and in the
``server_args=`` line every server logs (``engine.py`` ``_server_args_for_logging``). SGLang
redacts only the watermark secrets there, by two module-level names of
``sglang.srt.sampling.watermarking.core`` that it looks up at call time:
``WATERMARK_SECRET_FIELD_NAMES`` (the fields ``redact_watermark_secrets`` blanks) and
``redact_watermark_command_line`` (``prepare_server_args`` imports it when it runs). ``install``
adds ``api_key`` and ``admin_api_key`` to the first and wraps the second, so ``--api-key VALUE``,
``--api-key=VALUE`` and the admin key read ``<redacted>``. The plugin calls it in every SGLang
process before the arguments are parsed (``launch_server`` loads plugins first).

Standard library only at import; SGLang is imported inside ``install``.
"""

from __future__ import annotations

import importlib

CORE = "sglang.srt.sampling.watermarking.core"
FIELDS = frozenset({"api_key", "admin_api_key"})
OPTIONS = ("--api-key", "--admin-api-key")
REDACTED = "<redacted>"


def redact_argv(argv) -> list:
    """``argv`` with the value of every key option replaced by ``<redacted>``."""
    out, hide = [], False
    for arg in argv:
        arg = str(arg)
        if hide:
            out.append(REDACTED)
            hide = False
        elif arg in OPTIONS:
            out.append(arg)
            hide = True
        elif arg.startswith(tuple(f"{o}=" for o in OPTIONS)):
            out.append(f"{arg.split('=', 1)[0]}={REDACTED}")
        else:
            out.append(arg)
    return out


def install() -> bool:
    """Extend SGLang's redaction to the API keys; True once done (idempotent). Raises ImportError
    without SGLang, AttributeError when its redaction names moved (another SGLang version)."""
    core = importlib.import_module(CORE)
    current = core.redact_watermark_command_line
    if getattr(current, "_dsv4kit_redacts_keys", False):
        return True
    core.WATERMARK_SECRET_FIELD_NAMES = frozenset(core.WATERMARK_SECRET_FIELD_NAMES) | FIELDS

    def redact_command_line(argv, watermark_config=None):
        return current(redact_argv(argv), watermark_config)

    redact_command_line._dsv4kit_redacts_keys = True
    core.redact_watermark_command_line = redact_command_line
    return True
