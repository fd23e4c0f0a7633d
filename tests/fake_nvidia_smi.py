"""A stand-in for ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits [-lms=N]`` (tests only).

It behaves like the real tool where the bench relies on it: one CSV line per GPU, fields in the
order asked, ``[N/A]`` for what a board does not report, ``-lms`` repeats every N ms until it is
killed, and an unknown field is refused with the real message and exit code 2. ``FAKE_NVSMI_OLD=1``
is a driver before 535, which does not know ``clocks_event_reasons.*`` yet. ``FAKE_NVSMI_GPUS``
GPUs (default 2); GPU 1 is power-capped (reason bit 0x4) and hot.

Fault "throttle during the point": ``FAKE_NVSMI_THROTTLE=GPU:REASON[,GPU:REASON]`` (or that text
in the file ``$FAKE_NVSMI_FAULT_FILE``, read at start), REASON an NVML clock-event name such as
``hw_thermal_slowdown``: a sampler's first line is clean, every later line has the reason's bit
set and the SM clock at 1200 MHz.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
import os

VALUES = {
    "index": lambda i, t: str(i),
    "timestamp": lambda i, t: datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3],
    "name": lambda i, t: "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "uuid": lambda i, t: f"GPU-{i:08x}-5e1f-4c2d-9a7b-0000000000{i:02d}",
    "driver_version": lambda i, t: "580.95.05",
    "memory.total": lambda i, t: "97887",
    "compute_cap": lambda i, t: "12.0",
    "clocks.sm": lambda i, t: str(2400 - 300 * i - (t % 3) * 15),
    "clocks.mem": lambda i, t: "12481",
    "power.draw": lambda i, t: f"{350.5 + 200 * i:.2f}",
    "temperature.gpu": lambda i, t: str(60 + 25 * i),
    "utilization.gpu": lambda i, t: "97",
    "clocks_event_reasons.active": lambda i, t: "0x0000000000000004" if i else "0x0000000000000000",
    "clocks_throttle_reasons.active": lambda i, t: "0x0000000000000004" if i else "0x0000000000000000",
    "persistence_mode": lambda i, t: "Enabled",
    "ecc.mode.current": lambda i, t: "Disabled",
    "clocks.applications.graphics": lambda i, t: "[N/A]",
    "clocks.applications.memory": lambda i, t: "[N/A]",
    "clocks.max.sm": lambda i, t: "2617",
    "clocks.max.mem": lambda i, t: "14001",
    "power.limit": lambda i, t: "600.00",
    "power.default_limit": lambda i, t: "600.00",
}


#: NVML's clock-event reason bits (nvmlClocksEventReason*), by name.
REASON_BITS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal_slowdown": 0x20,
               "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80}


def planted_throttle() -> dict:
    """{gpu index: reason bit} of the fault, from the environment or the fault file."""
    spec = os.environ.get("FAKE_NVSMI_THROTTLE", "")
    path = os.environ.get("FAKE_NVSMI_FAULT_FILE")
    if not spec and path and os.path.exists(path):
        spec = open(path).read().strip()
    out = {}
    for item in filter(None, spec.split(",")):
        gpu, _, reason = item.partition(":")
        out[int(gpu)] = REASON_BITS[reason.strip()]
    return out


def throttled(values: dict, bits: dict) -> dict:
    """VALUES with the planted reasons active from the second tick on."""
    def reasons(base):
        return lambda i, t: (f"0x{int(base(i, t), 16) | bits[i]:016x}" if i in bits and t >= 1 else base(i, t))

    def sm(base):
        return lambda i, t: "1200" if i in bits and t >= 1 else base(i, t)

    out = dict(values)
    for name in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        out[name] = reasons(values[name])
    out["clocks.sm"] = sm(values["clocks.sm"])
    return out


def main(argv: list[str], values: dict = VALUES) -> int:
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    loop_ms = None
    for i, arg in enumerate(argv):  # -lms N, -lms=N, --loop-ms=N (the real tool takes all three)
        if arg.startswith(("-lms=", "--loop-ms=")):
            loop_ms = int(arg.split("=", 1)[1])
        elif arg == "-lms" and i + 1 < len(argv):
            loop_ms = int(argv[i + 1])
    if query is None:
        print("NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0")
        return 0
    fields = query.split(",")
    values = throttled(values, planted_throttle())
    for field in fields:
        if field not in values or (os.environ.get("FAKE_NVSMI_OLD") and field.startswith("clocks_event_reasons")):
            print(f'Field "{field}" is not a valid field to query.', file=sys.stderr)
            print("", file=sys.stderr)
            return 2
    tick = 0
    while True:
        for i in range(int(os.environ.get("FAKE_NVSMI_GPUS", "2"))):
            print(", ".join(values[f](i, tick) for f in fields), flush=True)
        if loop_ms is None:
            return 0
        tick += 1
        time.sleep(loop_ms / 1000.0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
