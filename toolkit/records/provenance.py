"""Provenance of a bench record: this toolkit's commit, and the box facts the probe gathered.

The box side is ``dsv4kit.serving.box probe`` (run there with the SGLang venv python); this module
turns its JSON plus the inventory and ``/server_info`` into the record's ``toolkit``, ``host``,
``gpus``, ``software``, ``model`` and ``server`` sections. Everything passes through
``dsv4kit.core.scrub`` on the way.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

from dsv4kit import __version__
from dsv4kit.records.record import decode_info, resolved_args, sha256_json
from dsv4kit.core.paths import REPO_ROOT
from dsv4kit.core.scrub import scrub
from dsv4kit.records.served_flags import decode_process, software_fields



def toolkit_info(argv: Optional[list[str]] = None) -> dict:
    """Version, git commit and dirty flag of the dsv4kit checkout running this (if it is one)."""
    info = {"name": "dsv4kit", "version": __version__, "git_commit": None, "git_dirty": None,
            "cli_argv": scrub(list(argv if argv is not None else sys.argv))}
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=30)
        if commit.returncode != 0:
            info["git_reason"] = "not a git checkout (installed package)"
            return info
        info["git_commit"] = commit.stdout.strip()
        status = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=60)
        info["git_dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["git_reason"] = f"git unavailable: {exc}"
    return info


def serving_gpu_count(host) -> Optional[int]:
    """GPUs the deployment serves on: prefill + decode GPU sets, else dsv4_gpu_count."""
    gpus = set(host.get("dsv4_prefill_gpus") or []) | set(host.get("dsv4_decode_gpus") or [])
    return len(gpus) or host.get("dsv4_gpu_count")


def _launch_args(server_info: dict, processes: list[dict]) -> list[str]:
    launch = server_info.get("launch_command")
    if isinstance(launch, list):
        return [str(a) for a in launch]
    if isinstance(launch, str) and launch:
        try:
            return shlex.split(launch)  # a quoted argument stays one argument
        except ValueError:  # unbalanced quotes: keep the words rather than lose the record
            return launch.split()
    for proc in processes:
        if any("launch_server" in a for a in proc.get("argv") or []):
            return list(proc["argv"])
    return []


def _server_args(server_info: dict, processes: list[dict]) -> dict:
    launch_args = scrub(_launch_args(server_info, processes))
    resolved = resolved_args(server_info)
    return {
        "launch_args": launch_args,
        "launch_args_sha256": sha256_json(launch_args) if launch_args else None,
        "resolved_args": resolved,
        "resolved_args_sha256": sha256_json(resolved) if resolved is not None else None,
    }


def model_section(host, probe: dict, server_info: dict) -> dict:
    """The record's ``model`` section (``bench.planned_record`` builds it before the probe, from the inventory)."""
    model_path = host.get("dsv4_model_path") or server_info.get("model_path") or ""
    weights = probe.get("weights") or {}
    return {
        "name": os.path.basename(str(model_path).rstrip("/")) or None,
        "path": model_path,
        "revision": host.get("dsv4_model_revision"),
        **{k: v for k, v in (probe.get("model") or {}).items() if k not in ("local_path",)},
        "weights_fingerprint": weights.get("fingerprint"),
        "weights": weights or None,
    }


def sections(*, host, probe: dict, server_info: dict, context_length: int, restarted: bool,
             prefill_server_info: Optional[dict] = None) -> dict:
    """The record sections that describe where and on what the sweep ran (scrubbed).

    ``server_info`` is the decode server's; ``prefill_server_info`` (PD layouts) the prefill's.
    """
    probe = scrub(probe or {})
    server_info = decode_info(scrub(server_info or {}))
    packages = probe.get("packages") or {}
    gpus = dict(probe.get("gpus") or {"available": False, "reason": "no probe", "model": None, "count": None})
    gpus["serving_count"] = serving_gpu_count(host)
    gpus["expected_count"] = host.get("dsv4_gpu_count")
    processes = probe.get("processes") or []
    units = probe.get("units") or {}
    server_env: dict = {}
    env_reasons = []
    env_source = None
    # The decode server's own environment (each process's is kept in server.processes[].env):
    # merging them would take e.g. CUDA_VISIBLE_DEVICES from whichever process came last.
    decode = decode_process(processes, host.get("dsv4_decode_port"))
    if decode is not None and decode.get("env") is not None:
        server_env = dict(decode["env"])
        env_source = f"process environment of the decode server (/proc/{decode.get('pid')}/environ)"
    elif decode is not None and decode.get("env_reason"):
        env_reasons.append(decode["env_reason"])
    elif processes:
        env_reasons.append(f"none of the {len(processes)} serving process(es) is the decode server "
                           f"(--port {host.get('dsv4_decode_port')}); see server.processes[].env")
    if env_source is None and units:
        # The decode process's environment is not readable as the SSH user (or it was not found):
        # take what the units (and their environment files) give the decode server.
        unit = units.get("dsv4-decode") or next(iter(units.values()))
        server_env = dict(unit.get("env") or {})
        env_source = f"unit {unit.get('path')} and its environment files"
    if not server_env and not env_reasons and not processes and not units:
        env_reasons.append("no serving process or dsv4-*.service unit found on the box")
    host_info = {"name": host.name, **(probe.get("host") or {})}
    software = {
        "sglang_version": packages.get("sglang") or server_info.get("version"),
        "sglang_wheel": probe.get("sglang_wheel"),
        "python": (probe.get("host") or {}).get("python"),
        "torch": packages.get("torch"),
        "torch_cuda": (probe.get("cuda") or {}).get("torch_cuda"),
        "triton": packages.get("triton"),
        "transformers": packages.get("transformers"),
        "sgl_kernel": packages.get("sgl-kernel"),
        "flashinfer": packages.get("flashinfer-python"),
        "dsv4kit_wheel": probe.get("dsv4kit_wheel") or {"version": None, "sha256": None, "reason": "not probed"},
        "packages": packages,
        "server_env": server_env if (server_env or not env_reasons) else None,
        "server_env_source": env_source,
        "server_env_reason": None if server_env else ("; ".join(sorted(set(env_reasons))) or None),
        "client_env": probe.get("client_env"),
        **software_fields(host, probe),
    }
    model = model_section(host, probe, server_info)
    server = {
        "context_length": context_length,
        "router_port": host.get("dsv4_router_port"),
        "decode_port": host.get("dsv4_decode_port"),
        "prefill_port": host.get("dsv4_prefill_port"),
        **_server_args(server_info, processes),
        "prefill": None,
        "startup_time": server_info.get("startup_time"),
        "version": server_info.get("version"),
        "max_total_num_tokens": server_info.get("max_total_num_tokens"),
        "max_running_requests": server_info.get("max_running_requests"),
        "restarted_for_context_length": restarted,
        "processes": [{"pid": p.get("pid"), "argv": p.get("argv"), "env": p.get("env"),
                       **({"env_reason": p["env_reason"]} if p.get("env_reason") else {})} for p in processes],
        "units": {name: {"path": u.get("path"), "exec_start": u.get("exec_start"), "env": u.get("env"),
                         "env_files": u.get("env_files"), "missing_env_files": u.get("missing_env_files")}
                  for name, u in units.items()},
    }
    if prefill_server_info:
        prefill = scrub(prefill_server_info)
        server["prefill"] = {"context_length": prefill.get("context_length"),
                             "startup_time": prefill.get("startup_time"),
                             **_server_args(prefill, [])}
    return {"host": host_info, "gpus": gpus, "software": software, "model": model, "server": server}
