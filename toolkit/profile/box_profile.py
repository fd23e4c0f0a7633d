"""Box-side half of ``dsv4kit profile``: copied to the box and run with the SGLang venv python.

Standard library only. ``run`` starts the bench client (the argv after ``--``) as the load, waits
until the decode server's ``/metrics`` shows at least ``--min-running`` requests running and none
queued (after the client's warm-up), reads the unprofiled decode throughput (``sglang:gen_throughput``), then asks the decode
server for ``--num-steps`` steps of profile (``POST /start_profile``, SGLang 0.5.23's ProfileReq
fields) and waits for one trace per TP rank (``<profile_id>-TP-<rank>[-DP-..][-PP-..][-EP-..]
.trace.json.gz`` in ``--out-dir``). Each trace is size-checked while it is written. On any
failure, a timeout or a signal (the control side's Ctrl-C kills this process group with TERM) it
sends ``POST /stop_profile`` when a profile was started and has not finished, so the server is
left not profiling, and stops the load. ``stop`` sends ``/stop_profile`` alone. Each prints one
JSON object; ``ok`` false carries ``kind`` (no_profiler, rejected, too_large, timeout, load,
interrupted) and ``error``.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error

_SAMPLE = re.compile(r"^sglang:(num_running_reqs|num_queue_reqs|gen_throughput)(\{[^}]*\})?\s+(\S+)")


class Stop(Exception):
    def __init__(self, kind: str, error: str):
        super().__init__(error)
        self.kind = kind
        self.error = error


def _http():
    """The bench's box-side HTTP client: ``dsv4box`` beside this script on the box (the bench's
    ``Remote.setup`` copies it there), else dsv4kit's own when imported on the control machine."""
    try:
        from dsv4box import http
    except ImportError:
        from dsv4kit.serving.box import http
    return http


def request(port: int, path: str, body=None, timeout: float = 30.0):
    """(status, text) of a request to 127.0.0.1:port; an HTTP error status is returned, not raised."""
    http = _http()
    status, raw = http.request(http.local(port), path, body, timeout)
    return status, raw.decode("utf-8", "replace")


def metrics(port: int) -> dict:
    _, text = request(port, "/metrics", timeout=10.0)
    found = {"num_running_reqs": 0.0, "num_queue_reqs": 0.0, "gen_throughput": 0.0}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            found[match.group(1)] += float(match.group(3))
    return found


def _message(text: str) -> str:
    try:
        body = json.loads(text)
        return str(body.get("message") or body.get("detail") or body)[:500]
    except ValueError:
        return text.strip()[:500]


def start_profile(port: int, out_dir: str, profile_id: str, num_steps: int) -> None:
    # No Python stacks and no shapes: both slow every profiled step and swell the traces, and under
    # CUDA graphs (how the server decodes) the stacks name only the graph launch anyway.
    body = {"output_dir": out_dir, "num_steps": num_steps, "activities": ["CPU", "GPU"], "profile_id": profile_id,
            "profile_by_stage": False, "merge_profiles": False, "with_stack": False, "record_shapes": False}
    status, text = request(port, "/start_profile", body)
    if status == 200:
        return
    if status == 404:
        raise Stop("no_profiler", f"the decode server on port {port} has no /start_profile (HTTP 404): it is not "
                                  f"an SGLang server with the profiler endpoints")
    if status in (401, 403):
        raise Stop("rejected", f"/start_profile needs the server's admin key (HTTP {status}); the box's key "
                                "file gave none it takes")
    if status >= 500:
        raise Stop("rejected", f"/start_profile failed (HTTP {status}: {_message(text)}); SGLang answers so when a "
                               f"profile is already running: stop it with `dsv4kit profile --stop` or POST /stop_profile")
    raise Stop("rejected", f"/start_profile rejected the request (HTTP {status}): {_message(text)}")


def stop_profile(port: int) -> dict:
    try:
        status, text = request(port, "/stop_profile", {}, timeout=60.0)
    except (OSError, urllib.error.URLError) as exc:
        return {"status": None, "message": str(getattr(exc, "reason", exc))}
    return {"status": status, "message": _message(text)}


def traces(out_dir: str, profile_id: str) -> list:
    return sorted(p for p in glob.glob(os.path.join(out_dir, f"{glob.escape(profile_id)}-TP-*.trace.json*"))
                  if not p.endswith(".tmp"))


#: The bench client prints this once its warm-up is over, before the measured run.
MAIN_RUN_MARKER = "Starting main benchmark run"


def _main_run_started(log_path: str) -> bool:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            return MAIN_RUN_MARKER in fh.read()
    except OSError:
        return False


def wait_steady(args, client, log_path: str) -> float:
    """Once the client's measured run began: until running >= min_running and nothing queued three
    polls in a row; then the median gen_throughput over ``--settle`` s (the unprofiled decode tok/s)."""
    deadline = time.monotonic() + args.steady_timeout
    good = 0
    while good < 3:
        if client.poll() is not None:
            raise Stop("load", f"the bench client exited ({client.returncode}) before the load was steady")
        if time.monotonic() > deadline:
            raise Stop("timeout", f"the load did not reach {args.min_running} running requests with none queued "
                                  f"within {args.steady_timeout:g}s")
        try:
            m = metrics(args.port) if _main_run_started(log_path) else {"num_running_reqs": 0, "num_queue_reqs": 1}
        except (OSError, urllib.error.URLError):
            m = {"num_running_reqs": 0, "num_queue_reqs": 1}
        good = good + 1 if m["num_running_reqs"] >= args.min_running and m["num_queue_reqs"] == 0 else 0
        time.sleep(0.1)
    samples = []
    end = time.monotonic() + args.settle
    while time.monotonic() < end:
        samples.append(metrics(args.port)["gen_throughput"])
        time.sleep(0.1)
    return statistics.median(samples) if samples else 0.0


def wait_traces(args) -> list:
    deadline = time.monotonic() + args.files_timeout
    last: dict = {}
    while True:
        found = traces(args.out_dir, args.profile_id)
        sizes = {p: os.path.getsize(p) for p in found if os.path.exists(p)}
        for path, size in sizes.items():
            if size > args.max_trace_bytes:
                raise Stop("too_large", f"the trace {os.path.basename(path)} is {size / 1e6:.1f} MB, above the "
                                        f"limit of {args.max_trace_bytes / 1e6:g} MB (--max-trace-mb); profile fewer "
                                        f"steps (--num-steps) or raise the limit")
        if len(sizes) >= args.expect_ranks and sizes == last and all(sizes.values()):
            return found
        last = sizes
        if time.monotonic() > deadline:
            raise Stop("timeout", f"{len(sizes)} of {args.expect_ranks} rank trace(s) written within "
                                  f"{args.files_timeout:g}s of /start_profile")
        time.sleep(0.5)


def _compress(path: str) -> str:
    if path.endswith(".gz"):
        return path
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)
    return path + ".gz"


def prepare_out_dir(out_dir: str) -> None:
    """The directory the server writes its traces into, made so that this (login) user can read them.

    The servers run as the service user with ``UMask=0027``: their traces are 0640, owned by the
    service user. The directory is this user's, writable by the server, and set-group-ID, so every
    trace written into it takes this user's group and its group read bit lets this user fetch it
    (no root, no sudo, no ACL). This user owns the directory, so it removes the traces too.
    """
    os.makedirs(out_dir, exist_ok=True)
    os.chmod(out_dir, 0o2777)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.chmod(parent, os.stat(parent).st_mode | 0o011)  # the server reaches out_dir through it


def cmd_run(args) -> dict:
    prepare_out_dir(args.out_dir)
    parent = os.path.dirname(os.path.abspath(args.out_dir))
    argv = args.client[1:] if args.client[:1] == ["--"] else args.client
    log_path = os.path.join(parent, "profile-client.log")
    log = open(log_path, "w")
    client = _http().start_client(argv, stdout=log, stderr=subprocess.STDOUT)  # the key in its memory only
    started = False
    result: dict = {"ok": False}

    def on_signal(signum, frame):
        raise Stop("interrupted", f"stopped by signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        tok_s = wait_steady(args, client, log_path)
        start_profile(args.port, args.out_dir, args.profile_id, args.num_steps)
        started = True
        files = [_compress(p) for p in wait_traces(args)]
        started = False  # the server stopped by itself after num_steps
        result = {"ok": True, "metrics_tok_s": tok_s,
                  "files": [{"path": p, "bytes": os.path.getsize(p)} for p in files]}
    except Stop as exc:
        result = {"ok": False, "kind": exc.kind, "error": exc.error}
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if started:
            result["stop_profile"] = stop_profile(args.port)
            if result.get("kind") == "too_large":
                for path in traces(args.out_dir, args.profile_id):
                    os.remove(path)
        if client.poll() is None:
            client.terminate()
            try:
                client.wait(timeout=10)
            except subprocess.TimeoutExpired:
                client.kill()
        log.close()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="box_profile")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--profile-id", required=True)
    p.add_argument("--num-steps", type=int, required=True)
    p.add_argument("--min-running", type=int, required=True)
    p.add_argument("--expect-ranks", type=int, default=1)
    p.add_argument("--max-trace-bytes", type=int, required=True)
    p.add_argument("--steady-timeout", type=float, default=600.0)
    p.add_argument("--files-timeout", type=float, default=300.0)
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("client", nargs=argparse.REMAINDER)
    p = sub.add_parser("stop")
    p.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    result = cmd_run(args) if args.command == "run" else {"ok": True, **stop_profile(args.port)}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    if result.get("kind") == "interrupted":
        return 130
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
