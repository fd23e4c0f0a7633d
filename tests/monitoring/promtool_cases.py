"""`promtool test rules` cases for playbooks/roles/monitoring/files/dsv4kit-alerts.yml: for each
alert, input series that fire it and series that keep it quiet (series notation: promtool's)."""

from __future__ import annotations

SERVER = {"job": "sglang", "box": "box1", "role": "decode", "instance": "127.0.0.1:30002",
          "model_name": "dsv4", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
WHERE = {"box": "box1", "role": "decode", "instance": "127.0.0.1:30002"}


def gpu(index: int) -> dict:
    """The labels DCGM exporter 4.8.2 writes on a GPU field, plus the scrape config's."""
    return {"job": "dcgm", "box": "box1", "role": "dcgm", "instance": "127.0.0.1:9400", "gpu": str(index),
            "UUID": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd", "pci_bus_id": f"00000000:0{index}:00.0",
            "device": f"nvidia{index}", "modelName": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "Hostname": "box1", "DCGM_FI_DRIVER_VERSION": "580.95.05"}


def series(name: str, labels: dict, values: str) -> dict:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def alert(labels: dict, summary: str, severity: str) -> dict:
    return {"exp_labels": {**labels, "severity": severity}, "exp_annotations": {"summary": summary}}


def _server_case(name, counter, summary, severity="critical"):
    """A PD/KV counter alert: it fires on the first event (a new series) and on a rise; it is
    quiet for a counter that stays flat, including one that counted long ago."""
    fire_new = [series(counter, SERVER, "_x5 1x10")]
    fire_rise = [series(counter, SERVER, "2x5 3x20")]
    quiet_old = [series(counter, SERVER, "2x40")]
    expected = [alert(WHERE, summary, severity)]
    return name, [
        (fire_new, "8m", expected), (fire_rise, "8m", expected),
        (quiet_old, "30m", []), ([series("sglang:num_running_reqs", SERVER, "1x20")], "10m", []),
    ]


def _gpu_pair(name, field, fire_values, quiet_values, eval_time, summary, severity):
    where = {k: v for k, v in gpu(3).items()}
    return name, [([series(field, gpu(3), fire_values)], eval_time, [alert(where, summary, severity)]),
                  ([series(field, gpu(3), quiet_values)], eval_time, [])]


def _events(clock_event) -> dict:
    """DCGM_EXP_CLOCK_EVENTS_COUNT's labels: the exporter's label value, or none (no event in its window)."""
    return {**gpu(3), "window_size_in_ms": "300000", **({"clock_event": clock_event} if clock_event else {})}


def _ttft(fire: bool) -> list:
    # Buckets le=1 s, 4 s, +Inf: every request over 4 s (p99 interpolates to 4 s) or all under 1 s.
    fast = "0+0x40" if fire else "0+10x40"
    labels = {**SERVER, "is_streaming": "true"}
    return [series("sglang:time_to_first_token_seconds_bucket", {**labels, "le": "1.0"}, fast),
            series("sglang:time_to_first_token_seconds_bucket", {**labels, "le": "4.0"}, fast),
            series("sglang:time_to_first_token_seconds_bucket", {**labels, "le": "+Inf"}, "0+10x40"),
            series("dsv4:ttft_p99_slo_seconds", {}, "2x40")]


def _spec(length: str, running: str) -> list:
    return [series("sglang:spec_accept_length", SERVER, f"{length}x40"),
            series("sglang:num_running_reqs", SERVER, f"{running}x40"),
            series("dsv4:spec_accept_length_floor", {}, "2.4x40")]


def _gpus(present: int) -> list:
    return ([series("DCGM_FI_DEV_GPU_TEMP", gpu(i), "60x10") for i in range(present)]
            + [series("dsv4:gpus_expected", {"box": "box1"}, "8x10")])


def _stall(queue: str, running: str, tokens: str | None) -> list:
    out = [series("sglang:num_queue_reqs", SERVER, queue), series("sglang:num_running_reqs", SERVER, running)]
    if tokens is not None:
        out.append(series("sglang:realtime_tokens_total", {**SERVER, "mode": "decode"}, tokens))
    return out


_STALL = "decode server on box1: 3 requests queued and the scheduler makes no progress"
# The exporter labels the last Xid with err_code/err_msg (4.8.2's gpu_collector): a new Xid is a new series.
_NO_XID = {**gpu(3), "err_code": "0", "err_msg": "No Error"}
_XID79 = {**gpu(3), "err_code": "79", "err_msg": "GPU has fallen off the bus"}
_XID = [series("DCGM_FI_DEV_XID_ERRORS", _NO_XID, "0x5"), series("DCGM_FI_DEV_XID_ERRORS", _XID79, "_x5 79x15")]

#: alert name -> [(input series, eval time, expected alerts)]; an empty expectation is a quiet case.
CASES = dict([
    ("DSV4EndpointDown", [
        ([series("up", {"job": "sglang", **WHERE}, "0x10")], "5m",
         [alert({"job": "sglang", **WHERE}, "sglang on box1 (127.0.0.1:30002) does not answer /metrics", "critical")]),
        ([series("up", {"job": "sglang", **WHERE}, "1x10")], "5m", []),
        ([series("up", {"job": "sglang", **WHERE}, "1x8 0")], "9m", []),  # down for less than 2 min
    ]),
    ("DSV4SchedulerStalled", [
        (_stall("3x10", "0x10", None), "8m", [alert(WHERE, _STALL, "critical")]),  # nothing running
        (_stall("3x10", "2x10", "500x10"), "8m", [alert(WHERE, _STALL, "critical")]),  # running, no token
        (_stall("3x10", "2x10", "0+100x10"), "8m", []),  # queued behind a busy batch: progress
        (_stall("0x10", "0x10", "500x10"), "8m", []),  # idle
    ]),
    _server_case("DSV4KVCacheExhausted", "sglang:num_retracted_requests_total",
                 "decode server on box1 retracted requests (KV cache exhausted)", "warning"),
    _server_case("DSV4KVTransferFailed", "sglang:num_transfer_failed_reqs_total",
                 "decode server on box1: PD KV transfers failed"),
    _server_case("DSV4BootstrapFailed", "sglang:num_bootstrap_failed_reqs_total",
                 "decode server on box1: PD bootstrap failed"),
    ("DSV4TTFTAboveSLO", [
        (_ttft(True), "20m", [alert(WHERE, "decode server on box1: TTFT p99 4s above the SLO", "warning")]),
        (_ttft(False), "20m", []),
        ([s for s in _ttft(True) if not s["series"].startswith("dsv4:")], "20m", []),  # no SLO set
    ]),
    ("DSV4SpeculativeAcceptanceLow", [
        (_spec("1.2", "4"), "20m", [alert(WHERE, "decode server on box1: speculative acceptance length 1.2 below its "
                                           "qualified floor", "warning")]),
        (_spec("2.9", "4"), "20m", []),
        (_spec("1.2", "0"), "20m", []),  # idle: the gauge holds the last window's value
    ]),
    ("DSV4GPUXid", [
        (_XID, "10m", [alert(_XID79, "GPU 3 on box1 reported Xid 79", "critical")]),
        ([series("DCGM_FI_DEV_XID_ERRORS", gpu(3), "0x5 79x15")], "10m",  # the value alone changes
         [alert(gpu(3), "GPU 3 on box1 reported Xid 79", "critical")]),
        ([series("DCGM_FI_DEV_XID_ERRORS", _NO_XID, "0x20")], "10m", []),
        ([series("DCGM_FI_DEV_XID_ERRORS", _XID79, "79x40")], "30m", []),  # an old Xid, already reported
        ([series("DCGM_EXP_XID_ERRORS_COUNT", {**gpu(3), "xid": "48", "window_size_in_ms": "300000"}, "0x3 1x5")],
         "6m", [alert({**gpu(3), "xid": "48", "window_size_in_ms": "300000"},
                      "GPU 3 on box1 logged Xid 48 1 time(s) in the exporter's window", "critical")]),
    ]),
    _gpu_pair("DSV4GPURowRemapFailed", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "0x3 1x10", "0x13", "10m",
              "GPU 3 on box1: row remapping failed (replace the card)", "critical"),
    _gpu_pair("DSV4GPUThermalThrottling", "DCGM_FI_DEV_THERMAL_VIOLATION", "0+60e9x40", "0+6e9x40", "20m",
              "GPU 3 on box1 thermally throttled for 10 minutes", "warning"),
    _gpu_pair("DSV4GPUPowerThrottling", "DCGM_FI_DEV_POWER_VIOLATION", "0+60e9x40", "0+6e9x40", "20m",
              "GPU 3 on box1 power throttled for 10 minutes", "warning"),
    ("DSV4GPUHardwareSlowdown", [
        ([series("DCGM_EXP_CLOCK_EVENTS_COUNT", _events("hw_power_brake"), "0x3 4x30")], "20m",
         [alert({"box": "box1", "gpu": "3", "clock_event": "hw_power_brake"},
                "GPU 3 on box1: hardware clock slowdown (hw_power_brake) for 10 minutes", "warning")]),
        ([series("DCGM_EXP_CLOCK_EVENTS_COUNT", _events("hw_slowdown"), "0x12 4x3 0x20")], "20m", []),  # brief
        ([series("DCGM_EXP_CLOCK_EVENTS_COUNT", _events("power_cap"), "30x40")], "20m", []),  # a loaded GPU
        ([series("DCGM_EXP_CLOCK_EVENTS_COUNT", _events(None), "0x40")], "20m", []),  # no event in the window
    ]),
    ("DSV4GPUMissing", [
        (_gpus(7), "5m", [alert({"box": "box1"}, "box1: fewer GPUs in the DCGM exporter than the 8 expected",
                                "critical")]),
        (_gpus(0), "5m", [alert({"box": "box1"}, "box1: fewer GPUs in the DCGM exporter than the 8 expected",
                                "critical")]),
        (_gpus(8), "5m", []),
    ]),
    ("Watchdog", [([], "1m", [alert({}, "Always firing: alerting works end to end", "none")])]),
])


def unit_test_file(rule_files: list[str], name: str) -> dict:
    """A promtool test file: one test per case of ``name``."""
    tests = []
    for inputs, at, expected in CASES[name]:
        tests.append({"interval": "1m", "input_series": inputs,
                      "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}]})
    return {"rule_files": rule_files, "evaluation_interval": "1m", "tests": tests}
