"""Loopback stand-ins for the exporters the monitoring tests cannot run here (tests only).

* ``dcgm``: NVIDIA's DCGM exporter 4.5.3-4.8.2 for N GPUs. The fields it writes are the ones the
  monitoring role's counters file enables (playbooks/roles/monitoring/templates/dcgm-counters.csv.j2:
  a field that file leaves out is missing here too), with the exporter's labels (gpu, UUID,
  pci_bus_id, device, modelName, Hostname, the driver version as a label field). The profiling
  fields are not written (unprobed).
* ``router``: sglang-router 0.3.2's request counters (smg_http_requests_total,
  smg_router_request_errors_total).

``POST /_test/config`` plants faults: ``{"xid": {"3": 79}}`` (the last Xid of GPU 3),
``{"gpus": 7}`` (a GPU fell off the bus), ``{"throttle": {"3": "thermal"}}`` (or ``"power"``, a
power cap, or ``"brake"``, an external power brake; ``"off"`` ends it). ``"after_scrapes": N`` beside
them delays those faults until N more ``/metrics`` reads have been served: "during the point" for a
reader whose first scrape opens its window. A thermal or power throttle's violation counter
accumulates its throttled time. The exporter's own counts (``DCGM_EXP_CLOCK_EVENTS_COUNT``,
``DCGM_EXP_XID_ERRORS_COUNT``) are what 4.8.2 writes: per GPU and label value the DCGM samples with
that event in the last ``window_size_in_ms`` (here a throttle's start and each later ``/metrics``
read while it lasts are one sample each), falling as the window slides; a GPU with none has one series without the label, value 0.
Run: ``python tests/fake_exporters.py dcgm|router --port-file F [--gpus 8]`` (or ``--address :PORT``, the
real exporter's flag); 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

#: DCGM exporter 4.8.2's text for the Xids the tests plant (its xid_errors.go).
XID_TEXT = {0: "No Error", 48: "DBE (Double Bit Error) ECC Error", 79: "GPU has fallen off the bus"}
#: The clock event a planted throttle counts under DCGM_EXP_CLOCK_EVENTS_COUNT{clock_event}: the
#: exporter 4.8.2's label values (dsv4kit.serving.box.telemetry.CLOCK_EVENT_BITS, docs/monitoring.md).
CLOCK_EVENT = {"thermal": "sw_thermal", "power": "power_cap", "brake": "hw_power_brake"}
#: The exporter's default window for its DCGM_EXP_* counts (--clock-events-count-window-size,
#: --xid-count-window-size): 5 minutes.
WINDOW_MS = 300000
sys.path.insert(0, str(Path(__file__).resolve().parent))
from standin_http import send, serve  # noqa: E402  (run as a script from tests/, or imported as tests.fake_exporters)

COUNTERS = Path(__file__).resolve().parents[1] / "playbooks/roles/monitoring/templates/dcgm-counters.csv.j2"


def counter_fields() -> list[tuple[str, str]]:
    """(field, type) of every DCGM_FI_* and DCGM_EXP_* line of the role's counters file."""
    out = []
    for line in COUNTERS.read_text().splitlines():
        match = re.match(r"^(DCGM_(?:FI|EXP)_[A-Z0-9_]+)\s*,\s*(\w+)\s*,", line)
        if match and not match.group(1).startswith("DCGM_FI_PROF_"):
            out.append((match.group(1), match.group(2)))
    return out


class Dcgm:
    def __init__(self, gpus: int) -> None:
        self.lock = threading.Lock()
        self.gpus = gpus
        self.xid: dict[int, int] = {}
        self.throttle: dict[int, tuple[str, float]] = {}  # gpu -> (kind, since)
        self.throttled_ns: dict[tuple[int, str], float] = {}  # time of throttles already ended
        # DCGM samples that had the event, as times: the exporter counts those in its window
        self.xid_count: dict[tuple[int, int], list[float]] = {}
        self.events: dict[tuple[int, str], list[float]] = {}
        self.pending: list[tuple[int, dict]] = []  # (scrapes left, faults)
        self.started = time.time()
        self.fields = counter_fields()

    def violation_ns(self, gpu: int, kind: str, now: float) -> float:
        total = self.throttled_ns.get((gpu, kind), 0.0)
        current = self.throttle.get(gpu)
        if current and current[0] == kind:
            total += (now - current[1]) * 1e9
        return total

    def value(self, field: str, gpu: int, elapsed: float, now: float) -> float:
        throttled = (self.throttle.get(gpu) or ("", 0.0))[0]
        table = {
            "DCGM_FI_DEV_SM_CLOCK": 1200.0 if throttled else 2100.0, "DCGM_FI_DEV_MEM_CLOCK": 14001.0,
            "DCGM_FI_DEV_MEMORY_TEMP": 0.0,
            "DCGM_FI_DEV_GPU_TEMP": (92.0 if throttled == "thermal" else 61.0) + gpu,
            "DCGM_FI_DEV_POWER_USAGE": 412.5 + gpu,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e6 + 4e5 * elapsed, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
            "DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0,
            "DCGM_FI_DEV_XID_ERRORS": float(self.xid.get(gpu, 0)),
            "DCGM_FI_DEV_POWER_VIOLATION": self.violation_ns(gpu, "power", now),
            "DCGM_FI_DEV_THERMAL_VIOLATION": self.violation_ns(gpu, "thermal", now),
            "DCGM_FI_DEV_FB_FREE": 2048.0, "DCGM_FI_DEV_FB_USED": 95000.0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
        }
        return table.get(field, 0.0)

    def labels(self, gpu: int, extra: str) -> str:
        labels = (f'gpu="{gpu}",UUID="GPU-5a1d0000-0000-0000-0000-00000000000{gpu}",'
                  f'pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",device="nvidia{gpu}",'
                  f'modelName="NVIDIA RTX PRO 6000 Blackwell Server Edition",Hostname="box1"')
        return labels + ("," + extra if extra else "")

    def metrics(self) -> str:
        self._tick()
        now = time.time()
        elapsed = now - self.started
        labels_of = {name for name, kind in self.fields if kind == "label"}
        extra = ",".join(f'{name}="580.95.05"' for name in sorted(labels_of))
        lines = []
        for field, kind in self.fields:
            if kind == "label":
                continue
            if field in ("DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_EXP_XID_ERRORS_COUNT"):
                rows = self.windowed(self.events if field == "DCGM_EXP_CLOCK_EVENTS_COUNT" else self.xid_count,
                                     "clock_event" if field == "DCGM_EXP_CLOCK_EVENTS_COUNT" else "xid", now)
            else:
                rows = []
                for gpu in range(self.gpus):
                    more = ""
                    if field == "DCGM_FI_DEV_XID_ERRORS":  # the exporter's attributes of the last Xid
                        code = self.xid.get(gpu, 0)
                        more = f'err_code="{code}",err_msg="{XID_TEXT.get(code, "Unknown Error")}"'
                    rows.append((gpu, more, self.value(field, gpu, elapsed, now)))
            lines += [f"# HELP {field} {field}.", f"# TYPE {field} {kind}"]
            for gpu, more, value in rows:
                labels = self.labels(gpu, extra)
                lines.append(f"{field}{{{labels}{',' + more if more else ''}}} {float(value)}")
        return "\n".join(lines) + "\n"

    def windowed(self, counts: dict, label: str, now: float) -> list:
        """The exporter's count per GPU and label value of the samples in its window; a GPU with
        none gets one series without the label, value 0 (its expcollector.go)."""
        rows = []
        for gpu in range(self.gpus):
            mine = {key[1]: sum(1 for t in times if now - t <= WINDOW_MS / 1000)
                    for key, times in sorted(counts.items()) if key[0] == gpu}
            mine = {value: n for value, n in mine.items() if n}
            window = f'window_size_in_ms="{WINDOW_MS}"'
            rows += [(gpu, f'{window},{label}="{value}"', n) for value, n in mine.items()] or [(gpu, window, 0)]
        return rows

    def _tick(self) -> None:
        """One /metrics read: faults whose delay ran out take effect, and each active throttle is
        one more DCGM sample with its clock event."""
        before = dict(self.throttle)
        due, waiting = [], []
        for left, faults in self.pending:
            (due if left <= 0 else waiting).append((left - 1, faults))
        self.pending = waiting
        for _, faults in due:
            self._apply(faults)
        now = time.time()
        for gpu, (kind, since) in self.throttle.items():
            if before.get(gpu) == (kind, since):  # a throttle that starts counts its first sample in _apply
                self.events.setdefault((gpu, CLOCK_EVENT[kind]), []).append(now)

    def _apply(self, body: dict) -> None:
        now = time.time()
        if "gpus" in body:
            self.gpus = int(body["gpus"])
        for gpu, code in ((int(k), int(v)) for k, v in (body.get("xid") or {}).items()):
            self.xid[gpu] = code
            if code:
                self.xid_count.setdefault((gpu, code), []).append(now)
        for gpu, kind in ((int(k), str(v)) for k, v in (body.get("throttle") or {}).items()):
            old = self.throttle.pop(gpu, None)
            if old:
                key = (gpu, old[0])
                self.throttled_ns[key] = self.throttled_ns.get(key, 0.0) + (now - old[1]) * 1e9
            if kind in CLOCK_EVENT:
                self.throttle[gpu] = (kind, now)
                self.events.setdefault((gpu, CLOCK_EVENT[kind]), []).append(now)

    def configure(self, body: dict) -> None:
        faults = {k: v for k, v in body.items() if k != "after_scrapes"}
        if body.get("after_scrapes"):
            self.pending.append((int(body["after_scrapes"]), faults))
        else:
            self._apply(faults)


class Router:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = time.time()

    def metrics(self) -> str:
        n = int(time.time() - self.started) * 3
        return ("# HELP smg_http_requests_total Total HTTP requests\n# TYPE smg_http_requests_total counter\n"
                f'smg_http_requests_total{{method="POST",path="/v1/chat/completions"}} {n}\n'
                "# HELP smg_router_request_errors_total Router request errors\n"
                "# TYPE smg_router_request_errors_total counter\n"
                f'smg_router_request_errors_total{{route="/v1/chat/completions",error_type="timeout"}} 0\n')

    def configure(self, body: dict) -> None:
        pass


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):
            pass

        def do_GET(self):
            if self.path.split("?")[0] == "/metrics":
                with state.lock:
                    text = state.metrics()
                send(self, 200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                send(self, 404, b"404 page not found\n", "text/plain")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/_test/config":
                with state.lock:
                    state.configure(body)
                send(self, 200, b'{"ok": true}', "application/json")
            else:
                send(self, 404, b"{}", "application/json")

    return Handler


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["dcgm", "router"])
    parser.add_argument("--port-file")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--max-lifetime", type=float, default=600.0)
    # the real exporter's flags, as the monitoring role's unit passes them (a loopback port only)
    parser.add_argument("-a", "--address", default=":0")
    parser.add_argument("-f", "--collectors")
    parser.add_argument("--remote-hostengine-info")
    args = parser.parse_args(argv)
    state = Dcgm(args.gpus) if args.kind == "dcgm" else Router()
    return serve(make_handler(state), port=int(args.address.rpartition(":")[2]), port_file=args.port_file,
                 max_lifetime=args.max_lifetime)

if __name__ == "__main__":
    raise SystemExit(main())
