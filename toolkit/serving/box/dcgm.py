"""GPU telemetry of a window from the box's DCGM exporter (``GET 127.0.0.1:PORT/metrics``, the
monitoring role's unit), as ``dsv4kit.serving.box.telemetry`` combines it with ``nvidia-smi``."""

from __future__ import annotations

import time
import urllib.request

from .metrics import parse_exposition
from .sampler import BackgroundSampler, spread

#: The DCGM exporter 4.5.3-4.8.2 series a window reads (docs/monitoring.md lists them).
DCGM_GAUGES = {"DCGM_FI_DEV_POWER_USAGE": "power_w", "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
               "DCGM_FI_DEV_GPU_TEMP": "temperature_c"}
DCGM_COUNTERS = ("DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
#: The exporter's own counts over its sliding window (``window_size_in_ms``, 5 min by default): how
#: many of DCGM's samples in the window had the label's clock event or Xid. They fall as the window
#: slides, so what counts is every rise between two scrapes. With nothing in the window the
#: exporter writes one series per GPU without the label, value 0. A throttle that already filled the
#: whole window holds its count level (no rise): the violation counters and nvidia-smi's active
#: reasons still see it, which is one reason the gate reads both sources.
DCGM_WINDOWED = {"DCGM_EXP_CLOCK_EVENTS_COUNT": "clock_event", "DCGM_EXP_XID_ERRORS_COUNT": "xid"}


class DcgmTelemetry(BackgroundSampler):
    """The exporter scraped every ``interval_ms`` during a window, once more at its end. Per GPU:
    the gauges' spread, the counters that rose (violation time, PCIe replays, and the exporter's
    windowed clock-event counts as ``clock_event:LABEL``), and any Xid that appeared in the window
    (a new ``DCGM_FI_DEV_XID_ERRORS`` value or ``err_code``, or a rise of
    ``DCGM_EXP_XID_ERRORS_COUNT``). The exporter refreshes its fields on its own collect interval
    (30 s by default), so an event in a window's last seconds can be missed."""

    sample_at_exit = True

    def __init__(self, port: int, interval_ms: int):
        super().__init__(max(int(interval_ms), 100) / 1000.0)
        self.port = port
        self.scrapes: list = []
        self.errors: list = []

    @property
    def source(self) -> str:
        return f"dcgm-exporter (127.0.0.1:{self.port}/metrics)"

    def scrape(self) -> bool:
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

    def sample(self) -> None:
        self.scrape()

    def result(self) -> dict:
        samples: list = []
        previous: dict = {}  # (gpu, key) -> the value at the last scrape
        rose: dict = {}  # gpu -> {key: the sum of its rises}
        xid_first: dict = {}
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
                if name == "DCGM_FI_DEV_XID_ERRORS":  # the last Xid: a new one in the window is an event
                    last = (int(value), labels.get("err_code"), labels.get("err_msg"))
                    first = xid_first.setdefault(gpu, last)
                    if last[0] and last != first:
                        xids_seen.setdefault(gpu, {})[last] = None
                    continue
                if name in DCGM_COUNTERS:
                    key = name
                elif name in DCGM_WINDOWED and labels.get(DCGM_WINDOWED[name]):
                    key = f"{DCGM_WINDOWED[name]}:{labels[DCGM_WINDOWED[name]]}"
                else:
                    continue
                rose.setdefault(gpu, {})
                # a series that appears after the first scrape (an event's first count) rose from 0
                before = previous.get((gpu, key), value if number == 0 else 0.0)
                if value > before:
                    rose[gpu][key] = rose[gpu].get(key, 0.0) + value - before
                previous[(gpu, key)] = value
            samples.extend(row.values())
        per_gpu = {}
        for gpu in sorted(set(rose) | set(xid_first) | {str(s["index"]) for s in samples}, key=int):
            mine = [s for s in samples if str(s["index"]) == gpu]
            counts = rose.get(gpu) or {}
            xids = [{"code": code, "message": msg} for code, _, msg in xids_seen.get(gpu, {})]
            for key in counts:
                if key.startswith("xid:") and not any(str(x["code"]) == key[4:] for x in xids):
                    xids.append({"code": int(float(key[4:])), "message": "counted by DCGM_EXP_XID_ERRORS_COUNT"})
            per_gpu[gpu] = {
                "samples": len(mine),
                **{field: spread([s[field] for s in mine if field in s]) for field in DCGM_GAUGES.values()},
                "temperature_c_max": max((s["temperature_c"] for s in mine if "temperature_c" in s), default=None),
                "counters_rose": {k: v for k, v in counts.items() if not k.startswith("xid:")},
                "event_reasons": sorted(k.split(":", 1)[1] for k in counts if k.startswith("clock_event:")),
                "xids": xids,
            }
        return {"available": True, "source": self.source, "interval_ms": int(self.interval * 1000),
                "scrapes": len(self.scrapes), "scrape_errors": self.errors[-5:], "samples": samples,
                "per_gpu": per_gpu}
