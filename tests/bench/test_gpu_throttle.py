"""GPU telemetry over a bench point's window and the ``gpu_throttle`` gate: from the DCGM exporter
stand-in (tests/fake_exporters.py) and the ``nvidia-smi`` stand-in (tests/fake_nvidia_smi.py), each
alone and both together, each with its fault "throttle during the point", a GPU missing from one,
and neither (invalid); the exporter's clock-event labels against the pinned source's; and once
through the real bench client."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4kit.serving.box.telemetry import Telemetry, window_telemetry
from dsv4kit.bench.gpu_throttle import dcgm_port, throttle_gate

REPO = Path(__file__).resolve().parents[2]


def sampled(port: int, tmp_path, seconds: float = 0.8) -> dict:
    with window_telemetry(100, str(tmp_path / "t.csv"), port) as telemetry:
        time.sleep(seconds)
    return telemetry.result()


def test_dcgm_window_names_the_gpu_and_counter_that_rose_during_the_point(dcgm, tmp_path):
    port, plant = dcgm.port, dcgm.plant
    plant({"xid": {"1": 48}})  # before the window: the exporter's last Xid, old news
    quiet = sampled(port, tmp_path)
    assert quiet["source"].startswith("dcgm-exporter") and set(quiet["per_gpu"]) == {"0", "1"}
    assert quiet["per_gpu"]["0"]["power_w"]["median"] == 412.5 and quiet["per_gpu"]["0"]["sm_clock_mhz"]["min"] == 2100
    assert "nvidia-smi" in quiet["unanswered"] and "gpu_sets" not in quiet  # one source answered
    gate = throttle_gate(quiet)
    assert gate["passed"] and gate["observed"] and gate["sources"] == ["dcgm-exporter"], gate
    plant({"throttle": {"0": "thermal"}, "xid": {"1": 79}, "after_scrapes": 1})
    hot = sampled(port, tmp_path)
    gate = throttle_gate(hot)
    assert not gate["passed"]
    counters = {(f["gpu"], f["counter"]) for f in gate["findings"]}
    assert counters == {("0", "DCGM_FI_DEV_THERMAL_VIOLATION"), ("0", "clock_event:sw_thermal"),
                        ("1", "xid")}, gate
    assert "GPU 1: Xid 79 (GPU has fallen off the bus)" in gate["detail"]
    assert hot["per_gpu"]["0"]["sm_clock_mhz"]["min"] == 1200 and hot["per_gpu"]["0"]["temperature_c"]["max"] == 92
    # a power cap is recorded but is a loaded GPU's steady state, not a fault
    plant({"throttle": {"0": "off", "1": "power"}})
    capped = sampled(port, tmp_path)
    assert capped["per_gpu"]["1"]["counters_rose"]["DCGM_FI_DEV_POWER_VIOLATION"] > 0
    assert capped["per_gpu"]["1"]["event_reasons"] == ["power_cap"]
    assert throttle_gate(capped)["passed"]
    # an external power brake has no violation counter: its clock event alone fails the point
    plant({"throttle": {"1": "brake"}})
    braked = throttle_gate(sampled(port, tmp_path))
    assert [(f["gpu"], f["counter"]) for f in braked["findings"]] == [("1", "clock_event:hw_power_brake")], braked


def test_nvidia_smi_alone_and_its_throttle_during_the_point(fake_nvidia_smi, tmp_path, monkeypatch):
    result = sampled(1, tmp_path)  # nothing listens on port 1: nvidia-smi alone, and the record says why
    assert result["source"] == "nvidia-smi" and "127.0.0.1:1" in result["unanswered"]["dcgm-exporter"]
    assert result["per_gpu"]["1"]["event_reasons"] == ["sw_power_cap"]
    assert throttle_gate(result)["passed"] and "not observed" in result["sources"]["nvidia-smi"]["xid"]
    monkeypatch.setenv("FAKE_NVSMI_THROTTLE", "0:hw_thermal_slowdown")
    with Telemetry(100, str(tmp_path / "t2.csv")) as telemetry:
        time.sleep(0.6)
    gate = throttle_gate(telemetry.result())
    assert not gate["passed"] and gate["findings"][0]["gpu"] == "0"
    assert gate["findings"][0]["counter"] == "hw_thermal_slowdown"


def test_both_sources_are_recorded_and_either_ones_throttle_fails_the_point(dcgm, fake_nvidia_smi, tmp_path,
                                                                             monkeypatch):
    both = sampled(dcgm.port, tmp_path)
    assert set(both["sources"]) == {"dcgm-exporter", "nvidia-smi"} and both["unanswered"] == {}
    assert both["source"] == f"dcgm-exporter (127.0.0.1:{dcgm.port}/metrics) and nvidia-smi"
    assert both["gpu_sets"]["agree"] and {s["source"] for s in both["samples"]} == {"dcgm-exporter", "nvidia-smi"}
    gate = throttle_gate(both)
    assert gate["passed"] and gate["sources"] == ["dcgm-exporter", "nvidia-smi"], gate
    # only nvidia-smi sees GPU 1 slow down for heat: the DCGM exporter's quiet does not clear it
    monkeypatch.setenv("FAKE_NVSMI_THROTTLE", "1:sw_thermal_slowdown")
    gate = throttle_gate(sampled(dcgm.port, tmp_path))
    assert not gate["passed"] and [(f["gpu"], f["counter"], f["source"]) for f in gate["findings"]] == [
        ("1", "sw_thermal_slowdown", "nvidia-smi")], gate
    assert "GPU 1: clock event sw_thermal_slowdown active [nvidia-smi]" in gate["detail"]
    # only the exporter sees it, and nvidia-smi sees a GPU the exporter lacks: both said
    monkeypatch.delenv("FAKE_NVSMI_THROTTLE")
    monkeypatch.setenv("FAKE_NVSMI_GPUS", "3")
    dcgm.plant({"throttle": {"0": "thermal"}, "after_scrapes": 1})
    seen = sampled(dcgm.port, tmp_path)
    gate = throttle_gate(seen)
    assert not gate["passed"] and {f["source"] for f in gate["findings"]} == {seen["sources"]["dcgm-exporter"]["source"]}
    assert not seen["gpu_sets"]["agree"] and seen["gpu_sets"]["by_source"]["nvidia-smi"] == ["0", "1", "2"]
    assert "the sources disagree on the GPU set: GPU 2 missing from dcgm-exporter" in gate["detail"], gate["detail"]


def test_a_point_no_source_observed_is_invalid_and_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    none = sampled(1, tmp_path)
    gate = throttle_gate(none)
    assert none["available"] is False and not gate["passed"] and gate["observed"] is False
    detail = gate["detail"]
    assert "dcgm-exporter: 127.0.0.1:1:" in detail and "nvidia-smi: nvidia-smi not found on PATH" in detail, detail
    assert "dsv4kit provision --tags monitoring" in detail and "nvidia-utils" in detail, detail
    off = throttle_gate(sampled(0, tmp_path))  # the inventory turned the monitoring role off
    assert not off["passed"] and "--dcgm-port 0" in off["detail"], off
    assert not throttle_gate({"available": False, "reason": "nvidia-smi not found"})["passed"]  # an older record


def test_the_clock_event_labels_are_the_pinned_exporters_and_the_docs_list_them():
    """The labels the gate and the stand-in use are DCGM exporter 4.8.2's (its clock_events_collector.go),
    each on DCGM's reason bit, and docs/monitoring.md lists exactly them."""
    import re

    from dsv4kit.serving.box.telemetry import CLOCK_EVENT_BITS, DCGM_CLOCK_EVENTS, INVALIDATING_BITS
    from tests.fake_exporters import CLOCK_EVENT

    assert DCGM_CLOCK_EVENTS == {"gpu_idle": 0x1, "clocks_setting": 0x2, "power_cap": 0x4, "hw_slowdown": 0x8,
                                 "sync_boost": 0x10, "sw_thermal": 0x20, "hw_thermal": 0x40,
                                 "hw_power_brake": 0x80, "display_clocks": 0x100}
    assert {label for label, bit in DCGM_CLOCK_EVENTS.items() if bit & INVALIDATING_BITS} == {
        "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}
    assert set(CLOCK_EVENT.values()) <= set(DCGM_CLOCK_EVENTS)
    pins = (REPO / "inventory/group_vars/all.yml").read_text()
    assert 'dsv4_dcgm_exporter_version: "4.5.3-4.8.2"' in pins  # re-read the labels when this moves
    page = (REPO / "docs/monitoring.md").read_text()
    table = dict(re.findall(r"^\| `(\w+)` \| `(0x[0-9a-f]+)` \|", page, re.M))
    assert table == {label: f"0x{bit:x}" for label, bit in DCGM_CLOCK_EVENTS.items()}, table
    for bit, (label, smi, kind) in CLOCK_EVENT_BITS.items():
        assert re.search(rf"^\| `{label}` \| `0x{bit:x}` \| `{smi}` \| {kind} \|", page, re.M), label
    # every clock_event matcher of the alert rules and the dashboard names only those values
    role = REPO / "playbooks/roles/monitoring/files"
    matched = [value for path in (role / "dsv4kit-alerts.yml", role / "dsv4-pd-dashboard.json")
               for values in re.findall(r'clock_event\\?"?\s*=~?\s*\\?"([^"\\]+)', path.read_text())
               for value in values.split("|")]
    assert matched and set(matched) <= set(DCGM_CLOCK_EVENTS), matched


def test_dcgm_port_follows_the_inventory():
    assert dcgm_port({}) == 9400 and dcgm_port({"monitoring_dcgm_exporter_port": 9500}) == 9500
    assert dcgm_port({"dsv4_monitoring": False}) == 0


@pytest.mark.slow
def test_a_point_measured_while_a_gpu_throttled_is_invalid_through_the_real_client(bench_box, dcgm, tmp_path):
    from tests.bench.test_bench_hostile import sweep
    from tests.bench.test_bench_sweep import dsv4kit

    port, plant = dcgm.port, dcgm.plant
    plant({"throttle": {"1": "thermal"}, "after_scrapes": 1})
    server_inventory = bench_box(context_length=4096, inventory_extra={"monitoring_dcgm_exporter_port": port})
    proc, record = sweep(server_inventory, tmp_path)
    point = record["points"][0]
    assert proc.returncode == 1 and point["validity"]["failed"] == ["gpu_throttle"], point["validity"]
    assert "GPU 1: DCGM_FI_DEV_THERMAL_VIOLATION rose" in point["validity"]["gates"]["gpu_throttle"]["detail"]
    assert point["gpu_telemetry"]["source"] == f"dcgm-exporter (127.0.0.1:{port}/metrics)"
    assert point["gpu_telemetry"]["per_gpu"]["1"]["temperature_c"]["max"] == 93
    shown = dsv4kit("records", "show", record["run_id"], "--results-repo", str(tmp_path / "results"))
    assert "INVALID: gpu_throttle" in shown.stdout and "GPU telemetry (dcgm-exporter" in shown.stdout, shown.stdout


def test_an_eval_arm_runs_under_watch_and_its_report_names_the_throttle(dcgm, tmp_path):
    """``dsv4box watch`` (what an eval arm's checks run under) writes the window's telemetry and
    passes the exit code through; the arm's record entry and report line show a throttle."""
    from dsv4kit.bench.gpu_throttle import arm_telemetry
    from dsv4kit.records.eval_record import format_record

    port, plant = dcgm.port, dcgm.plant
    plant({"throttle": {"0": "thermal"}, "after_scrapes": 1})
    out = tmp_path / "arm.gpu"
    code = subprocess.call([sys.executable, "-m", "dsv4kit.serving.box", "watch", "--out", str(out), "--telemetry-ms",
                            "100", "--dcgm-port", str(port), "--", sys.executable, "-c",
                            "import time; time.sleep(0.8); raise SystemExit(3)"])
    assert code == 3
    entry = arm_telemetry({"gpu_telemetry": json.loads(out.read_text())})
    assert "samples" not in entry and not entry["gpu_throttle"]["passed"]
    record = {"run_id": "r", "schema_version": 1, "eval": {}, "checks": [], "outcome": "pass",
              "arms": {"A": {"setting": None, "gpu_telemetry": entry}}}
    shown = format_record(record)
    assert "THROTTLED: GPU 0: DCGM_FI_DEV_THERMAL_VIOLATION rose" in shown, shown
