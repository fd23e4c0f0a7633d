"""The ``gpu_throttle`` gate of a bench point: no GPU throttled (thermal, hardware slowdown or power
brake) and no Xid appeared during the point's window, from the point's GPU telemetry
(``dsv4kit.serving.box.telemetry``: the box's DCGM exporter, else ``nvidia-smi``)."""

from __future__ import annotations

from dsv4kit.serving.box.telemetry import throttle_findings

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


def arm_telemetry(details: dict) -> dict:
    """An eval arm's ``gpu_telemetry`` for its record: the summary (the samples stay in the details
    file) and the ``gpu_throttle`` verdict. An arm is not invalidated by it; the report shows it."""
    telemetry = details.get("gpu_telemetry") or {"available": False, "reason": "not collected"}
    summary = {k: v for k, v in telemetry.items() if k != "samples"}
    summary["gpu_throttle"] = throttle_gate(telemetry)
    return summary
