"""GPU telemetry over a bench point's window and the ``gpu_throttle`` gate: from the DCGM exporter
stand-in (tests/fake_exporters.py) and the ``nvidia-smi`` stand-in (tests/fake_nvidia_smi.py), each
with its fault "throttle during the point"; and once through the real bench client."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dsv4kit.serving.box.telemetry import Telemetry, window_telemetry
from dsv4kit.bench.gpu_throttle import dcgm_port, throttle_gate
from tests.bench.test_bench_units import fake_nvidia_smi  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dcgm(tmp_path):
    """``(port, plant)``: the DCGM exporter stand-in with 2 GPUs; ``plant(body)`` posts a fault."""
    port_file = tmp_path / "dcgm.port"
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/fake_exporters.py"), "dcgm", "--port-file",
                             str(port_file), "--gpus", "2", "--max-lifetime", "300"])
    deadline = time.monotonic() + 20
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the DCGM stand-in did not start"
        time.sleep(0.05)
    port = int(port_file.read_text())

    def plant(body: dict) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/_test/config", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=5).read()

    yield port, plant
    proc.terminate()
    proc.wait(timeout=10)


def sampled(port: int, tmp_path, seconds: float = 0.8) -> dict:
    with window_telemetry(100, str(tmp_path / "t.csv"), port) as telemetry:
        time.sleep(seconds)
    return telemetry.result()


def test_dcgm_window_names_the_gpu_and_counter_that_rose_during_the_point(dcgm, tmp_path):
    port, plant = dcgm
    plant({"xid": {"1": 48}})  # before the window: the exporter's last Xid, old news
    quiet = sampled(port, tmp_path)
    assert quiet["source"].startswith("dcgm-exporter") and set(quiet["per_gpu"]) == {"0", "1"}
    assert quiet["per_gpu"]["0"]["power_w"]["median"] == 412.5 and quiet["per_gpu"]["0"]["sm_clock_mhz"]["min"] == 2100
    gate = throttle_gate(quiet)
    assert gate["passed"] and gate["observed"], gate
    plant({"throttle": {"0": "thermal"}, "xid": {"1": 79}, "after_scrapes": 1})
    hot = sampled(port, tmp_path)
    gate = throttle_gate(hot)
    assert not gate["passed"]
    counters = {(f["gpu"], f["counter"]) for f in gate["findings"]}
    assert counters == {("0", "DCGM_FI_DEV_THERMAL_VIOLATION"), ("0", "clock_event:sw_thermal_slowdown"),
                        ("1", "xid")}, gate
    assert "GPU 1: Xid 79 (GPU has fallen off the bus)" in gate["detail"]
    assert hot["per_gpu"]["0"]["sm_clock_mhz"]["min"] == 1200 and hot["per_gpu"]["0"]["temperature_c"]["max"] == 92
    # a power cap is recorded but is a loaded GPU's steady state, not a fault
    plant({"throttle": {"0": "off", "1": "power"}})
    capped = sampled(port, tmp_path)
    assert capped["per_gpu"]["1"]["counters_rose"]["DCGM_FI_DEV_POWER_VIOLATION"] > 0
    assert throttle_gate(capped)["passed"]


def test_nvidia_smi_fallback_and_its_throttle_during_the_point(fake_nvidia_smi, tmp_path, monkeypatch):  # noqa: F811
    result = sampled(1, tmp_path)  # nothing listens on port 1: nvidia-smi, and the record says why
    assert result["source"] == "nvidia-smi" and "127.0.0.1:1" in result["dcgm_unused"]
    assert result["per_gpu"]["1"]["event_reasons"] == ["sw_power_cap"]
    assert throttle_gate(result)["passed"] and "not observed" in result["xid"]
    monkeypatch.setenv("FAKE_NVSMI_THROTTLE", "0:hw_thermal_slowdown")
    with Telemetry(100, str(tmp_path / "t2.csv")) as telemetry:
        time.sleep(0.6)
    gate = throttle_gate(telemetry.result())
    assert not gate["passed"] and gate["findings"][0]["gpu"] == "0"
    assert gate["findings"][0]["counter"] == "hw_thermal_slowdown"
    assert "no GPU telemetry" in throttle_gate({"available": False, "reason": "nvidia-smi not found"})["detail"]


def test_dcgm_port_follows_the_inventory():
    assert dcgm_port({}) == 9400 and dcgm_port({"monitoring_dcgm_exporter_port": 9500}) == 9500
    assert dcgm_port({"dsv4_monitoring": False}) == 0


@pytest.mark.slow
def test_a_point_measured_while_a_gpu_throttled_is_invalid_through_the_real_client(bench_box, dcgm, tmp_path):
    from tests.bench.test_bench_hostile import sweep
    from tests.bench.test_bench_sweep import dsv4kit

    port, plant = dcgm
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

    port, plant = dcgm
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
