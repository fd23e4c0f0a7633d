"""``probe``: the provenance of the box (packages, CUDA, GPUs, serving processes and units, model
files, wheels)."""

from __future__ import annotations

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

from .telemetry import _run, gpu_settings

if __package__.startswith("dsv4kit."):  # imported on the control machine and in the tests
    from dsv4kit.core import unit_env
else:  # run on the box, which may have no dsv4kit: unit_env.py is copied into this package
    from . import unit_env

ENV_PREFIXES = ("SGLANG_", "CUDA_", "NCCL_", "DSV4", "TORCH_", "TRITON_")
PACKAGES = ("sglang", "torch", "triton", "transformers", "tokenizers", "flashinfer-python", "sgl-kernel",
            "deep-gemm", "numpy", "dsv4kit", "sglang-router", "torchvision")
SERVER_MARKERS = ("sglang.launch_server", "sglang_router.launch_router", "sglang.launch_router",
                  "dsv4-router-launch")  # the router unit starts sglang-router through it (key out of argv)


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

