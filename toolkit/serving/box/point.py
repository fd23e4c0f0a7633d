"""``run-point`` (one point's client under the scraper, the telemetry and a watchdog) and
``prefill-point`` (cold prefill at one prompt length)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from .http import http_get, local, open_request, post
from .key import start_client
from .metrics import Scraper, read_metrics, wait_idle
from .sampler import BackgroundSampler
from .telemetry import window_telemetry

#: The client prints this just before the cache flush and the 1 s pause that precede the measured run.
MAIN_RUN_MARKER = "Starting main benchmark run"


def _session_anchor():
    """(pid, start ticks) of the sshd process this helper runs under, or None (not under sshd)."""
    pid = os.getppid()
    for _ in range(32):
        if pid <= 1:
            return None
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return None
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if comm.startswith("sshd"):
            return pid, fields[19]
        pid = int(fields[1])
    return None


def _anchor_alive(anchor) -> bool:
    try:
        stat = open(f"/proc/{anchor[0]}/stat").read()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[19] == anchor[1] and fields[0] != "Z"


def start_watchdog(interval: float = 0.5):
    """End this helper's whole process group (the client, nvidia-smi, the helper) when the SSH
    session it runs under is gone: a bench killed on the control machine (even by SIGKILL) leaves
    nothing running on the box. No-op when not started by sshd. Returns the thread or None."""
    import signal
    import threading

    anchor = _session_anchor()
    if anchor is None:
        return None

    def watch():
        while _anchor_alive(anchor):
            time.sleep(interval)
        group = os.getpgrp()
        try:
            os.killpg(group, signal.SIGTERM)
            time.sleep(2.0)
        finally:
            os.killpg(group, signal.SIGKILL)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _meta_info_fields(port: int) -> dict:
    """One tiny streamed /generate (4 prompt ids, 2 new tokens): which meta_info fields come back."""
    body = {"input_ids": [1, 2, 3, 4], "stream": True,
            "sampling_params": {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True}}
    keys: set = set()
    try:
        with open_request(local(port), "/generate", body, 60) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                try:
                    chunk = json.loads(line[5:])
                except ValueError:
                    continue
                keys.update((chunk.get("meta_info") or {}).keys())
    except Exception as exc:
        return {"ok": False, "error": str(getattr(exc, "reason", exc)), "keys": sorted(keys)}
    return {"ok": True, "keys": sorted(keys)}


#: A progress line of run-point starts with this, then one JSON object.
PROGRESS_PREFIX = "dsv4kit-progress "
_TQDM = re.compile(r"(\d+)/(\d+) \[")


class ProgressReporter(BackgroundSampler):
    """Every ``every`` s during the measured run, one ``PROGRESS_PREFIX`` line: the requests the
    client has finished (from its own progress bar) of its total, the seconds since the run began,
    and the decode server's running, queued and generated-token rate from the latest scrapes."""

    def __init__(self, scraper, port, every: float):
        import threading

        super().__init__(every)
        self.enabled = every > 0
        self.scraper, self.port, self.every = scraper, port, every
        self.marker = None
        self.done = self.total = None
        self.lock = threading.Lock()

    def count(self, line: str) -> bool:
        match = _TQDM.search(line)
        if not match:
            return False
        self.done, self.total = int(match.group(1)), int(match.group(2))
        return True

    def write(self, text: str) -> None:
        with self.lock:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()

    def state(self) -> dict:
        mine = [s for s in list(self.scraper.samples) if s.get("port") == self.port]
        rate = None
        if len(mine) >= 2 and mine[-1].get("decode_tokens_total") is not None:
            first = next((s for s in mine if s["t"] >= mine[-1]["t"] - self.every
                          and s.get("decode_tokens_total") is not None), None)
            if first is not None and mine[-1]["t"] > first["t"]:
                rate = (mine[-1]["decode_tokens_total"] - first["decode_tokens_total"]) / (mine[-1]["t"] - first["t"])
        last = mine[-1] if mine else {}
        return {"done": self.done, "total": self.total,
                "measured_s": round(time.monotonic() - self.marker, 2) if self.marker is not None else None,
                "running": last.get("num_running_reqs"), "queued": last.get("num_queue_reqs"),
                "decode_tok_s": None if rate is None else round(rate, 2)}

    def sample(self) -> None:
        if self.marker is not None:
            self.write(PROGRESS_PREFIX + json.dumps(self.state()))


#: run-point's exit status when the servers were not idle before the point (the client never ran).
NOT_IDLE_EXIT = 75


def _write_json(path: str, data) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def cmd_run_point(args) -> int:
    ports = [int(p) for p in args.metrics_ports.split(",") if p]
    argv = args.client
    if argv and argv[0] == "--":
        argv = argv[1:]
    start_watchdog()
    idle = wait_idle(ports, args.idle_timeout) if args.idle_timeout >= 0 else {"ok": True, "skipped": True}
    if not idle["ok"]:
        _write_json(args.evidence_out, {"idle_before": idle})
        sys.stdout.write(idle["detail"] + "\n")
        return NOT_IDLE_EXIT
    marker_time = marker_wall = None
    started = time.monotonic()
    telemetry = window_telemetry(args.telemetry_ms, args.evidence_out + ".nvsmi.csv", args.dcgm_port)
    with telemetry, Scraper(ports, args.interval) as scraper:
        reporter = ProgressReporter(scraper, ports[0] if ports else None, args.progress_every)
        proc = start_client(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        with reporter:
            for line in proc.stdout:  # universal newlines: each of tqdm's \r redraws is a line
                if marker_time is None and MAIN_RUN_MARKER in line:
                    marker_time, marker_wall = time.monotonic(), time.time()
                    reporter.marker = marker_time
                if marker_time is not None and reporter.count(line):
                    continue  # the client's progress bar: reported by the reporter, not echoed
                reporter.write(line)
            code = proc.wait()
    ended = time.monotonic()
    startup = {}
    for port in ports:
        try:
            _, body = http_get(port, "/server_info", 10.0)
            info = json.loads(body)
            if isinstance(info.get("decode"), list) and info["decode"]:
                info = info["decode"][0]
            startup[str(port)] = {"reported": "startup_time" in info, "startup_time": info.get("startup_time"),
                                  "model_path": info.get("model_path"),
                                  "served_model_name": info.get("served_model_name")}
        except Exception as exc:
            startup[str(port)] = {"reported": False, "error": str(getattr(exc, "reason", exc))}
    evidence = {
        "clock": "monotonic", "started": started, "ended": ended, "main_run_marker_time": marker_time,
        "main_run_marker_wall": marker_wall, "interval_s": args.interval, "idle_before": idle,
        "metrics_ports": ports, "samples": scraper.samples, "scrape_errors": scraper.errors,
        "exposition": scraper.exposition, "startup_after": startup,
        "telemetry": telemetry.result(),
        "meta_info": _meta_info_fields(args.probe_port) if args.probe_port and code == 0 else None,
    }
    _write_json(args.evidence_out, evidence)
    return code





def cmd_prefill_point(args) -> dict:
    """Cold prefill at one prompt length: ``--requests`` requests of ``--length`` fresh token ids and
    one new token, one at a time through the router. Before each: the serving ports idle and their
    counters still (``wait_idle(still=True)``), then the cache flushed. Per request: the prefill
    server's ``realtime_tokens_total`` growth in mode prefill_compute (prompt tokens it computed)
    and prefill_cache (reused: a cold cache reuses none), the generation requests that started on
    each serving port meanwhile (only this one may), and the wall time around it."""
    import random

    samples = []
    ports = [args.prefill_port] + [p for p in (args.decode_port,) if p and p != args.prefill_port]
    for i in range(args.requests):
        idle = wait_idle(ports, args.idle_timeout, still=True)
        if not idle["ok"]:
            return {"ok": False, "length": args.length, "samples": samples,
                    "error": f"request {i + 1}: {idle['detail']}"}
        try:
            post(args.router_port, "/flush_cache", {}, 120.0)
            before_all = {port: read_metrics(port)[0] for port in ports}
            before, problems, _ = read_metrics(args.prefill_port)
            rng = random.Random(args.seed * 1000003 + args.length * 31 + i)
            ids = [rng.randrange(1000, 30000) for _ in range(args.length)]
            started = time.monotonic()
            post(args.router_port, "/generate", {"input_ids": ids, "stream": True, "sampling_params": {
                "max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}}, args.timeout)
            seconds = time.monotonic() - started
            after, problems_after, _ = read_metrics(args.prefill_port)
            after_all = {port: read_metrics(port)[0] for port in ports}
        except Exception as exc:
            return {"ok": False, "length": args.length, "samples": samples,
                    "error": f"request {i + 1}: {getattr(exc, 'reason', exc)}"}
        sample = {"seconds": round(seconds, 4), "requests_started": {}}
        for port in ports:
            a, b = before_all[port].get("requests_started_total"), after_all[port].get("requests_started_total")
            sample["requests_started"][str(port)] = None if a is None or b is None else b - a
        for name in ("prefill_tokens_total", "prefill_cached_tokens_total"):
            a, b = before.get(name), after.get(name)
            sample[name.replace("_total", "")] = None if a is None or b is None else b - a
        missing = {**problems, **problems_after}.get("prefill_tokens_total")
        if missing or before.get("prefill_tokens_total") is None:
            sample["problem"] = missing or "the prefill server's /metrics has no realtime_tokens_total counter"
        samples.append(sample)
    return {"ok": True, "length": args.length, "samples": samples}

