"""The bench record: one JSON document per sweep (schema version 2), built and checked here.

Layout (docs/benchmarking.md has the field-by-field description)::

    schema_version, kind, run_id, tag, created_at_utc, finished_at_utc, duration_wall_s,
    toolkit{name, version, git_commit, git_dirty, cli_argv},
    host{name, hostname_sha256, os, kernel, cpu_model, ram_gb, ...},
    gpus{model, count, serving_count, driver, cuda_driver_version, compute_cap, devices, ...},
    software{sglang_version, sglang_wheel{sha256, source}, python, torch, torch_cuda, triton, ...,
             server_env{SGLANG_*, CUDA_*, NCCL_*} (the decode server's), kernel_flags (what the servers
             ran with), kernel_flags_reason, kernel_flags_servers, kernel_flags_configured, kernel_decision},
    model{path, revision, snapshot_revision, config_json_sha256, tokenizer_json_sha256},
    server{context_length, launch_args, launch_args_sha256, resolved_args, resolved_args_sha256,
           startup_time, restarted, processes[{pid, argv, env}]},
    client{tool, tool_version, api (generate|chat; absent: generate), backend,
           dataset{name, input_len, output_len, range_ratio},
           seed, tokenize_prompt, flush_cache, cache_report, ignore_eos, temperature,
           warmup_requests{C: n}, num_prompts{C: n}},
    sweep{concurrency[], repeat, point_timeout_s, gates{...}},
    points[{max_concurrency, repetition, num_prompts, warmup_requests, argv, wall_s,
            raw (the client's JSONL line minus server_info and per-request arrays),
            details_file, derived{decode_tok_s, decode_tok_s_per_gpu, ...}, validity{...}}],
    summary{per_concurrency{C: {metric: {n, mean, std, cv, ci95, min, max}}}},
    validity_passed, invalid_points, comparability_key{...}, notes[]

Secrets are scrubbed (``dsv4kit.core.scrub``) from everything before it is written.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Iterable, Optional

from dsv4kit.records import served_flags

from dsv4kit.records import stats
from dsv4kit.core.scrub import scrub

SCHEMA_VERSION = 2
KIND = "dsv4kit.bench.sweep"

#: Client result keys that hold per-request arrays; they go to the details side file.
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
               "cached_tokens", "cached_tokens_details")
#: server_info fields that change from start to start or run to run; left out of the args hash.
VOLATILE_SERVER_KEYS = {"startup_time", "internal_states", "kv_events", "host", "port", "pid",
                        "nccl_port", "dist_init_addr", "random_seed", "memory_usage", "last_gen_throughput",
                        "api_key", "admin_api_key", "version", "frontend", "status", "served_at"}
#: Metrics summarised per concurrency (over the valid repetitions) and compared.
SUMMARY_METRICS = ("decode_tok_s", "decode_tok_s_per_gpu", "output_throughput", "total_throughput",
                   "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
                   "concurrency", "goodput_req_s", "forward_passes_per_s", "acceptance_length")
#: Fields of the comparability key (a verdict needs them all equal, see dsv4kit.records.compare).
KEY_FIELDS = ("model", "model_revision", "gpu_model", "gpu_count", "context_length", "dataset",
              "input_len", "output_len", "range_ratio", "tokenize_prompt", "seed", "concurrency",
              "num_prompts", "api", "backend", "client_tool_version", "kernel_flags",
              "sglang_wheel", "sgl_kernel", "flashinfer", "dsv4kit_wheel", "weights", "driver",
              "launch_args", "gates", "warmup_requests")
#: Launch options left out of the ``launch_args`` key: where the server listens, and the context
#: length (its own key field, which ``--baseline-ctx`` lets differ).
LAUNCH_KEY_SKIP = ("--host", "--port", "--context-length", "--api-key", "--admin-api-key", "--dist-init-addr",
                   "--nccl-port")


class RecordError(ValueError):
    """A record file is not a valid dsv4kit bench record."""


def sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def split_client_line(line: dict) -> tuple[dict, dict, Optional[dict]]:
    """The client's JSONL line -> (raw minus server_info and arrays, per-request arrays, server_info)."""
    raw = {k: v for k, v in line.items() if k not in DETAIL_KEYS and k != "server_info"}
    details = {k: line[k] for k in DETAIL_KEYS if k in line and k != "generated_texts"}
    if "generated_texts" in line:
        # The texts themselves are bulky and model output; keep only their lengths.
        details["generated_text_chars"] = [len(t or "") for t in line["generated_texts"]]
    return raw, details, line.get("server_info")


def derive(raw: dict, serving_gpus: Optional[int], window: Optional[dict] = None,
           latency: Optional[dict] = None) -> dict:
    """Decode tok/s: tokens delivered per second in the steady-state window (``window``, from
    ``dsv4kit.bench.window.analyze``), per GPU, and the per-user interactivity (1000 / median TPOT).
    ``tpot_formula_tok_s`` = C x 1000 / median TPOT is kept for reference only: it assumes C
    requests decode together, which a queueing server does not do."""
    concurrency = raw.get("max_concurrency")
    tpot = raw.get("median_tpot_ms")
    decode = (window or {}).get("decode_tok_s")
    per_gpu = (decode / serving_gpus) if (decode is not None and serving_gpus) else None
    out_tps = raw.get("output_throughput")
    return {
        "decode_tok_s": decode,
        "decode_tok_s_per_gpu": per_gpu,
        "tpot_formula_tok_s": (concurrency * 1000.0 / tpot) if (concurrency and tpot) else None,
        "interactivity_tok_s_user": (1000.0 / tpot) if tpot else None,
        "output_tok_s_per_gpu": (out_tps / serving_gpus) if (out_tps is not None and serving_gpus) else None,
        "achieved_concurrency_ratio": (raw.get("concurrency") / concurrency)
        if (raw.get("concurrency") is not None and concurrency) else None,
        "per_gpu_divisor": serving_gpus,
    } | _engine_metrics(window) | (_latency_metrics(latency) if latency is not None else {})


def _engine_metrics(window: Optional[dict]) -> dict:
    """Beside tok/s, what the engine did (a speculative kernel A/B compares the engine, not the
    drafts): ``forward_passes_per_s`` of the decode server in the headline's window, and the
    ``acceptance_length`` it reports (``sglang:spec_accept_length`` in that window, else
    ``/server_info``'s lifetime ``avg_spec_accept_length``; None without speculative decoding)."""
    window = window or {}
    occupancy = window.get("occupancy") or {}
    admissible = bool(occupancy.get("admissible"))
    accept, source = occupancy.get("acceptance_length") if admissible else None, "/metrics sglang:spec_accept_length"
    if accept is None and window.get("server_info_accept_length"):
        accept, source = window["server_info_accept_length"], "/server_info avg_spec_accept_length (server lifetime)"
    return {
        "forward_passes_per_s": occupancy.get("forward_passes_per_s") if admissible else None,
        "acceptance_length": accept,
        "acceptance_length_source": source if accept is not None else None,
        "tokens_per_pass_per_request": occupancy.get("tokens_per_pass_per_request") if admissible else None,
    }


def _latency_metrics(latency: dict) -> dict:
    goodput = latency.get("goodput") or {}
    return {
        "p99_ttft_ms": ((latency.get("ttft_ms") or {}).get("p99") or {}).get("value"),
        "p99_tpot_ms": ((latency.get("tpot_ms") or {}).get("p99") or {}).get("value"),
        "goodput_req_s": goodput.get("goodput_req_s"),
    }


def metric_value(point: dict, metric: str) -> Optional[float]:
    if metric in (point.get("derived") or {}):
        return point["derived"][metric]
    return (point.get("raw") or {}).get(metric)


def summarize_points(points: Iterable[dict]) -> dict:
    """Per concurrency and metric: stats over the *valid* repetitions only."""
    by_c: dict[int, list[dict]] = {}
    for point in points:
        by_c.setdefault(int(point["max_concurrency"]), []).append(point)
    summary = {}
    for c in sorted(by_c):
        valid = [p for p in by_c[c] if p["validity"]["passed"]]
        entry = {"valid_repetitions": len(valid), "total_repetitions": len(by_c[c])}
        for metric in SUMMARY_METRICS:
            values = [metric_value(p, metric) for p in valid]
            entry[metric] = stats.summarize([v for v in values if v is not None])
        summary[str(c)] = entry
    return {"per_concurrency": summary}


def decode_info(server_info: dict) -> dict:
    """The decode server's part of ``/server_info``: a router in front of PD servers answers
    ``{"prefill": [...], "decode": [...]}``, a plain server its own fields."""
    if isinstance(server_info.get("decode"), list) and server_info["decode"]:
        return server_info["decode"][0]
    return server_info


def resolved_args(server_info: Optional[dict]) -> Optional[dict]:
    """``/server_info`` minus volatile fields, scrubbed: what the server was configured to be."""
    if server_info is None:
        return None
    return scrub({k: v for k, v in decode_info(server_info).items() if k not in VOLATILE_SERVER_KEYS})


def record_api(record: dict) -> str:
    """The API a bench record measured: ``generate`` or ``chat`` (``dsv4kit bench --api``); records
    written before the option measured ``generate``."""
    return ((record or {}).get("client") or {}).get("api") or "generate"


def comparability_key(record: dict) -> dict:
    client = record.get("client") or {}
    dataset = client.get("dataset") or {}
    gpus = record.get("gpus") or {}
    model = record.get("model") or {}
    return {
        "model": model.get("name"),
        "model_revision": model.get("revision"),
        "gpu_model": gpus.get("model"),
        "gpu_count": gpus.get("serving_count"),
        "context_length": (record.get("server") or {}).get("context_length"),
        "dataset": dataset.get("name"),
        "input_len": dataset.get("input_len"),
        "output_len": dataset.get("output_len"),
        "range_ratio": dataset.get("range_ratio"),
        "tokenize_prompt": client.get("tokenize_prompt"),
        "seed": client.get("seed"),
        "concurrency": sorted((record.get("sweep") or {}).get("concurrency") or []),
        "num_prompts": client.get("num_prompts"),
        "api": record_api(record),
        "backend": client.get("backend"),
        "client_tool_version": client.get("tool_version"),
        "kernel_flags": served_flags.key_value(record),
        "sglang_wheel": _wheel_hash((record.get("software") or {}).get("sglang_wheel")),
        "sgl_kernel": (record.get("software") or {}).get("sgl_kernel"),
        "flashinfer": (record.get("software") or {}).get("flashinfer"),
        "dsv4kit_wheel": _wheel_hash((record.get("software") or {}).get("dsv4kit_wheel")),
        "weights": model.get("weights_fingerprint"),
        "driver": gpus.get("driver"),
        "launch_args": launch_key((record.get("server") or {}).get("launch_args")),
        "gates": _gates_key((record.get("sweep") or {}).get("gates")),
        "warmup_requests": client.get("warmup_requests"),
    }


def _gates_key(gates) -> Optional[str]:
    """The gate thresholds that decide validity (how long to wait for idle servers does not)."""
    if not isinstance(gates, dict):
        return None
    return sha256_json({k: v for k, v in gates.items() if k != "idle_timeout_s"})[:16]


def _wheel_hash(info) -> Optional[str]:
    """A wheel's sha256, else the hash of its installed RECORD (``box.probe._installed_fingerprint``)."""
    if not isinstance(info, dict):
        return None
    return info.get("sha256") or info.get("record_sha256")


def launch_key(argv) -> Optional[str]:
    """A hash of the server's launch options without LAUNCH_KEY_SKIP (and the program before the
    first option): the same launch arguments give the same value."""
    if not argv:
        return None
    items = [str(a) for a in argv]
    start = next((i for i, a in enumerate(items) if a.startswith("--")), len(items))
    kept, skip = [], False
    for item in items[start:]:
        if skip:
            skip = False
            continue
        name = item.split("=", 1)[0]
        if name in LAUNCH_KEY_SKIP:
            skip = "=" not in item
            continue
        kept.append(item)
    return sha256_json(kept)[:16]


def check(record: Any, where: str = "record") -> dict:
    """Raise RecordError unless ``record`` looks like a schema-1 bench record; return it."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: not a JSON object")
    if record.get("kind") != KIND:
        raise RecordError(f"{where}: kind is {record.get('kind')!r}, expected {KIND!r}")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(f"{where}: schema_version {version!r} is not supported (this dsv4kit reads {SCHEMA_VERSION})")
    for field in ("run_id", "points", "summary", "client", "server", "sweep", "comparability_key"):
        if field not in record:
            raise RecordError(f"{where}: missing field {field!r}")
    api = record_api(record)
    if api not in ("generate", "chat"):
        raise RecordError(f"{where}: client.api is {api!r}, expected 'generate' or 'chat'")
    for i, point in enumerate(record["points"]):
        for field in ("max_concurrency", "repetition", "raw", "derived", "validity"):
            if field not in point:
                raise RecordError(f"{where}: points[{i}] has no {field!r}")
    return record


def strict_json(value: Any) -> Any:
    """Non-finite floats (the client writes ``request_rate: Infinity``) as strings: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def dumps(record: dict) -> str:
    """The record as strict JSON (no NaN/Infinity literals), indented."""
    return json.dumps(strict_json(record), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n"
