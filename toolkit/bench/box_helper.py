"""Box-side helper of ``dsv4kit bench``: copied to the box and run there with the SGLang venv python.

Standard library only (the box may not have dsv4kit installed), and each subcommand prints one
JSON object on stdout:

``server-info --port P``        ``GET /server_info`` of the server on 127.0.0.1:P.
``wait-health --ports P,Q --timeout S``  poll ``GET /health`` until every port answers 200.
``run-point --evidence-out F --metrics-ports P,Q --probe-port R -- CLIENT ARGV``  run one point's
                                client, and meanwhile scrape ``GET /metrics`` of the serving ports
                                every ``--interval`` s; afterwards read ``/server_info`` of those
                                ports and send one tiny streamed ``/generate`` to the router to see
                                which ``meta_info`` fields the server reports. Writes the evidence
                                (samples, the time the measured run began, startup times, fields)
                                to F as JSON and exits with the client's exit code.
``probe --model-path M --state-dir D --unit-dir U``   provenance: package versions, CUDA, GPUs
                                (``nvidia-smi``; null with a reason when it is absent), OS, the
                                serving processes' argv, start time and SGLANG_*/CUDA_*/NCCL_*
                                environment (``/proc``, when readable), the same from the dsv4-*.service units
                                and their environment files, whether a unit restart is pending, the
                                kernel_rollout decision file, model files' hashes, the wheel hash.

Ports are not exposed off the box, so everything HTTP goes through here over SSH. An API key,
when the server needs one, comes from the environment (``OPENAI_API_KEY``), never from argv.
"""

from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import io
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

if __package__:  # imported as dsv4kit.bench.box_helper (the control machine, the tests)
    from dsv4kit.core import unit_env
else:  # run as a script on the box, which may have no dsv4kit: unit_env.py is copied beside it
    import unit_env

ENV_PREFIXES = ("SGLANG_", "CUDA_", "NCCL_", "DSV4", "TORCH_", "TRITON_")
PACKAGES = ("sglang", "torch", "triton", "transformers", "tokenizers", "flashinfer-python", "sgl-kernel",
            "deep-gemm", "numpy", "dsv4kit", "sglang-router", "torchvision")
SERVER_MARKERS = ("sglang.launch_server", "sglang_router.launch_router", "sglang.launch_router",
                  "dsv4-router-launch")  # the router unit starts sglang-router through it (key out of argv)


def _headers() -> dict:
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def http_get(port: int, path: str, timeout: float = 10.0):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=_headers())
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.read().decode("utf-8", "replace")


def cmd_server_info(args) -> dict:
    try:
        status, body = http_get(args.port, "/server_info", args.timeout)
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": f"HTTP {exc.code} from /server_info"}
    except (urllib.error.URLError, OSError, socket.timeout) as exc:
        return {"ok": False, "error": f"no answer from 127.0.0.1:{args.port}/server_info: {getattr(exc, 'reason', exc)}"}
    try:
        return {"ok": True, "status": status, "server_info": json.loads(body)}
    except ValueError:
        return {"ok": False, "error": f"/server_info did not return JSON: {body[:200]!r}"}


def cmd_wait_health(args) -> dict:
    ports = [int(p) for p in args.ports.split(",") if p]
    deadline = time.monotonic() + args.timeout
    pending = set(ports)
    last = {}
    while pending:
        for port in sorted(pending):
            try:
                status, _ = http_get(port, "/health", 5.0)
                if status == 200:
                    pending.discard(port)
            except Exception as exc:  # not up yet
                last[port] = str(getattr(exc, "reason", exc))
        if not pending:
            break
        if time.monotonic() > deadline:
            return {"ok": False, "pending": sorted(pending), "last_error": {str(k): v for k, v in last.items()}}
        time.sleep(args.interval)
    return {"ok": True, "ports": ports}


# ------------------------------------------------------------------------------------- run-point
#: The client prints this just before the cache flush and the 1 s pause that precede the measured run.
MAIN_RUN_MARKER = "Starting main benchmark run"
#: Scraped metrics: name -> how 0.5.23's series combine into one number (docs/benchmarking.md).
#: ``scheduler-sum``/``scheduler-max``: a scheduler gauge. Its total is the series without a
#: ``priority`` label or with ``priority=""`` (``--enable-priority-scheduling`` adds one series per
#: priority beside it, a breakdown of the same requests). Each DP group reports it from its
#: stats-logging rank (the lowest ``pp_rank``/``tp_rank`` of the group);
#: ``--enable-metrics-for-all-schedulers`` adds one copy per other rank, which runs the same batch.
#: So: per ``dp_rank`` the lowest rank's series, then summed (or the max) over the DP groups.
#: ``partition-sum``: a tokenizer counter, split by ``is_streaming``/``priority``: every request
#: is in exactly one series, so the series add up.
#: ``scheduler-mean``: a scheduler gauge averaged over the DP groups (the acceptance length).
METRICS = {"sglang:num_running_reqs": "scheduler-sum", "sglang:num_queue_reqs": "scheduler-sum",
           "sglang:gen_throughput": "scheduler-sum", "sglang:token_usage": "scheduler-max",
           "sglang:generation_tokens_total": "partition-sum", "sglang:prompt_tokens_total": "partition-sum",
           "sglang:num_requests_total": "partition-sum", "sglang:spec_accept_length": "scheduler-mean",
           "sglang:realtime_tokens_total": "scheduler-sum", "sglang:cuda_graph_passes_total": "scheduler-sum"}
#: Scheduler counters split by one label: short name -> (metric, label, the label values summed).
#: ``realtime_tokens_total`` grows every forward pass (mode decode: tokens generated; mode
#: prefill_compute: prompt tokens computed); ``cuda_graph_passes_total`` counts forward passes.
#: A mode never seen yet has no series (prometheus_client writes a labelled child only once it is
#: used): with other series of the metric present, that mode's count is 0.
SPLIT = {"decode_tokens_total": ("sglang:realtime_tokens_total", "mode", ("decode",)),
         "prefill_tokens_total": ("sglang:realtime_tokens_total", "mode", ("prefill_compute",)),
         "prefill_cached_tokens_total": ("sglang:realtime_tokens_total", "mode", ("prefill_cache",)),
         "decode_passes_total": ("sglang:cuda_graph_passes_total", "mode", ("decode_cuda_graph", "decode_none"))}
#: Metrics a point can do without: their absence is no problem (a server without speculative
#: decoding has no acceptance length; the split counters are named under their short names).
OPTIONAL = ("spec_accept_length", "realtime_tokens_total", "cuda_graph_passes_total")
#: Metrics a point cannot do without: a problem with one of these is named in the gate it feeds.
REQUIRED = ("num_running_reqs", "num_queue_reqs")
_RANK_LABELS = ("pp_rank", "tp_rank")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,)?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class ExpositionError(ValueError):
    """A line of /metrics that is not Prometheus text format."""


def _unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


def _number(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return float("inf")
    if lowered == "-inf":
        return float("-inf")
    if lowered == "nan":
        return float("nan")
    return float(text)


def parse_exposition(text: str, names=None) -> list:
    """Prometheus text format 0.0.4 -> [(name, {label: value}, float)], in order; only ``names``
    when given. Comments and blank lines are skipped; label values are unescaped; a trailing
    timestamp is dropped. Checked against prometheus_client's parser in the tests."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        if not match:
            raise ExpositionError(f"line {number}: no metric name: {line[:80]!r}")
        name, rest = match.group(0), line[match.end():]
        labels = {}
        if rest.startswith("{"):
            pos = 1
            while True:
                while pos < len(rest) and rest[pos] == " ":
                    pos += 1
                if pos < len(rest) and rest[pos] == "}":
                    pos += 1
                    break
                label = _LABEL.match(rest, pos)
                if not label:
                    raise ExpositionError(f"line {number}: bad label set: {line[:120]!r}")
                labels[label.group(1)] = _unescape(label.group(2))
                pos = label.end()
                if not label.group(3) and not rest[pos:pos + 1] == "}":
                    raise ExpositionError(f"line {number}: bad label set: {line[:120]!r}")
            rest = rest[pos:]
        fields = rest.split()
        if not fields or len(fields) > 2:
            raise ExpositionError(f"line {number}: expected a value (and a timestamp): {line[:120]!r}")
        try:
            value = _number(fields[0])
        except ValueError:
            raise ExpositionError(f"line {number}: value {fields[0]!r} is not a number") from None
        if names is None or name in names:
            out.append((name, labels, value))
    return out


def _rank(labels: dict) -> tuple:
    def as_int(text):
        try:
            return int(text)
        except (TypeError, ValueError):
            return -1
    return tuple(as_int(labels.get(name)) for name in _RANK_LABELS)


def _shape(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def select_metric(name: str, series: list) -> tuple:
    """(value, problem) of one metric from its series [(labels, value)] (see METRICS); value None
    with the problem in words when the series is missing or ambiguous."""
    how = METRICS[name]
    if not series:
        return None, f"{name} is missing from /metrics"
    if how == "partition-sum":
        return sum(v for _, v in series), None
    totals = [(l, v) for l, v in series if l.get("priority", "") == ""]
    if not totals:
        return None, (f"{name} has only per-priority series ({len(series)}), no total (priority=\"\"): "
                      f"the total cannot be told")
    groups: dict = {}
    for labels, value in totals:
        groups.setdefault(labels.get("dp_rank"), []).append((labels, value))
    values = []
    for dp, members in sorted(groups.items(), key=lambda item: str(item[0])):
        lowest = min(_rank(l) for l, _ in members)
        chosen = [(l, v) for l, v in members if _rank(l) == lowest]
        if len(chosen) > 1:
            return None, (f"{name} is ambiguous: {len(chosen)} total series for the same rank"
                          f"{'' if dp is None else f' of dp_rank {dp}'}, differing in other labels: "
                          + "; ".join(_shape(l) for l, _ in chosen[:4]))
        values.append(chosen[0][1])
    if how == "scheduler-mean":
        return sum(values) / len(values), None
    return (max(values) if how == "scheduler-max" else sum(values)), None


def select_metrics(samples: list) -> tuple:
    """The parsed exposition -> ({short name: value}, {short name: problem}) for METRICS."""
    by_name: dict = {name: [] for name in METRICS}
    for name, labels, value in samples:
        if name in by_name:
            by_name[name].append((labels, value))
    values, problems = {}, {}
    for name, series in by_name.items():
        short = name.split(":", 1)[1]
        if short in OPTIONAL and not series:
            continue
        if name in {metric for metric, _, _ in SPLIT.values()}:
            continue  # only its split values below mean something
        value, problem = select_metric(name, series)
        if problem:
            problems[short] = problem
        else:
            values[short] = value
    for short, (name, label, wanted) in SPLIT.items():
        series = by_name[name]
        if not series:
            continue  # the server does not have this counter (an older SGLang, or metrics off)
        total, problem = 0.0, None
        for mode in wanted:
            part = [({k: v for k, v in l.items() if k != label}, v) for l, v in series if l.get(label) == mode]
            if part:
                value, problem = select_metric(name, part)
                if problem:
                    break
                total += value
        if problem:
            problems[short] = f"{problem} ({label}={'/'.join(wanted)})"
        else:
            values[short] = total
    return values, problems


def read_metrics(port: int) -> tuple:
    """({short name: value}, {short name: problem}, raw text of our metrics' lines) of one scrape."""
    _, body = http_get(port, "/metrics", 5.0)
    samples = parse_exposition(body, names=METRICS)
    kept = "\n".join(l for l in body.splitlines() if l.split("{", 1)[0].split(" ", 1)[0] in METRICS) + "\n"
    values, problems = select_metrics(samples)
    return values, problems, kept


class Scraper:
    """Poll ``/metrics`` of some ports in a thread until stopped. Each sample has ``t`` (the box's
    monotonic clock, which placing the window uses), ``wall`` (its wall clock, for people), the
    port, the selected values and, when a metric could not be selected, ``problems``."""

    def __init__(self, ports, interval: float):
        import threading

        self.ports = ports
        self.interval = interval
        self.samples: list = []
        self.errors: dict = {}
        self.exposition: dict = {}  # port -> the raw text of our metrics in its first scrape
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def scrape(self, port) -> None:
        try:
            values, problems, raw = read_metrics(port)
        except urllib.error.HTTPError as exc:
            self._error(port, f"HTTP {exc.code} from /metrics (is the server started with --enable-metrics?)")
            return
        except ExpositionError as exc:
            self._error(port, f"/metrics is not Prometheus text: {exc}")
            return
        except Exception as exc:
            self._error(port, str(getattr(exc, "reason", exc)))
            return
        if not values:
            self._error(port, "no sglang: metrics in the answer (is the server started with --enable-metrics?)")
            return
        self.exposition.setdefault(str(port), raw)
        sample = {"t": round(time.monotonic(), 4), "wall": round(time.time(), 4), "port": port, **values}
        if problems:
            sample["problems"] = problems
        self.samples.append(sample)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            for port in self.ports:
                self.scrape(port)
            self.stop_event.wait(self.interval)

    def _error(self, port, message: str) -> None:
        entry = self.errors.setdefault(str(port), {"count": 0, "first": message})
        entry["count"] += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=10)


def wait_idle(ports, timeout: float, interval: float = 0.5) -> dict:
    """Wait until every port's server runs and queues no request (``num_running_reqs`` and
    ``num_queue_reqs`` 0), at most ``timeout`` s. ``{"ok", "waited_s", "ports": {port: last
    values or problem}}``; not ok names the load (or why it could not be read)."""
    started = time.monotonic()
    while True:
        seen, busy, blind = {}, [], []
        for port in ports:
            try:
                values, problems, _ = read_metrics(port)
            except Exception as exc:
                seen[str(port)] = {"error": str(getattr(exc, "reason", exc))}
                blind.append(f"port {port}: /metrics unreadable ({seen[str(port)]['error']})")
                continue
            wanted = {k: values.get(k) for k in REQUIRED}
            seen[str(port)] = {**wanted, **({"problems": problems} if problems else {})}
            missing = [problems.get(k) or f"{k} missing" for k in REQUIRED if values.get(k) is None]
            if missing:
                blind.append(f"port {port}: " + "; ".join(missing))
            elif wanted["num_running_reqs"] or wanted["num_queue_reqs"]:
                busy.append(f"port {port}: {wanted['num_running_reqs']:g} running, {wanted['num_queue_reqs']:g} "
                            f"queued")
        waited = round(time.monotonic() - started, 2)
        if blind:  # waiting cannot help: the load cannot be read at all
            return {"ok": False, "waited_s": waited, "ports": seen,
                    "detail": "cannot tell whether the servers are idle before the point: " + "; ".join(blind)}
        if not busy:
            return {"ok": True, "waited_s": waited, "ports": seen}
        if waited >= timeout:
            return {"ok": False, "waited_s": waited, "ports": seen,
                    "detail": f"the servers were not idle before the point (another client's load?) after "
                              f"{timeout:g} s: " + "; ".join(busy)}
        time.sleep(interval)


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
    body = json.dumps({"input_ids": [1, 2, 3, 4], "stream": True,
                       "sampling_params": {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **_headers()})
    keys: set = set()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
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
        return {"available": True, "interval_ms": self.interval_ms, "fields": list(self.fields),
                "samples": samples, "per_gpu": summarize_telemetry(samples)}


def summarize_telemetry(samples: list) -> dict:
    """Per GPU index: SM clock min/mean/max, memory clock min, power mean/max, temperature max, and
    every clock-event (throttle) reason seen other than idle."""
    per = {}
    for sample in samples:
        per.setdefault(str(sample.get("index")), []).append(sample)
    out = {}
    for index, rows in per.items():
        def nums(name):
            return [r[name] for r in rows if isinstance(r.get(name), (int, float))]

        sm, mem, power, temp = nums("clocks.sm"), nums("clocks.mem"), nums("power.draw"), nums("temperature.gpu")
        bits = 0
        for r in rows:
            value = r.get("clocks_event_reasons.active")
            if isinstance(value, int):
                bits |= value
        out[index] = {
            "samples": len(rows),
            "sm_clock_mhz": {"min": min(sm), "mean": sum(sm) / len(sm), "max": max(sm)} if sm else None,
            "mem_clock_mhz_min": min(mem) if mem else None,
            "power_w": {"mean": sum(power) / len(power), "max": max(power)} if power else None,
            "temperature_c_max": max(temp) if temp else None,
            "event_reasons": sorted(name for bit, name in EVENT_REASONS.items() if bits & bit and bit != 0x1),
        }
    return out


def gpu_settings() -> dict:
    """Persistence mode, ECC, application and max clocks, power limits per GPU (probe, once)."""
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "reason": "nvidia-smi not found on PATH", "devices": []}
    out, err = _run(["nvidia-smi", f"--query-gpu={','.join(SETTINGS_FIELDS)}", "--format=csv,noheader,nounits"])
    if out is None:
        return {"available": False, "reason": err, "devices": []}
    return {"available": True, "devices": parse_query_csv(out, SETTINGS_FIELDS)}


#: A progress line of run-point starts with this, then one JSON object.
PROGRESS_PREFIX = "dsv4kit-progress "
_TQDM = re.compile(r"(\d+)/(\d+) \[")


class ProgressReporter:
    """Every ``every`` s during the measured run, one ``PROGRESS_PREFIX`` line: the requests the
    client has finished (from its own progress bar) of its total, the seconds since the run began,
    and the decode server's running, queued and generated-token rate from the latest scrapes."""

    def __init__(self, scraper, port, every: float):
        import threading

        self.scraper, self.port, self.every = scraper, port, every
        self.marker = None
        self.done = self.total = None
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

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

    def _loop(self) -> None:
        while not self.stop_event.wait(self.every):
            if self.marker is not None:
                self.write(PROGRESS_PREFIX + json.dumps(self.state()))

    def __enter__(self):
        if self.every > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)


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
    telemetry = Telemetry(args.telemetry_ms, args.evidence_out + ".nvsmi.csv")
    with telemetry, Scraper(ports, args.interval) as scraper:
        reporter = ProgressReporter(scraper, ports[0] if ports else None, args.progress_every)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
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


# ------------------------------------------------------------------------------------- prefill-point
def _post(port: int, path: str, body: dict, timeout: float):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **_headers()})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def cmd_prefill_point(args) -> dict:
    """Cold prefill at one prompt length: ``--requests`` requests of ``--length`` fresh token ids and
    one new token, one at a time through the router, the cache flushed before each. Per request:
    the prefill server's ``realtime_tokens_total`` growth in mode prefill_compute (prompt tokens it
    computed) and prefill_cache (reused: a cold cache reuses none), and the wall time around it."""
    import random

    samples = []
    for i in range(args.requests):
        try:
            _post(args.router_port, "/flush_cache", {}, 120.0)
            before, problems, _ = read_metrics(args.prefill_port)
            rng = random.Random(args.seed * 1000003 + args.length * 31 + i)
            ids = [rng.randrange(1000, 30000) for _ in range(args.length)]
            started = time.monotonic()
            _post(args.router_port, "/generate", {"input_ids": ids, "stream": True, "sampling_params": {
                "max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}}, args.timeout)
            seconds = time.monotonic() - started
            after, problems_after, _ = read_metrics(args.prefill_port)
        except Exception as exc:
            return {"ok": False, "length": args.length, "samples": samples,
                    "error": f"request {i + 1}: {getattr(exc, 'reason', exc)}"}
        sample = {"seconds": round(seconds, 4)}
        for name in ("prefill_tokens_total", "prefill_cached_tokens_total"):
            a, b = before.get(name), after.get(name)
            sample[name.replace("_total", "")] = None if a is None or b is None else b - a
        missing = {**problems, **problems_after}.get("prefill_tokens_total")
        if missing or before.get("prefill_tokens_total") is None:
            sample["problem"] = missing or "the prefill server's /metrics has no realtime_tokens_total counter"
        samples.append(sample)
    return {"ok": True, "length": args.length, "samples": samples}


# ------------------------------------------------------------------------------------- probe
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


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _versions() -> dict:
    from importlib import metadata

    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _torch_cuda() -> dict:
    """torch.version.cuda without importing torch (no CUDA context on the serving GPUs)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"torch_cuda": None, "reason": "torch not installed"}
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        text = open(path).read()
    except OSError as exc:
        return {"torch_cuda": None, "reason": f"cannot read {path}: {exc}"}
    match = re.search(r"^cuda(?:\s*:\s*[^=]+)?\s*=\s*['\"]?([^'\"\n]+?)['\"]?\s*$", text, re.M)
    value = match.group(1) if match else None
    return {"torch_cuda": None if value in (None, "None") else value}


def _installed_fingerprint(name: str) -> dict:
    """The installed distribution ``name``: its version and a hash of what is installed: the wheel's
    own sha256 (``direct_url.json``) when pip kept it, else the sha256 of its RECORD (which lists
    the hash of every installed file, so it changes with any file of the wheel)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return {"version": None, "sha256": None, "record_sha256": None, "reason": f"{name} is not installed in this venv"}
    out = {"version": dist.version, "sha256": None, "record_sha256": None}
    direct = dist.read_text("direct_url.json")
    if direct:
        try:
            info = json.loads(direct).get("archive_info") or {}
            hashes = info.get("hashes") or {}
            out["sha256"] = hashes.get("sha256") or (str(info.get("hash", "")).split("=", 1)[1]
                                                     if str(info.get("hash", "")).startswith("sha256=") else None)
        except ValueError:
            pass
    record = dist.read_text("RECORD")
    if record:
        out["record_sha256"] = hashlib.sha256(record.encode()).hexdigest()
    return out


def weights_fingerprint(model_path: str) -> dict:
    """The model_weights stage's marker (``.dsv4kit-weights.json``) in the model directory, reduced
    to what identifies the weights: repository, revision, and each file's size and digest (not the
    mtimes, which a copy changes). ``fingerprint`` is the sha256 of that manifest."""
    path = os.path.join(model_path, ".dsv4kit-weights.json")
    try:
        with open(path) as fh:
            marker = json.load(fh)
        files = marker["files"]
        manifest = {"repo": marker.get("repo"), "revision": marker.get("revision"),
                    "files": {n: {k: v for k, v in rec.items() if k in ("size", "sha256", "blob_id")}
                              for n, rec in sorted(files.items())}}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return {"fingerprint": None, "marker": path,
                "reason": f"no usable weights marker {path} (the model_weights stage writes it): {exc}"}
    blob = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return {"fingerprint": hashlib.sha256(blob).hexdigest(), "marker": path, "repo": manifest["repo"],
            "revision": manifest["revision"], "files": len(manifest["files"]),
            "bytes": sum(int(r.get("size") or 0) for r in manifest["files"].values())}


def _sglang_wheel(state_dir: str) -> dict:
    from importlib import metadata

    try:
        dist = metadata.distribution("sglang")
    except metadata.PackageNotFoundError:
        return {"sha256": None, "source": None, "reason": "sglang not installed in this venv"}
    direct = dist.read_text("direct_url.json")
    if direct:
        try:
            info = json.loads(direct).get("archive_info") or {}
            hashes = info.get("hashes") or {}
            if "sha256" in hashes:
                return {"sha256": hashes["sha256"], "source": "direct_url.json"}
            if str(info.get("hash", "")).startswith("sha256="):
                return {"sha256": info["hash"].split("=", 1)[1], "source": "direct_url.json"}
        except ValueError:
            pass
    version = dist.version
    if state_dir:
        for path in sorted(glob.glob(os.path.join(state_dir, "**", f"sglang-{version}-*.whl"), recursive=True)):
            return {"sha256": _sha256_file(path), "source": f"cached wheel {path}"}
    record = dist.read_text("RECORD")
    if record:
        return {"sha256": None, "record_sha256": hashlib.sha256(record.encode()).hexdigest(),
                "source": "installed RECORD (no wheel file or direct_url hash on the box)"}
    return {"sha256": None, "source": None, "reason": "no wheel hash available"}


def _gpus() -> dict:
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "reason": "nvidia-smi not found on PATH", "model": None, "count": None}
    fields = "index,name,uuid,driver_version,memory.total,power.limit,compute_cap"
    out, err = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if out is None:
        return {"available": False, "reason": err, "model": None, "count": None}
    rows = [r for r in csv.reader(io.StringIO(out)) if r]
    gpus = []
    for row in rows:
        row = [c.strip() for c in row]
        gpus.append(dict(zip(fields.split(","), row)))
    header, _ = _run(["nvidia-smi"])
    cuda_driver = None
    if header:
        match = re.search(r"CUDA Version:\s*([0-9.]+)", header)
        cuda_driver = match.group(1) if match else None
    topo, topo_err = _run(["nvidia-smi", "topo", "-m"])
    names = sorted({g.get("name") for g in gpus})
    return {
        "available": True,
        "settings": gpu_settings()["devices"],
        "model": names[0] if len(names) == 1 else names,
        "count": len(gpus),
        "driver": gpus[0].get("driver_version") if gpus else None,
        "cuda_driver_version": cuda_driver,
        "compute_cap": gpus[0].get("compute_cap") if gpus else None,
        "devices": gpus,
        "topology": (topo or topo_err or "")[:4000],
    }


def _boot_time():
    try:
        for line in open("/proc/stat"):
            if line.startswith("btime "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _started_at(entry: str, btime):
    """When the process started (epoch seconds), from /proc/<pid>/stat (readable for any user)."""
    if btime is None:
        return None
    try:
        text = open(os.path.join(entry, "stat")).read()
        ticks = int(text[text.rindex(")") + 2:].split()[19])  # field 22, starttime in clock ticks
        return round(btime + ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None


def _serving_processes() -> list:
    found = []
    btime = _boot_time()
    for entry in glob.glob("/proc/[0-9]*"):
        try:
            with open(os.path.join(entry, "cmdline"), "rb") as fh:
                argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
        except OSError:
            continue
        joined = " ".join(argv)
        if not any(marker in joined for marker in SERVER_MARKERS):
            continue
        proc = {"pid": int(os.path.basename(entry)), "argv": argv, "started_at": _started_at(entry, btime)}
        try:
            with open(os.path.join(entry, "environ"), "rb") as fh:
                pairs = [p.decode("utf-8", "replace").split("=", 1) for p in fh.read().split(b"\0") if b"=" in p]
            proc["env"] = {k: v for k, v in pairs if k.startswith(ENV_PREFIXES)}
        except OSError as exc:
            proc["env"] = None
            proc["env_reason"] = f"cannot read /proc/{proc['pid']}/environ ({exc.strerror}); run as root or the service user"
        found.append(proc)
    found.sort(key=lambda p: p["pid"])
    return found


def _units(unit_dir: str) -> dict:
    """The dsv4 serving units as written by the playbook: environment (files + Environment=) and ExecStart."""
    units = {}
    if not unit_dir:
        return units
    for path in sorted(glob.glob(os.path.join(unit_dir, "dsv4-*.service"))):
        name = os.path.basename(path)[: -len(".service")]
        try:
            unit = unit_env.read_unit(path)
        except OSError as exc:
            units[name] = {"path": path, "env": {}, "env_files": [], "missing_env_files": [], "exec_start": None,
                           "error": str(exc)}
            continue
        unit["env"] = {k: v for k, v in unit["env"].items() if k.startswith(ENV_PREFIXES)}
        units[name] = unit
    return units


def _model(model_path: str) -> dict:
    info = {"local_path": model_path, "exists": os.path.isdir(model_path)}
    match = re.search(r"snapshots/([0-9a-f]{40})", os.path.realpath(model_path))
    info["snapshot_revision"] = match.group(1) if match else None
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"):
        path = os.path.join(model_path, name)
        info[name.replace(".", "_") + "_sha256"] = _sha256_file(path) if os.path.isfile(path) else None
    return info


def _host() -> dict:
    info = {
        "hostname_sha256": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:16],
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "os": None,
        "cpu_model": None,
        "ram_gb": None,
    }
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                info["os"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        info["cpu_count"] = os.cpu_count()
    except OSError:
        pass
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                info["ram_gb"] = round(int(line.split()[1]) / (1024 * 1024), 1)
    except OSError:
        pass
    return info


def _decision(path: str) -> dict:
    """The kernel_rollout role's decision file (which report decided the kernel flags), as found."""
    if not path:
        return {"path": None, "data": None, "reason": "no decision file path given"}
    try:
        with open(path, encoding="utf-8") as fh:
            return {"path": path, "data": json.load(fh)}
    except FileNotFoundError:
        return {"path": path, "data": None, "reason": f"no {path}: the flags were not set by dsv4kit provision"}
    except (OSError, ValueError) as exc:
        return {"path": path, "data": None, "reason": f"{path} is unreadable: {exc}"}


def cmd_probe(args) -> dict:
    return {
        "ok": True,
        "host": _host(),
        "packages": _versions(),
        "cuda": _torch_cuda(),
        "sglang_wheel": _sglang_wheel(args.state_dir),
        "gpus": _gpus(),
        "processes": _serving_processes(),
        "units": _units(args.unit_dir),
        "restart_pending": os.path.exists(os.path.join(args.state_dir, "restart-pending")) if args.state_dir else None,
        "kernel_decision": _decision(args.decision_file),
        "model": _model(args.model_path),
        "weights": weights_fingerprint(args.model_path),
        "dsv4kit_wheel": _installed_fingerprint("dsv4kit"),
        "client_env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="box_helper", description="Box-side helper of dsv4kit bench.")
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
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines (0: none)")
    p.add_argument("--idle-timeout", type=float, default=120.0,
                   help="seconds to wait for idle servers before the point (negative: do not check)")
    p.add_argument("client", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "run-point":
        return cmd_run_point(args)
    handler = {"server-info": cmd_server_info, "wait-health": cmd_wait_health, "probe": cmd_probe,
               "prefill-point": cmd_prefill_point}[args.command]
    result = handler(args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
