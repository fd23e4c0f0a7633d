"""Box-side helper of ``dsv4kit bench``, run on the box with the SGLang venv python as
``python -m dsv4box COMMAND`` from the directory it is copied into (``dsv4kit.serving.remote``). Standard library only; each
subcommand prints one JSON object on stdout (``run-point`` writes its evidence to a file):

``server-info --port P``        ``GET /server_info`` of the server on 127.0.0.1:P.
``wait-health --ports P,Q --timeout S``  poll ``GET /health`` until every port answers 200.
``run-point --evidence-out F --metrics-ports P,Q --probe-port R -- CLIENT ARGV``  run one point's
                                client, and meanwhile scrape ``GET /metrics`` of the serving ports
                                every ``--interval`` s; afterwards read ``/server_info`` of those
                                ports and send one tiny streamed ``/generate`` to the router to see
                                which ``meta_info`` fields the server reports. Writes the evidence
                                (samples, the time the measured run began, startup times, fields)
                                to F as JSON and exits with the client's exit code.
``watch --out F [--dcgm-port P] -- ARGV``  run ARGV (an eval arm's checks) under the same GPU
                                telemetry as ``run-point``; write it to F; exit with ARGV's code.
``probe --model-path M --state-dir D --unit-dir U``   provenance: package versions, CUDA, GPUs
                                (``nvidia-smi``; null with a reason when it is absent), OS, the
                                serving processes' argv, start time and SGLANG_*/CUDA_*/NCCL_*
                                environment (``/proc``, when readable), the same from the dsv4-*.service units
                                and their environment files, whether a unit restart is pending, the
                                kernel_rollout decision file, model files' hashes, the wheel hash.

Ports are not exposed off the box, so everything HTTP goes through here over SSH. An API key,
when the server needs one, is read on the box from the root-only file ``$DSV4KIT_API_KEY_FILE``
names (``key``), never from argv or an environment.
"""

from __future__ import annotations

import argparse
import json
import sys

from .http import cmd_server_info, cmd_wait_health
from .key import KeyFileError, api_key
from .point import cmd_prefill_point, cmd_run_point
from .probe import cmd_probe
from .watch import cmd_watch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dsv4box", description="Box-side helper of dsv4kit bench.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("server-info")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--timeout", type=float, default=10.0)
    p = sub.add_parser("wait-health")
    p.add_argument("--ports", required=True)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--interval", type=float, default=2.0)
    p = sub.add_parser("probe")
    p.add_argument("--model-path", required=True)
    p.add_argument("--state-dir", default="")
    p.add_argument("--unit-dir", default="", help="where the dsv4-*.service units are (<dsv4_prefix>/etc/systemd/system)")
    p.add_argument("--decision-file", default="", help="<dsv4_prefix>/etc/dsv4kit/kernel-decision.json")
    p = sub.add_parser("prefill-point")
    p.add_argument("--router-port", type=int, required=True)
    p.add_argument("--prefill-port", type=int, required=True)
    p.add_argument("--decode-port", type=int, default=0)
    p.add_argument("--idle-timeout", type=float, default=120.0,
                   help="seconds to wait for idle servers with still counters before each request")
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout", type=float, default=1800.0)
    p = sub.add_parser("run-point")
    p.add_argument("--evidence-out", required=True)
    p.add_argument("--metrics-ports", default="")
    p.add_argument("--probe-port", type=int, default=0)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--telemetry-ms", type=int, default=500)
    p.add_argument("--dcgm-port", type=int, default=0,
                   help="the DCGM exporter's port on 127.0.0.1: the GPU telemetry's source when it answers (else nvidia-smi)")
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines (0: none)")
    p.add_argument("--idle-timeout", type=float, default=120.0,
                   help="seconds to wait for idle servers before the point (negative: do not check)")
    p.add_argument("client", nargs=argparse.REMAINDER)
    p = sub.add_parser("watch")
    p.add_argument("--out", required=True)
    p.add_argument("--telemetry-ms", type=int, default=5000)
    p.add_argument("--dcgm-port", type=int, default=0)
    p.add_argument("wrapped", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command not in ("probe", "watch"):  # the commands that send requests
        try:
            api_key()  # read once, before any request: a key file it cannot read is named here
        except KeyFileError as exc:
            sys.stdout.write(json.dumps({"ok": False, "error": str(exc)}) + "\n")
            return 1
    if args.command == "run-point":
        return cmd_run_point(args)
    if args.command == "watch":
        return cmd_watch(args)
    handler = {"server-info": cmd_server_info, "wait-health": cmd_wait_health, "probe": cmd_probe,
               "prefill-point": cmd_prefill_point}[args.command]
    result = handler(args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
