"""Restarts keep what the units run now: every ``auto`` the playbook cannot resolve is pinned first.

``dsv4kit provision`` resolves ``auto`` kernel flags and ``dsv4_fp4_indexer: auto``; the playbook
refuses a literal ``auto``. So before ``bench`` or ``eval`` restarts the serving units (an A/B arm,
another context length), ``pin_running`` replaces each ``auto`` in the host's variables by the value
the units run now, read on the box (the bench probe): the restart then changes only what it means
to change. Shared by ``dsv4kit.bench``, ``dsv4kit.quality`` and ``dsv4kit.profile``.
"""

from __future__ import annotations

from typing import Optional

from dsv4kit.core import exitcodes
from dsv4kit.serving.abort import ServingAbort

FP4_SETTING = "dsv4_fp4_indexer"
FP4_SERVER_FLAG = "--enable-deepseek-v4-fp4-indexer"


def _is_auto(value) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def has_auto(host, *, keep: Optional[str] = None) -> bool:
    """Whether the host holds an ``auto`` (a kernel flag or the FP4 setting, other than ``keep``)
    that ``pin_running`` would pin."""
    flags = dict(host.get("dsv4_kernel_flags") or {})
    return (any(_is_auto(v) for k, v in flags.items() if k != keep)
            or (keep != FP4_SETTING and _is_auto(host.get(FP4_SETTING))))


def running_fp4(host, probe: dict) -> tuple[Optional[bool], str]:
    """(whether both servers run with the FP4 cache, where that was read), or (None, why not)."""
    from dsv4kit.records.served_flags import decode_process

    ports = {"decode": host.get("dsv4_decode_port"), "prefill": host.get("dsv4_prefill_port")}
    seen, why = {}, []
    for role, port in ports.items():
        if not port:
            continue
        proc = decode_process(probe.get("processes") or [], port)
        unit = (probe.get("units") or {}).get(f"dsv4-{role}") or {}
        if proc is not None:
            seen[role] = FP4_SERVER_FLAG in [str(a) for a in proc.get("argv") or []]
        elif unit.get("exec_start") and not probe.get("restart_pending"):
            seen[role] = FP4_SERVER_FLAG in str(unit["exec_start"])
        else:
            why.append(f"no running {role} server (--port {port}) and no unit to read it from"
                       + (" (a restart is pending)" if probe.get("restart_pending") else ""))
    if why or not seen:
        return None, "; ".join(why) or "no serving port in the inventory"
    if len(set(seen.values())) != 1:
        return None, f"the servers differ ({', '.join(f'{r}: {v}' for r, v in seen.items())})"
    return next(iter(seen.values())), "the running servers' command lines"


def pin_running(host, probe: dict, served: int, *, keep: Optional[str] = None) -> None:
    """Pin the host's ``auto`` kernel flags and FP4 setting (in ``host.vars``) to what the units run now.

    ``keep``: the A/B key the arms set themselves (left as is). ServingAbort(ENVIRONMENT) when an
    ``auto`` FP4 setting cannot be read from the box: a restart would not know what to render.
    """
    from dsv4kit.records.provenance import sections

    configured = dict(host.get("dsv4_kernel_flags") or {})
    pins = {}
    if any(_is_auto(v) for k, v in configured.items() if k != keep):
        running = (sections(host=host, probe=probe, server_info={}, context_length=served, restarted=False)
                   .get("software") or {}).get("kernel_flags") or {}
        pins["dsv4_kernel_flags"] = {k: str(running.get(k, "0")) if _is_auto(v) and k != keep else v
                                     for k, v in configured.items()}
    if keep != FP4_SETTING and _is_auto(host.get(FP4_SETTING)):
        value, source = running_fp4(host, probe)
        if value is None:
            raise ServingAbort(exitcodes.ENVIRONMENT,
                               f"{FP4_SETTING} is 'auto' and what the units run cannot be read ({source}), so a "
                               f"restart would not know whether to keep the FP4 cache: run `dsv4kit provision` "
                               f"first, or set {FP4_SETTING} to true or false in the inventory")
        pins[FP4_SETTING] = value
    if pins:
        host.vars = {**host.vars, **pins}


def pinned_settings(host) -> dict:
    """The extra vars a restart passes for the settings (``dsv4_fp4_indexer``) the host holds as
    booleans: an inventory value, or one ``pin_running`` pinned (an ``auto`` left is not passed:
    the playbook then stops, naming ``dsv4kit provision``)."""
    value = host.get(FP4_SETTING)
    return {FP4_SETTING: value} if isinstance(value, bool) else {}
