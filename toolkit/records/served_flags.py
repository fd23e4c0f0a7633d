"""The kernel flags the serving processes really ran with, for the bench record and its comparability key.

The inventory's ``dsv4_kernel_flags`` may say ``auto`` (resolved per host at provision time), so
it cannot tell two records apart. What counts is each server's own environment: the probe's
``/proc/<pid>/environ`` of the decode (and, in a PD layout, prefill) ``sglang.launch_server``,
else its ``dsv4-<role>.service`` unit and environment files (only while no restart is pending and
no environment file is newer than the running server: otherwise the files may hold flags it never
read). Values are read the way
SGLang reads booleans (``rollout_targets.read_flag``): ``"1"`` on, ``"0"`` off or unset.

When a server's flags cannot be read, ``kernel_flags`` is null with ``kernel_flags_reason``, and
the comparability key holds ``unknown: <reason>``, which never matches anything (not even
another unknown): ``dsv4kit.records.compare`` refuses a verdict unless ``--ignore kernel_flags``.
"""

from __future__ import annotations

from typing import Optional

from dsv4kit.rollout.targets import FLAGS, read_flag

UNKNOWN = "unknown"
#: /proc/stat's boot time is whole seconds, so a process start time may read up to ~1 s early.
START_SLACK_S = 2.0


def decode_process(processes: list[dict], decode_port) -> Optional[dict]:
    """The decode server among the serving processes: ``sglang.launch_server`` with ``--port`` equal to
    ``dsv4_decode_port`` (its lowest PID: the parent of its own workers), else None."""
    if decode_port is None:
        return None
    port = str(decode_port)
    for proc in sorted(processes, key=lambda p: p.get("pid") or 0):
        argv = [str(a) for a in proc.get("argv") or []]
        if not any("launch_server" in a for a in argv):
            continue
        if any((a == "--port" and argv[i + 1:i + 2] == [port]) or a == f"--port={port}"
               for i, a in enumerate(argv)):
            return proc
    return None


def is_unknown(value) -> bool:
    return isinstance(value, str) and value.startswith(UNKNOWN)


def flag_names(configured: Optional[dict]) -> list[str]:
    """The kernel flags of dsv4kit plus any other the inventory names, sorted."""
    return sorted(set(FLAGS) | set((configured or {}).keys()))


def normalise(env: dict, names: list[str]) -> dict:
    """{FLAG: "1"/"0"} as SGLang reads ``env`` (unset is "0"); a non-boolean keeps its text."""
    out = {}
    for name in names:
        flag = read_flag(name, env)
        out[name] = f"invalid {flag.raw!r}" if flag.error else ("1" if flag.enabled else "0")
    return out


def _process_on(processes: list[dict], port) -> Optional[dict]:

    return decode_process(processes, port)


def changed_since(unit: dict, proc: Optional[dict]) -> list[str]:
    """The unit's environment files written after the (unreadable) process started."""
    started = (proc or {}).get("started_at")
    if not isinstance(started, (int, float)):
        return []
    return [path for path, mtime in (unit.get("env_file_mtimes") or {}).items()
            if isinstance(mtime, (int, float)) and mtime > started + START_SLACK_S]


def server_flags(role: str, port, processes: list[dict], units: dict, restart_pending: Optional[bool],
                 names: list[str]) -> dict:
    """{"flags": {...} or None, "source": text or None, "reason": text or None} for one server."""
    proc = _process_on(processes, port)
    reasons = []
    if proc is not None and proc.get("env") is not None:
        return {"flags": normalise(proc["env"], names), "reason": None,
                "source": f"/proc/{proc.get('pid')}/environ of the {role} server (--port {port})"}
    if proc is not None:
        reasons.append(proc.get("env_reason") or f"the {role} server's environment is unreadable")
    else:
        reasons.append(f"no sglang.launch_server with --port {port} ({role}) seen in /proc")
    unit = units.get(f"dsv4-{role}")
    if unit is None:
        reasons.append(f"no dsv4-{role}.service unit")
    elif unit.get("error"):
        reasons.append(f"dsv4-{role}.service unreadable: {unit['error']}")
    elif unit.get("missing_required_env_files"):
        reasons.append(f"dsv4-{role}.service environment file(s) missing: "
                       f"{', '.join(unit['missing_required_env_files'])}")
    elif changed_since(unit, proc):
        reasons.append(f"{', '.join(changed_since(unit, proc))} changed after the {role} server started, "
                       "so the running server may not have its values")
    elif restart_pending:
        reasons.append("a restart of the serving units is pending, so the unit's environment files may hold "
                       "flags the running server has not picked up")
    else:
        return {"flags": normalise(unit.get("env") or {}, names), "reason": None,
                "source": f"unit {unit.get('path')} and its environment files"
                          + (f" ({reasons[0]})" if reasons else "")}
    return {"flags": None, "source": None, "reason": "; ".join(reasons)}


def software_fields(host, probe: dict) -> dict:
    """The record's ``software.kernel_*`` fields (see docs/benchmarking.md)."""
    configured = host.get("dsv4_kernel_flags")
    names = flag_names(configured)
    processes = probe.get("processes") or []
    units = probe.get("units") or {}
    decode_port = host.get("dsv4_decode_port")
    prefill_port = host.get("dsv4_prefill_port")
    roles = {"decode": decode_port}
    if prefill_port and str(prefill_port) != str(decode_port):
        roles["prefill"] = prefill_port
    servers = {role: server_flags(role, port, processes, units, probe.get("restart_pending"), names)
               for role, port in roles.items()}
    unknown = {role: s["reason"] for role, s in servers.items() if s["flags"] is None}
    values = [s["flags"] for s in servers.values() if s["flags"] is not None]
    if unknown:
        flags, reason = None, "; ".join(f"{role}: {why}" for role, why in unknown.items())
    elif any(v != values[0] for v in values):
        flags, reason = None, "the servers ran with different kernel flags (see kernel_flags_servers)"
    else:
        flags, reason = values[0], None
    return {
        "kernel_flags": flags,
        "kernel_flags_reason": reason,
        "kernel_flags_servers": servers,
        "kernel_flags_configured": configured,
        "kernel_decision": decision_section(probe.get("kernel_decision"), flags),
    }


def decision_section(found: Optional[dict], ran: Optional[dict]) -> dict:
    """Which report decided the flags (the kernel_rollout role's decision file), and whether the
    servers ran with what it decided."""
    if not found:
        return {"path": None, "report": None, "flags": None, "reason": "the probe did not look for a decision file"}
    if found.get("data") is None:
        return {"path": found.get("path"), "report": None, "flags": None, "reason": found.get("reason")}
    data = found["data"] if isinstance(found["data"], dict) else {}
    decided = {}
    for name, entry in (data.get("flags") or {}).items():
        entry = entry if isinstance(entry, dict) else {"value": str(entry), "source": data.get("source", "inventory")}
        decided[name] = {k: entry.get(k) for k in ("value", "source", "report", "why") if k in entry}
    report = data.get("report")
    report = {k: report.get(k) for k in ("name", "sha256", "measured_on", "gpu_index", "started_utc")} \
        if isinstance(report, dict) else None
    warnings = []
    for name, entry in decided.items():
        value = normalise({name: str(entry.get("value"))}, [name])[name]
        if ran is not None and name in ran and ran[name] != value:
            warnings.append(f"{name} was decided {entry.get('value')!r} ({entry.get('source')}) but the servers "
                            f"ran with {ran[name]!r}")
    return {"path": found.get("path"), "report": report, "flags": decided, "warnings": warnings}


def key_value(record: dict) -> str:
    """The comparability key's ``kernel_flags``: ``FLAG=V,...`` the servers ran with, or ``unknown: why``.

    Records written before these fields existed fall back to ``software.server_env`` (the decode
    server's environment); an A/B record over a kernel flag names both arms' values."""
    software = record.get("software") or {}
    if "kernel_flags_servers" in software:
        flags, reason = software.get("kernel_flags"), software.get("kernel_flags_reason")
    elif isinstance(software.get("server_env"), dict):
        flags = normalise(software["server_env"], flag_names(None))
        reason = None
    else:
        flags, reason = None, "the record does not say which kernel flags the servers ran with"
    if not isinstance(flags, dict):
        return f"{UNKNOWN}: {reason or 'not recorded'}"
    flags = dict(flags)
    ab = record.get("ab") or {}
    if ab.get("kind") == "env" and ab.get("key") in flags:
        values = ab.get("values") or {}
        flags[ab["key"]] = "A/B " + "|".join(str(values.get(arm)) for arm in sorted(values))
    return ",".join(f"{name}={flags[name]}" for name in sorted(flags))
