"""Limits the inventory sets on a run, checked before any connection (docs/cli.md, *Checks before work*).

Each function raises ``Abort(USAGE)`` naming the flag, the value given, the limit, and the
inventory variable (with the file that sets it) that holds the limit. A limit the inventory does
not set is not checked here; the box's own answer decides then.
"""

from __future__ import annotations

from typing import Iterable

from dsv4kit.core import exitcodes
from dsv4kit.core.exitcodes import Abort


def _where(host, name: str) -> str:
    origin = getattr(host, "origin", None)
    return f"{name} of host {host.name!r} in {origin(name) if origin else host.source}"


def _span(gpus) -> str:
    gpus = sorted(gpus)
    if gpus and gpus == list(range(gpus[0], gpus[-1] + 1)) and len(gpus) > 2:
        return f"{gpus[0]}-{gpus[-1]}"
    return ", ".join(map(str, gpus))


def check_gpu(host, gpu: int, flag: str = "--gpu") -> None:
    """``gpu`` must be one of the host's GPUs: 0 .. dsv4_gpu_count - 1."""
    count = host.get("dsv4_gpu_count")
    if count is None or 0 <= gpu < count:
        return
    layout = []
    for role in ("prefill", "decode"):
        gpus = host.get(f"dsv4_{role}_gpus")
        if gpus:
            layout.append(f"{role} {_span(gpus)}")
    raise Abort(exitcodes.USAGE,
                f"{flag} {gpu}: host {host.name!r} has {count} GPU(s), 0-{count - 1}"
                + (f" ({', '.join(layout)})" if layout else "")
                + f" ({_where(host, 'dsv4_gpu_count')}); nothing was run")


def check_concurrency(host, points: Iterable[int], flag: str = "--concurrency/-c") -> None:
    """No point may ask for more requests at once than the servers run (dsv4_max_running_requests)."""
    limit = host.get("dsv4_max_running_requests")
    if limit is None:
        return
    over = [c for c in points if c > limit]
    if over:
        raise Abort(exitcodes.USAGE,
                    f"{flag} {', '.join(map(str, over))} exceeds the servers' max_running_requests {limit} "
                    f"({_where(host, 'dsv4_max_running_requests')}): they never run more requests at once, so "
                    f"such a point cannot be measured (it would fail the max_running gate); give points up to "
                    f"{limit}, or raise dsv4_max_running_requests and provision again; nothing was run")


def check_context(host, ctx: int, flag: str = "--ctx") -> None:
    """``ctx`` may not exceed the model's maximum context (dsv4_model_max_context_length)."""
    limit = host.get("dsv4_model_max_context_length")
    if limit is None or ctx <= limit:
        return
    raise Abort(exitcodes.USAGE,
                f"{flag} {ctx} exceeds the model's maximum context length {limit} "
                f"({_where(host, 'dsv4_model_max_context_length')}); SGLang refuses a longer "
                f"--context-length for it; nothing was run")
