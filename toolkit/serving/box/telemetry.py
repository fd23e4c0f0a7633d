"""GPU telemetry during a point (the box's DCGM exporter, else ``nvidia-smi``), what in it makes a
point invalid, and GPU settings once per sweep (``nvidia-smi``)."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time
import urllib.request
from typing import Optional


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
        self.dcgm_unused = None  # why the DCGM exporter was not the source (window_telemetry)

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
        unused = {"dcgm_unused": self.dcgm_unused} if self.dcgm_unused else {}
        if self.reason:
            return {"available": False, "reason": self.reason, "samples": [], "per_gpu": {}, **unused}
        with open(self.path) as fh:
            samples = parse_query_csv(fh.read(), self.fields)
        return {"available": True, "source": "nvidia-smi", "interval_ms": self.interval_ms,
                "fields": list(self.fields), "samples": samples, "per_gpu": summarize_telemetry(samples),
                "xid": "not observed: nvidia-smi --query-gpu reports no Xid (the DCGM exporter does)", **unused}


def _spread(values: list) -> Optional[dict]:
    """min / median / max (and the mean, which older records carry) of a window's samples."""
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"min": ordered[0], "median": median, "max": ordered[-1], "mean": sum(values) / len(values)}


def summarize_telemetry(samples: list) -> dict:
    """Per GPU index: SM clock, power and temperature (min/median/max/mean), the lowest memory
    clock, and every clock-event (throttle) reason seen active other than idle."""
    per = {}
    for sample in samples:
        per.setdefault(str(sample.get("index")), []).append(sample)
    out = {}
    for index, rows in per.items():
        def nums(name):
            return [r[name] for r in rows if isinstance(r.get(name), (int, float))]

        mem, temp = nums("clocks.mem"), nums("temperature.gpu")
        bits = 0
        for r in rows:
            value = r.get("clocks_event_reasons.active")
            if isinstance(value, int):
                bits |= value
        out[index] = {
            "samples": len(rows),
            "sm_clock_mhz": _spread(nums("clocks.sm")),
            "mem_clock_mhz_min": min(mem) if mem else None,
            "power_w": _spread(nums("power.draw")),
            "temperature_c": _spread(temp),
            "temperature_c_max": max(temp) if temp else None,
            "event_reasons": sorted(name for bit, name in EVENT_REASONS.items() if bits & bit and bit != 0x1),
        }
    return out


#: Clock-event reasons that make a bench point invalid: the GPU slowed for heat, for the board's
#: slowdown signal or for an external power brake. ``sw_power_cap`` (the board at its own power
#: limit) is recorded but is the steady state of a loaded GPU, so it does not invalidate a point.
INVALIDATING_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown")


def throttle_findings(telemetry: dict) -> list:
    """What in a point's telemetry makes it invalid: ``[{"gpu", "counter", "detail"}]``, one per GPU
    and invalidating clock-event reason or counter that rose, and one per Xid in the window."""
    found = []
    for gpu, entry in sorted((telemetry.get("per_gpu") or {}).items()):
        rose = entry.get("counters_rose") or {}
        for reason in entry.get("event_reasons") or ():
            if reason in INVALIDATING_REASONS and f"clock_event:{reason}" not in rose:  # DCGM: counted below
                found.append({"gpu": gpu, "counter": reason, "detail": f"GPU {gpu}: clock event {reason} active"})
        for counter, rise in sorted(rose.items()):
            if any(word in counter for word in ("THERMAL", "thermal", "hw_slowdown", "power_brake")):
                amount = f"{rise / 1e9:.2f} s throttled" if counter.endswith("_VIOLATION") else f"+{rise:g}"
                found.append({"gpu": gpu, "counter": counter, "detail": f"GPU {gpu}: {counter} rose ({amount})"})
        for xid in entry.get("xids") or ():
            found.append({"gpu": gpu, "counter": "xid",
                          "detail": f"GPU {gpu}: Xid {xid.get('code')} ({xid.get('message') or 'no text'})"})
    return found


def gpu_settings() -> dict:
    """Persistence mode, ECC, application and max clocks, power limits per GPU (probe, once)."""
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "reason": "nvidia-smi not found on PATH", "devices": []}
    out, err = _run(["nvidia-smi", f"--query-gpu={','.join(SETTINGS_FIELDS)}", "--format=csv,noheader,nounits"])
    if out is None:
        return {"available": False, "reason": err, "devices": []}
    return {"available": True, "devices": parse_query_csv(out, SETTINGS_FIELDS)}



#: The DCGM exporter 4.5.3-4.8.2 series a point's window reads (docs/monitoring.md lists them).
DCGM_GAUGES = {"DCGM_FI_DEV_POWER_USAGE": "power_w", "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
               "DCGM_FI_DEV_GPU_TEMP": "temperature_c"}
DCGM_COUNTERS = ("DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")


class DcgmTelemetry:
    """The box's DCGM exporter (``GET 127.0.0.1:PORT/metrics``, the monitoring role's unit) scraped
    every ``interval_ms`` during a point, once more at its end. Per GPU: the gauges' spread, the
    violation and clock-event counters that rose, and any Xid that appeared in the window (a new
    ``DCGM_FI_DEV_XID_ERRORS`` value or ``err_code``, or a rise of ``DCGM_EXP_XID_ERRORS_COUNT``).
    The exporter refreshes its fields on its own collect interval (30 s by default), so an event in
    a point's last seconds can be missed."""

    def __init__(self, port: int, interval_ms: int):
        import threading

        self.port = port
        self.interval = max(int(interval_ms), 100) / 1000.0
        self.scrapes: list = []
        self.errors: list = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def source(self) -> str:
        return f"dcgm-exporter (127.0.0.1:{self.port}/metrics)"

    def scrape(self) -> bool:
        from .metrics import parse_exposition

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
                text = response.read().decode("utf-8", "replace")
            series = parse_exposition(text)
        except Exception as exc:  # connection refused, a timeout, a bad exposition
            self.errors.append(str(getattr(exc, "reason", exc))[:200])
            return False
        if not any(name in DCGM_GAUGES for name, _, _ in series):
            self.errors.append(f"127.0.0.1:{self.port}/metrics has no DCGM_FI_DEV_* gauges")
            return False
        self.scrapes.append((time.time(), series))
        return True

    def _loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.scrape()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=10)
        self.scrape()

    def result(self) -> dict:
        samples, per_gpu = [], {}
        first: dict = {}
        last: dict = {}
        xids_seen: dict = {}
        for number, (t, series) in enumerate(self.scrapes):
            row: dict = {}
            for name, labels, value in series:
                gpu = labels.get("gpu")
                if gpu is None:
                    continue
                if name in DCGM_GAUGES:
                    row.setdefault(gpu, {"t": round(t, 3), "index": int(gpu)})[DCGM_GAUGES[name]] = value
                    continue
                if name in DCGM_COUNTERS:
                    key = name
                elif name == "DCGM_EXP_CLOCK_EVENTS_COUNT":
                    key = f"clock_event:{labels.get('clock_event', '')}"
                elif name == "DCGM_EXP_XID_ERRORS_COUNT":
                    key = f"xid_count:{labels.get('xid', '')}"
                elif name == "DCGM_FI_DEV_XID_ERRORS":
                    key = "xid_last"
                    value = (int(value), labels.get("err_code"), labels.get("err_msg"))
                else:
                    continue
                # a series that appears after the first scrape (an exporter-owned counter at its
                # first event) rose from nothing in the window
                first.setdefault(gpu, {}).setdefault(key, value if number == 0 or key == "xid_last" else 0.0)
                last.setdefault(gpu, {})[key] = value
                if key == "xid_last" and value[0] and value != first[gpu][key]:
                    xids_seen.setdefault(gpu, {})[value] = None
            samples.extend(row.values())
        for gpu in sorted(set(first) | {str(s["index"]) for s in samples}, key=int):
            mine = [s for s in samples if str(s["index"]) == gpu]
            rose = {}
            for key, end in (last.get(gpu) or {}).items():
                start = first[gpu].get(key)
                if key == "xid_last":
                    continue
                if isinstance(end, float) and isinstance(start, float) and end > start:
                    rose[key] = end - start
            xids = [{"code": code, "message": msg} for code, _, msg in xids_seen.get(gpu, {})]
            for key in rose:
                if key.startswith("xid_count:") and not any(str(x["code"]) == key[10:] for x in xids):
                    xids.append({"code": int(float(key[10:] or 0)), "message": "counted by DCGM_EXP_XID_ERRORS_COUNT"})
            per_gpu[gpu] = {
                "samples": len(mine),
                **{field: _spread([s[field] for s in mine if field in s]) for field in DCGM_GAUGES.values()},
                "temperature_c_max": max((s["temperature_c"] for s in mine if "temperature_c" in s), default=None),
                "counters_rose": {k: v for k, v in rose.items() if not k.startswith("xid_count:")},
                "event_reasons": sorted(k.split(":", 1)[1] for k in rose if k.startswith("clock_event:")),
                "xids": xids,
            }
        return {"available": True, "source": self.source, "interval_ms": int(self.interval * 1000),
                "scrapes": len(self.scrapes), "scrape_errors": self.errors[-5:], "samples": samples,
                "per_gpu": per_gpu}


def window_telemetry(interval_ms: int, path: str, dcgm_port: int = 0):
    """A point's GPU telemetry: the DCGM exporter when ``dcgm_port`` answers with DCGM's gauges
    now, else ``nvidia-smi`` sampling, whose result then says why the exporter was not used."""
    if dcgm_port:
        dcgm = DcgmTelemetry(dcgm_port, interval_ms)
        if dcgm.scrape():
            return dcgm
        fallback = Telemetry(interval_ms, path)
        fallback.dcgm_unused = f"DCGM exporter on 127.0.0.1:{dcgm_port}: {dcgm.errors[-1]}"
        return fallback
    return Telemetry(interval_ms, path)
