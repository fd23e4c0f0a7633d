"""The ``gpu_throttle`` gate of a bench point: no GPU throttled (thermal, hardware slowdown or power
brake) and no Xid appeared during the point's window, from the point's GPU telemetry
(``dsv4kit.bench.box.telemetry``: the box's DCGM exporter, else ``nvidia-smi``)."""

from __future__ import annotations

from dsv4kit.bench.box.telemetry import throttle_findings

#: The DCGM exporter's port when the inventory sets none (the monitoring role's default).
DEFAULT_DCGM_PORT = 9400


def dcgm_port(host: dict) -> int:
    """The box's DCGM exporter port, or 0 where the inventory turns the monitoring role off."""
    if host.get("dsv4_monitoring") is False:
        return 0
    return int(host.get("monitoring_dcgm_exporter_port") or DEFAULT_DCGM_PORT)


def throttle_gate(telemetry: dict) -> dict:
    """``{"passed", "detail", "findings", "observed"}``. Without telemetry the gate passes with
    ``observed: false`` and says so: nothing was seen, not nothing happened."""
    if not telemetry.get("available"):
        return {"passed": True, "observed": False, "findings": [],
                "detail": f"not observed: no GPU telemetry ({telemetry.get('reason') or 'not collected'})"}
    findings = throttle_findings(telemetry)
    source = telemetry.get("source") or "nvidia-smi"
    if findings:
        return {"passed": False, "observed": True, "findings": findings,
                "detail": f"a GPU throttled or logged an Xid during the point ({source}): "
                          + "; ".join(f["detail"] for f in findings)}
    return {"passed": True, "observed": True, "findings": [],
            "detail": f"no thermal, slowdown or power-brake clock event and no Xid on "
                      f"{len(telemetry.get('per_gpu') or {})} GPUs ({source})"}


def apply_throttle_gate(validity: dict, telemetry: dict) -> dict:
    """Adds the gate to a point's ``validity`` (in place) and returns it."""
    gate = throttle_gate(telemetry)
    validity.setdefault("gates", {})["gpu_throttle"] = gate
    if not gate["passed"]:
        validity["passed"] = False
        validity.setdefault("failed", []).append("gpu_throttle")
    return validity


def _range(entries: list, field: str, unit: str) -> str:
    spreads = [e[field] for e in entries if isinstance(e.get(field), dict)]
    if not spreads:
        return f"{field} -"
    low, mid, high = (min(s["min"] for s in spreads), sorted(s["median"] for s in spreads)[len(spreads) // 2],
                      max(s["max"] for s in spreads))
    return f"{low:g}/{mid:g}/{high:g} {unit}"


def telemetry_line(telemetry: dict) -> str:
    """One line for ``records show`` and the eval report: the source, power, SM clock and
    temperature over all GPUs (min/median/max), and what throttled."""
    if not telemetry or not telemetry.get("available"):
        reason = (telemetry or {}).get("reason") or "not collected"
        return f"GPU telemetry: none ({reason})"
    entries = list((telemetry.get("per_gpu") or {}).values())
    findings = throttle_findings(telemetry)
    reasons = sorted({r for e in entries for r in e.get("event_reasons") or ()})
    tail = ("THROTTLED: " + "; ".join(f["detail"] for f in findings)) if findings else (
        "no throttle" + (f" (seen: {', '.join(reasons)})" if reasons else ""))
    return (f"GPU telemetry ({telemetry.get('source') or 'nvidia-smi'}, {len(entries)} GPUs, min/median/max): "
            f"power {_range(entries, 'power_w', 'W')}, SM clock {_range(entries, 'sm_clock_mhz', 'MHz')}, "
            f"temperature {_range(entries, 'temperature_c', 'C')}; {tail}")


def arm_telemetry(details: dict) -> dict:
    """An eval arm's ``gpu_telemetry`` for its record: the summary (the samples stay in the details
    file) and the ``gpu_throttle`` verdict. An arm is not invalidated by it; the report shows it."""
    telemetry = details.get("gpu_telemetry") or {"available": False, "reason": "not collected"}
    summary = {k: v for k, v in telemetry.items() if k != "samples"}
    summary["gpu_throttle"] = throttle_gate(telemetry)
    return summary
