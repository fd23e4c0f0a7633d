"""The ``gpu_throttle`` gate of a bench point: no GPU throttled (thermal, hardware slowdown or power
brake) and no Xid appeared during the point's window, by every source of the point's GPU telemetry
(``dsv4kit.serving.box.telemetry``: the box's DCGM exporter and ``nvidia-smi``). A point no source
observed is invalid."""

from __future__ import annotations

from dsv4kit.serving.box.telemetry import throttle_findings

#: The DCGM exporter's port when the inventory sets none (the monitoring role's default).
DEFAULT_DCGM_PORT = 9400


def dcgm_port(host: dict) -> int:
    """The box's DCGM exporter port, or 0 where the inventory turns the monitoring role off."""
    if host.get("dsv4_monitoring") is False:
        return 0
    return int(host.get("monitoring_dcgm_exporter_port") or DEFAULT_DCGM_PORT)


def telemetry_sources(telemetry: dict) -> dict:
    """source -> its result: the window's ``sources``, or (a record written before there were two)
    the telemetry itself as its one source."""
    if telemetry.get("sources"):
        return telemetry["sources"]
    return {telemetry.get("source") or "nvidia-smi": telemetry} if telemetry.get("available") else {}


def throttle_gate(telemetry: dict) -> dict:
    """``{"passed", "detail", "findings", "observed", "sources"}``. It fails when any source saw an
    invalidating clock event, a thermal-violation rise or an Xid (each finding names its source),
    and when no source answered: nothing seen is no evidence that nothing happened, so the point
    is invalid and the detail says which source did not answer, why, and what to install. Where
    both sources answered and saw different GPUs, the detail says so (``gpu_sets``)."""
    sources = telemetry_sources(telemetry)
    if not sources:
        return {"passed": False, "observed": False, "findings": [], "sources": [],
                "detail": "not observed: " + (telemetry.get("reason") or "no GPU telemetry was collected")}
    findings = [f for name, result in sources.items() for f in throttle_findings(result, result.get("source") or name)]
    names = " and ".join(sources)
    sets = telemetry.get("gpu_sets") or {}
    disagree = "" if sets.get("agree", True) else f"; {sets['detail']}"
    gate = {"observed": True, "findings": findings, "sources": list(sources),
            **({"gpu_sets": sets} if sets else {})}
    if findings:
        return {**gate, "passed": False,
                "detail": f"a GPU throttled or logged an Xid during the point ({names}): "
                          + "; ".join(f"{f['detail']} [{f['source']}]" for f in findings) + disagree}
    count = len(set().union(*(set(r.get("per_gpu") or {}) for r in sources.values())))
    return {**gate, "passed": True,
            "detail": f"no thermal, slowdown or power-brake clock event and no Xid on {count} GPUs ({names})" + disagree}


def apply_throttle_gate(validity: dict, telemetry: dict) -> dict:
    """Adds the gate to a point's ``validity`` (in place) and returns it."""
    gate = throttle_gate(telemetry)
    validity.setdefault("gates", {})["gpu_throttle"] = gate
    if not gate["passed"]:
        validity["passed"] = False
        validity.setdefault("failed", []).append("gpu_throttle")
    return validity


def arm_telemetry(details: dict) -> dict:
    """An eval arm's ``gpu_telemetry`` for its record: the summary (the samples stay in the details
    file) and the ``gpu_throttle`` verdict. An arm is not invalidated by it; the report shows it."""
    telemetry = details.get("gpu_telemetry") or {"available": False, "reason": "not collected"}
    summary = {k: v for k, v in telemetry.items() if k != "samples"}
    summary["gpu_throttle"] = throttle_gate(telemetry)
    return summary
