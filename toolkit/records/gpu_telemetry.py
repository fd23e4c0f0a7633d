"""One line of a record's GPU telemetry for ``records show`` and the eval report: the source,
power, SM clock and temperature over all GPUs (min/median/max), and what throttled, as the
``gpu_throttle`` verdict recorded it (``dsv4kit.bench.gpu_throttle``)."""

from __future__ import annotations

from typing import Optional


def _range(entries: list, field: str, unit: str) -> str:
    spreads = [e[field] for e in entries if isinstance(e.get(field), dict)]
    if not spreads:
        return "-"
    low, mid, high = (min(s["min"] for s in spreads), sorted(s["median"] for s in spreads)[len(spreads) // 2],
                      max(s["max"] for s in spreads))
    return f"{low:g}/{mid:g}/{high:g} {unit}"


def telemetry_line(telemetry: Optional[dict], gate: Optional[dict]) -> str:
    """``telemetry``: a point's or arm's ``gpu_telemetry``; ``gate``: its ``gpu_throttle`` verdict.
    Power, clock and temperature are the first source's; the clock events seen are every source's."""
    if not telemetry or not telemetry.get("available"):
        reason = (telemetry or {}).get("reason") or "not collected"
        return f"GPU telemetry: none ({reason})"
    entries = list((telemetry.get("per_gpu") or {}).values())
    findings = (gate or {}).get("findings") or []
    reasons = sorted({r for source in (telemetry.get("sources") or {"": telemetry}).values()
                      for e in (source.get("per_gpu") or {}).values() for r in e.get("event_reasons") or ()})
    tail = ("THROTTLED: " + "; ".join(f["detail"] + (f" [{f['source']}]" if f.get("source") else "")
                                      for f in findings)) if findings else (
        "no throttle" + (f" (seen: {', '.join(reasons)})" if reasons else ""))
    sets = telemetry.get("gpu_sets") or {}
    if sets and not sets.get("agree", True):
        tail += f"; {sets['detail']}"
    return (f"GPU telemetry ({telemetry.get('source') or 'nvidia-smi'}, {len(entries)} GPUs, min/median/max): "
            f"power {_range(entries, 'power_w', 'W')}, SM clock {_range(entries, 'sm_clock_mhz', 'MHz')}, "
            f"temperature {_range(entries, 'temperature_c', 'C')}; {tail}")
