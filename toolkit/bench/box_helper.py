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
#: Scraped metrics: name -> how series (tp/dp ranks, is_streaming) combine into one number.
METRICS = {"sglang:num_running_reqs": "sum", "sglang:num_queue_reqs": "sum", "sglang:gen_throughput": "sum",
           "sglang:token_usage": "max", "sglang:generation_tokens_total": "sum",
           "sglang:prompt_tokens_total": "sum"}
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict:
    """The Prometheus text of ``/metrics`` -> {short name: value} for the metrics in METRICS."""
    found: dict = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) not in METRICS:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        name = match.group(1).split(":", 1)[1]
        if name in found:
            found[name] = found[name] + value if METRICS[match.group(1)] == "sum" else max(found[name], value)
        else:
            found[name] = value
    return found


class Scraper:
    """Poll ``/metrics`` of some ports in a thread until stopped."""

    def __init__(self, ports, interval: float):
        import threading

        self.ports = ports
        self.interval = interval
        self.samples: list = []
        self.errors: dict = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            for port in self.ports:
                try:
                    status, body = http_get(port, "/metrics", 5.0)
                    values = parse_metrics(body)
                    if values:
                        self.samples.append({"t": round(time.time(), 4), "port": port, **values})
                    else:
                        self._error(port, "no sglang: metrics in the answer (is the server started with "
                                          "--enable-metrics?)")
                except urllib.error.HTTPError as exc:
                    self._error(port, f"HTTP {exc.code} from /metrics (is the server started with --enable-metrics?)")
                except Exception as exc:
                    self._error(port, str(getattr(exc, "reason", exc)))
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


def cmd_run_point(args) -> int:
    ports = [int(p) for p in args.metrics_ports.split(",") if p]
    argv = args.client
    if argv and argv[0] == "--":
        argv = argv[1:]
    marker_time = None
    started = time.time()
    telemetry = Telemetry(args.telemetry_ms, args.evidence_out + ".nvsmi.csv")
    with telemetry, Scraper(ports, args.interval) as scraper:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            if marker_time is None and MAIN_RUN_MARKER in line:
                marker_time = time.time()
            sys.stdout.write(line)
            sys.stdout.flush()
        code = proc.wait()
    ended = time.time()
    startup = {}
    for port in ports:
        try:
            _, body = http_get(port, "/server_info", 10.0)
            info = json.loads(body)
            if isinstance(info.get("decode"), list) and info["decode"]:
                info = info["decode"][0]
            startup[str(port)] = {"reported": "startup_time" in info, "startup_time": info.get("startup_time")}
        except Exception as exc:
            startup[str(port)] = {"reported": False, "error": str(getattr(exc, "reason", exc))}
    evidence = {
        "started": started, "ended": ended, "main_run_marker_time": marker_time, "interval_s": args.interval,
        "metrics_ports": ports, "samples": scraper.samples, "scrape_errors": scraper.errors,
        "startup_after": startup,
        "telemetry": telemetry.result(),
        "meta_info": _meta_info_fields(args.probe_port) if args.probe_port and code == 0 else None,
    }
    tmp = args.evidence_out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(evidence, fh)
    os.replace(tmp, args.evidence_out)
    return code


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
    p = sub.add_parser("run-point")
    p.add_argument("--evidence-out", required=True)
    p.add_argument("--metrics-ports", default="")
    p.add_argument("--probe-port", type=int, default=0)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--telemetry-ms", type=int, default=500)
    p.add_argument("client", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "run-point":
        return cmd_run_point(args)
    handler = {"server-info": cmd_server_info, "wait-health": cmd_wait_health, "probe": cmd_probe}[args.command]
    result = handler(args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
