"""Loopback stand-ins for the exporters the monitoring tests cannot run here (tests only).

* ``dcgm``: NVIDIA's DCGM exporter 4.5.3-4.8.2 for N GPUs. The fields it writes are the ones the
  monitoring role's counters file enables (playbooks/roles/monitoring/templates/dcgm-counters.csv.j2:
  a field that file leaves out is missing here too), with the exporter's labels (gpu, UUID,
  pci_bus_id, device, modelName, Hostname, the driver version as a label field). The exporter-owned
  DCGM_EXP_* fields and the profiling fields are not written (absent until an event, or unprobed).
* ``router``: sglang-router 0.3.2's request counters (smg_http_requests_total,
  smg_router_request_errors_total).

``POST /_test/config`` plants faults: ``{"xid": {"3": 79}}`` (the last Xid of GPU 3),
``{"gpus": 7}`` (a GPU fell off the bus), ``{"throttle": {"3": "thermal"}}``.
Run: ``python tests/fake_exporters.py dcgm|router --port-file F [--gpus 8]``; 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: DCGM exporter 4.8.2's text for the Xids the tests plant (its xid_errors.go).
XID_TEXT = {0: "No Error", 48: "DBE (Double Bit Error) ECC Error", 79: "GPU has fallen off the bus"}
COUNTERS = Path(__file__).resolve().parents[1] / "playbooks/roles/monitoring/templates/dcgm-counters.csv.j2"


def counter_fields() -> list[tuple[str, str]]:
    """(field, type) of every DCGM_FI_DEV_* line of the role's counters file."""
    out = []
    for line in COUNTERS.read_text().splitlines():
        match = re.match(r"^(DCGM_FI_[A-Z0-9_]+)\s*,\s*(\w+)\s*,", line)
        if match and not match.group(1).startswith("DCGM_FI_PROF_"):
            out.append((match.group(1), match.group(2)))
    return out


class Dcgm:
    def __init__(self, gpus: int) -> None:
        self.lock = threading.Lock()
        self.gpus = gpus
        self.xid: dict[int, int] = {}
        self.throttle: dict[int, str] = {}
        self.started = time.time()
        self.fields = counter_fields()

    def value(self, field: str, gpu: int, elapsed: float) -> float:
        throttled = self.throttle.get(gpu)
        table = {
            "DCGM_FI_DEV_SM_CLOCK": 2100.0, "DCGM_FI_DEV_MEM_CLOCK": 14001.0, "DCGM_FI_DEV_MEMORY_TEMP": 0.0,
            "DCGM_FI_DEV_GPU_TEMP": 61.0 + gpu, "DCGM_FI_DEV_POWER_USAGE": 412.5 + gpu,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e6 + 4e5 * elapsed, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
            "DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0,
            "DCGM_FI_DEV_XID_ERRORS": float(self.xid.get(gpu, 0)),
            # throttled time in ns: all of the time while a throttle is planted
            "DCGM_FI_DEV_POWER_VIOLATION": elapsed * 1e9 if throttled == "power" else 0.0,
            "DCGM_FI_DEV_THERMAL_VIOLATION": elapsed * 1e9 if throttled == "thermal" else 0.0,
            "DCGM_FI_DEV_FB_FREE": 2048.0, "DCGM_FI_DEV_FB_USED": 95000.0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
        }
        return table.get(field, 0.0)

    def metrics(self) -> str:
        elapsed = time.time() - self.started
        labels_of = {name for name, kind in self.fields if kind == "label"}
        extra = ",".join(f'{name}="580.95.05"' for name in sorted(labels_of))
        lines = []
        for field, kind in self.fields:
            if kind == "label":
                continue
            lines += [f"# HELP {field} {field}.", f"# TYPE {field} {kind}"]
            for gpu in range(self.gpus):
                labels = (f'gpu="{gpu}",UUID="GPU-5a1d0000-0000-0000-0000-00000000000{gpu}",'
                          f'pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",device="nvidia{gpu}",'
                          f'modelName="NVIDIA RTX PRO 6000 Blackwell Server Edition",Hostname="box1"')
                if extra:
                    labels += "," + extra
                if field == "DCGM_FI_DEV_XID_ERRORS":  # the exporter's attributes of the last Xid
                    code = self.xid.get(gpu, 0)
                    labels += f',err_code="{code}",err_msg="{XID_TEXT.get(code, "Unknown Error")}"'
                lines.append(f"{field}{{{labels}}} {self.value(field, gpu, elapsed)}")
        return "\n".join(lines) + "\n"

    def configure(self, body: dict) -> None:
        if "gpus" in body:
            self.gpus = int(body["gpus"])
        self.xid.update({int(k): int(v) for k, v in (body.get("xid") or {}).items()})
        self.throttle.update({int(k): str(v) for k, v in (body.get("throttle") or {}).items()})


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

        def _send(self, code: int, data: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.split("?")[0] == "/metrics":
                with state.lock:
                    text = state.metrics()
                self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._send(404, b"404 page not found\n", "text/plain")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/_test/config":
                with state.lock:
                    state.configure(body)
                self._send(200, b'{"ok": true}', "application/json")
            else:
                self._send(404, b"{}", "application/json")

    return Handler


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["dcgm", "router"])
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--max-lifetime", type=float, default=600.0)
    args = parser.parse_args(argv)
    state = Dcgm(args.gpus) if args.kind == "dcgm" else Router()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    server.daemon_threads = True
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(server.server_address[1]))
    os.replace(tmp, args.port_file)
    timer = threading.Timer(args.max_lifetime, server.shutdown)
    timer.daemon = True
    timer.start()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
