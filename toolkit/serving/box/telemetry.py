"""GPU telemetry during a point and GPU settings once per sweep, from ``nvidia-smi``."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time


def _run(argv, timeout=30.0):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return None, f"{argv[0]} not found on PATH"
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} timed out after {timeout:g}s"
    if proc.returncode != 0:
        return None, f"{argv[0]} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}"
    return proc.stdout, None



#: Sampled per GPU during a point (``nvidia-smi --query-gpu ... -lms``). Drivers before 535 call the
#: last field ``clocks_throttle_reasons.active``; that spelling is the fallback.
TELEMETRY_FIELDS = ("timestamp", "index", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu",
                    "utilization.gpu", "clocks_event_reasons.active")
#: Once per sweep (probe): the settings that change what a GPU can do.
SETTINGS_FIELDS = ("index", "persistence_mode", "ecc.mode.current", "clocks.applications.graphics",
                   "clocks.applications.memory", "clocks.max.sm", "clocks.max.mem", "power.limit",
                   "power.default_limit")
#: Bits of clocks_event_reasons.active (NVML's nvmlClocksEventReason*).
EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def _value(text: str):
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None
    if text.lower().startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            return text
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


def parse_query_csv(text: str, fields) -> list:
    """``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` output -> one dict per line."""
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) != len(fields):
            continue
        entry = {name: (cell.strip() if name == "timestamp" else _value(cell)) for name, cell in zip(fields, row)}
        if "clocks_throttle_reasons.active" in entry:
            entry["clocks_event_reasons.active"] = entry.pop("clocks_throttle_reasons.active")
        rows.append(entry)
    return rows


class Telemetry:
    """``nvidia-smi --query-gpu=TELEMETRY_FIELDS --loop-ms=INTERVAL`` (``-lms``) in the background
    during a point; an old driver that refuses ``clocks_event_reasons`` gets the old field name."""

    def __init__(self, interval_ms: int, path: str):
        self.interval_ms = max(int(interval_ms), 100)
        self.path = path
        self.proc = None
        self.fields = TELEMETRY_FIELDS
        self.reason = None

    def _start(self, fields) -> None:
        self.out = open(self.path, "w")
        self.err = open(self.path + ".err", "w+")
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                                      "--format=csv,noheader,nounits", f"--loop-ms={self.interval_ms}"],
                                     stdout=self.out, stderr=self.err)
        self.fields = fields

    def __enter__(self):
        if shutil.which("nvidia-smi") is None:
            self.reason = "nvidia-smi not found on PATH"
            return self
        self._start(TELEMETRY_FIELDS)
        time.sleep(0.3)
        if self.proc.poll() not in (None, 0):  # an old driver refuses the new field name
            self.proc = None
            self.out.close()
            self.err.seek(0)
            error = self.err.read().strip()
            self.err.close()
            self._start(TELEMETRY_FIELDS[:-1] + ("clocks_throttle_reasons.active",))
            time.sleep(0.3)
            if self.proc.poll() not in (None, 0):
                self.reason = f"nvidia-smi telemetry failed: {error[:300]}"
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for handle in (getattr(self, "out", None), getattr(self, "err", None)):
            if handle is not None:
                handle.close()

    def result(self) -> dict:
        if self.reason:
            return {"available": False, "reason": self.reason, "samples": [], "per_gpu": {}}
        with open(self.path) as fh:
            samples = parse_query_csv(fh.read(), self.fields)
        return {"available": True, "interval_ms": self.interval_ms, "fields": list(self.fields),
                "samples": samples, "per_gpu": summarize_telemetry(samples)}


def summarize_telemetry(samples: list) -> dict:
    """Per GPU index: SM clock min/mean/max, memory clock min, power mean/max, temperature max, and
    every clock-event (throttle) reason seen other than idle."""
    per = {}
    for sample in samples:
        per.setdefault(str(sample.get("index")), []).append(sample)
    out = {}
    for index, rows in per.items():
        def nums(name):
            return [r[name] for r in rows if isinstance(r.get(name), (int, float))]

        sm, mem, power, temp = nums("clocks.sm"), nums("clocks.mem"), nums("power.draw"), nums("temperature.gpu")
        bits = 0
        for r in rows:
            value = r.get("clocks_event_reasons.active")
            if isinstance(value, int):
                bits |= value
        out[index] = {
            "samples": len(rows),
            "sm_clock_mhz": {"min": min(sm), "mean": sum(sm) / len(sm), "max": max(sm)} if sm else None,
            "mem_clock_mhz_min": min(mem) if mem else None,
            "power_w": {"mean": sum(power) / len(power), "max": max(power)} if power else None,
            "temperature_c_max": max(temp) if temp else None,
            "event_reasons": sorted(name for bit, name in EVENT_REASONS.items() if bits & bit and bit != 0x1),
        }
    return out


def gpu_settings() -> dict:
    """Persistence mode, ECC, application and max clocks, power limits per GPU (probe, once)."""
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "reason": "nvidia-smi not found on PATH", "devices": []}
    out, err = _run(["nvidia-smi", f"--query-gpu={','.join(SETTINGS_FIELDS)}", "--format=csv,noheader,nounits"])
    if out is None:
        return {"available": False, "reason": err, "devices": []}
    return {"available": True, "devices": parse_query_csv(out, SETTINGS_FIELDS)}

