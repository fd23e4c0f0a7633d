"""``watch``: run any command (an eval arm's checks) under the GPU telemetry of ``run-point``, and
write that telemetry to a file; the command's output passes through and its exit code is ours."""

from __future__ import annotations

import json
import os
import subprocess

from .point import start_watchdog
from .telemetry import window_telemetry


def cmd_watch(args) -> int:
    argv = args.wrapped
    if argv and argv[0] == "--":
        argv = argv[1:]
    start_watchdog()
    telemetry = window_telemetry(args.telemetry_ms, args.out + ".nvsmi.csv", args.dcgm_port)
    with telemetry:
        code = subprocess.call(argv)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(telemetry.result(), fh)
    os.replace(tmp, args.out)
    return code
