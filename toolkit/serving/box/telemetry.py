"""GPU telemetry during a window (a bench point, an eval arm) from both sources a box has, the
DCGM exporter (``dsv4kit.serving.box.dcgm``) and ``nvidia-smi``; what in it makes a point invalid;
and GPU settings once per sweep (``nvidia-smi``)."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time

from .dcgm import DcgmTelemetry
from .sampler import spread


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
#: Clock-event (throttle) reason bits: DCGM's ``DCGM_CLOCKS_EVENT_REASON_*`` (the DCGM exporter
#: 4.8.2 still spells them ``DCGM_CLOCKS_THROTTLE_REASON_*``), the same bits as NVML's
#: ``nvmlClocksEventReason*``. Per bit: the DCGM exporter 4.8.2's ``clock_event`` label value (its
#: ``clock_events_collector.go``), nvidia-smi's name for it, and the class the gate sorts it into.
CLOCK_EVENT_BITS = {
    0x1: ("gpu_idle", "gpu_idle", "other"),
    0x2: ("clocks_setting", "applications_clocks_setting", "other"),
    0x4: ("power_cap", "sw_power_cap", "power"),
    0x8: ("hw_slowdown", "hw_slowdown", "hardware slowdown"),
    0x10: ("sync_boost", "sync_boost", "other"),
    0x20: ("sw_thermal", "sw_thermal_slowdown", "thermal"),
    0x40: ("hw_thermal", "hw_thermal_slowdown", "thermal"),
    0x80: ("hw_power_brake", "hw_power_brake_slowdown", "power"),
    0x100: ("display_clocks", "display_clock_setting", "other"),
}
#: nvidia-smi's names of the bits of ``clocks_event_reasons.active``.
EVENT_REASONS = {bit: smi for bit, (_, smi, _) in CLOCK_EVENT_BITS.items()}
#: The DCGM exporter's ``clock_event`` label values, to their bit.
DCGM_CLOCK_EVENTS = {label: bit for bit, (label, _, _) in CLOCK_EVENT_BITS.items()}
#: The bits that make a bench point invalid: the GPU slowed for heat (sw and hw thermal), for the
#: board's slowdown signal or for an external power brake. The board at its own power limit
#: (``power_cap`` / ``sw_power_cap``) is recorded but is the steady state of a loaded GPU.
INVALIDATING_BITS = 0x8 | 0x20 | 0x40 | 0x80


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
        if not samples:
            return {"available": False, "reason": "nvidia-smi wrote no sample in the window", "samples": [],
                    "per_gpu": {}}
        return {"available": True, "source": "nvidia-smi", "interval_ms": self.interval_ms,
                "fields": list(self.fields), "samples": samples, "per_gpu": summarize_telemetry(samples),
                "xid": "not observed: nvidia-smi --query-gpu reports no Xid (the DCGM exporter does)"}


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
            "sm_clock_mhz": spread(nums("clocks.sm")),
            "mem_clock_mhz_min": min(mem) if mem else None,
            "power_w": spread(nums("power.draw")),
            "temperature_c": spread(temp),
            "temperature_c_max": max(temp) if temp else None,
            "event_reasons": sorted(name for bit, name in EVENT_REASONS.items() if bits & bit and bit != 0x1),
        }
    return out


#: Both tools' names of the invalidating reasons.
INVALIDATING_REASONS = tuple(name for bit, names in sorted(CLOCK_EVENT_BITS.items()) if bit & INVALIDATING_BITS
                             for name in names[:2])
#: DCGM counters whose rise makes a point invalid (``DCGM_FI_DEV_POWER_VIOLATION`` counts the power
#: cap's time too, so it is only recorded).
INVALIDATING_COUNTERS = ("DCGM_FI_DEV_THERMAL_VIOLATION",)


def _invalidating(counter: str) -> bool:
    if counter.startswith("clock_event:"):
        return bool(DCGM_CLOCK_EVENTS.get(counter.split(":", 1)[1], 0) & INVALIDATING_BITS)
    return counter in INVALIDATING_COUNTERS


def throttle_findings(telemetry: dict, source: str = "") -> list:
    """What in one source's telemetry makes a point invalid: ``[{"gpu", "counter", "detail",
    "source"}]``, one per GPU and invalidating clock-event reason or counter that rose, and one per
    Xid in the window."""
    found = []
    source = source or telemetry.get("source") or "nvidia-smi"
    for gpu, entry in sorted((telemetry.get("per_gpu") or {}).items()):
        rose = entry.get("counters_rose") or {}
        for reason in entry.get("event_reasons") or ():
            if reason in INVALIDATING_REASONS and f"clock_event:{reason}" not in rose:  # DCGM: counted below
                found.append({"gpu": gpu, "counter": reason, "detail": f"GPU {gpu}: clock event {reason} active"})
        for counter, rise in sorted(rose.items()):
            if _invalidating(counter):
                amount = f"{rise / 1e9:.2f} s throttled" if counter.endswith("_VIOLATION") else f"+{rise:g}"
                found.append({"gpu": gpu, "counter": counter, "detail": f"GPU {gpu}: {counter} rose ({amount})"})
        for xid in entry.get("xids") or ():
            found.append({"gpu": gpu, "counter": "xid",
                          "detail": f"GPU {gpu}: Xid {xid.get('code')} ({xid.get('message') or 'no text'})"})
    return [{**f, "source": source} for f in found]


def gpu_settings() -> dict:
    """Persistence mode, ECC, application and max clocks, power limits per GPU (probe, once)."""
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "reason": "nvidia-smi not found on PATH", "devices": []}
    out, err = _run(["nvidia-smi", f"--query-gpu={','.join(SETTINGS_FIELDS)}", "--format=csv,noheader,nounits"])
    if out is None:
        return {"available": False, "reason": err, "devices": []}
    return {"available": True, "devices": parse_query_csv(out, SETTINGS_FIELDS)}


#: What a box installs for each source, named when it did not answer.
INSTALL_HINTS = {
    "dcgm-exporter": "the monitoring role's DCGM exporter (dsv4_monitoring: true, `dsv4kit provision --tags "
                     "monitoring`)",
    "nvidia-smi": "nvidia-smi, from the NVIDIA driver's utilities package (nvidia-utils-<branch>, "
                  "`dsv4kit provision --tags nvidia_driver`)",
}


class WindowTelemetry:
    """Both sources over one window. The DCGM exporter took part when it answered before the window
    (``dcgm``, else None and ``unanswered["dcgm-exporter"]`` says why); ``nvidia-smi`` always
    samples, and its own result says whether it answered."""

    def __init__(self, dcgm, smi: Telemetry, unanswered: dict):
        self.dcgm, self.smi, self.unanswered = dcgm, smi, dict(unanswered)

    def __enter__(self):
        self.smi.__enter__()
        if self.dcgm is not None:
            self.dcgm.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            if self.dcgm is not None:
                self.dcgm.__exit__(*exc)
        finally:
            self.smi.__exit__(*exc)

    def result(self) -> dict:
        return combine(self.dcgm.result() if self.dcgm is not None else None, self.smi.result(), self.unanswered)


def combine(dcgm, smi: dict, unanswered: dict) -> dict:
    """One window's ``gpu_telemetry`` from what each source gave: ``sources`` (each answering
    source's result, its samples moved to ``samples`` with a ``source`` field), ``unanswered``
    (source -> why not), ``gpu_sets`` (where both answered: whether they saw the same GPUs), and at
    the top the first answering source's ``per_gpu`` (the DCGM exporter's, which sees Xids).
    None answered: ``available`` false, and ``reason`` names each source, why, and what to install."""
    unanswered = dict(unanswered)
    sources = {}
    if dcgm is not None:
        sources["dcgm-exporter"] = dcgm
    if smi.get("available"):
        sources["nvidia-smi"] = smi
    else:
        unanswered["nvidia-smi"] = smi.get("reason") or "no answer"
    samples = [{**sample, "source": name} for name, result in sources.items() for sample in result.get("samples") or ()]
    entries = {name: {k: v for k, v in result.items() if k != "samples"} for name, result in sources.items()}
    out = {"unanswered": unanswered}
    if not sources:
        why = "; ".join(f"{name}: {reason}" for name, reason in unanswered.items())
        install = " or ".join(INSTALL_HINTS[name] for name in unanswered if name in INSTALL_HINTS)
        return {"available": False, "samples": [], "per_gpu": {}, **out,
                "reason": f"no GPU telemetry source answered on the box ({why}); install {install}"}
    primary = next(iter(entries.values()))
    out.update({"available": True, "source": " and ".join(r["source"] for r in entries.values()),
                "interval_ms": primary.get("interval_ms"), "per_gpu": primary.get("per_gpu") or {},
                "samples": samples, "sources": entries})
    if len(entries) == 2:
        out["gpu_sets"] = gpu_sets({name: set(r.get("per_gpu") or {}) for name, r in entries.items()})
    return out


def gpu_sets(seen: dict) -> dict:
    """``{"agree", "detail", "by_source"}`` of the GPUs each source reported in the window."""
    union = set().union(*seen.values())
    gaps = [f"GPU {gpu} missing from {', '.join(n for n, gpus in seen.items() if gpu not in gpus)}"
            for gpu in sorted(union, key=int) if any(gpu not in gpus for gpus in seen.values())]
    by_source = {name: sorted(gpus, key=int) for name, gpus in seen.items()}
    if not gaps:
        return {"agree": True, "detail": f"both sources saw the same {len(union)} GPUs", "by_source": by_source}
    return {"agree": False, "by_source": by_source,
            "detail": "the sources disagree on the GPU set: " + "; ".join(gaps)}


def window_telemetry(interval_ms: int, path: str, dcgm_port: int = 0) -> WindowTelemetry:
    """A window's GPU telemetry from both sources: the DCGM exporter on ``dcgm_port`` when it
    answers with DCGM's gauges now (0: the inventory turned the monitoring role off), and
    ``nvidia-smi`` sampling to ``path``."""
    dcgm, unanswered = None, {}
    if dcgm_port:
        probe = DcgmTelemetry(dcgm_port, interval_ms)
        if probe.scrape():
            dcgm = probe
        else:
            unanswered["dcgm-exporter"] = f"127.0.0.1:{dcgm_port}: {probe.errors[-1]}"
    else:
        unanswered["dcgm-exporter"] = "not asked (--dcgm-port 0: the inventory turns the monitoring role off)"
    return WindowTelemetry(dcgm, Telemetry(interval_ms, path), unanswered)
