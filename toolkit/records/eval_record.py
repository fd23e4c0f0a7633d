"""The eval record: one JSON document per ``dsv4kit eval`` run (kind ``dsv4kit-eval``), built and
checked here, next to the bench record it shares provenance and repository with.

Layout (docs/quality.md has the field-by-field description)::

    schema_version, kind, run_id, tag, created_at_utc, finished_at_utc, duration_wall_s,
    toolkit, host, gpus, software, model, server   (arm A's start, as in a bench record),
    eval{context_length, quick, seed, spec{logprob, needles, tasks}, tasks_source, thresholds},
    ab{key, kind, values} or null,
    arms{A: {setting, provenance_sha256, software{kernel_flags...}, paths, plugin, timings_s,
             details_file}, B: ...},
    checks[{check, outcome, why, ...numbers}], outcome,
    evidence{kernels_sha256, served_config, served_config_sha256, gpu_models, driver,
             ran_with{dsv4_fp4_indexer as the arms ran it, where it decides with the A/B key}},
    comparability_key{...}, notes[]

The raw answers of each arm go to ``details/arm-<A|B>.json.gz`` beside the record.
"""

from __future__ import annotations

from typing import Any, Optional

from dsv4kit.records.record import RecordError, launch_key, sha256_json

KIND = "dsv4kit-eval"
SCHEMA_VERSION = 1
TAG_PREFIX = "eval/"

#: Inventory variables that decide what the servers serve (and so whether quality evidence still
#: holds). Kernel flags are not among them: the A/B key is the flag under test.
SERVED_VARS = ("dsv4_sglang_version", "dsv4_torch_version", "dsv4_triton_version", "dsv4_model", "dsv4_model_repo",
               "dsv4_model_revision", "dsv4_context_length", "dsv4_prefill_gpus", "dsv4_decode_gpus",
               "dsv4_cuda_graph_max_bs_decode", "dsv4_mem_fraction_static", "dsv4_max_running_requests",
               "dsv4_server_extra_args", "dsv4_disaggregation_transfer_backend")
#: Prefixes of serving choices added by later settings (model choice, speculative decoding, FP4 cache).
SERVED_PREFIXES = ("dsv4_model_drafter", "dsv4_draft", "dsv4_speculative", "dsv4_spec_", "dsv4_fp4",
                   "dsv4_indexer")


#: Inventory settings an A/B may change (``bench``/``eval --ab KEY=...``: dsv4kit.serving.arms).
SETTING_KEYS = ("dsv4_fp4_indexer",)


def served_config(host, *, without_arg: Optional[str] = None, without_var: Optional[str] = None) -> dict:
    """The inventory's serving configuration of ``host`` (``SERVED_VARS`` and ``SERVED_PREFIXES``).
    ``without_arg``: a server flag left out of the extra arguments; ``without_var``: an inventory
    setting left out (either: the A/B key under test, whose value the arms set)."""
    names = set(SERVED_VARS) | {k for k in getattr(host, "vars", {}) if k.startswith(SERVED_PREFIXES)}
    names.discard(without_var)
    config = {name: host.get(name) for name in sorted(names)}
    if without_arg:
        config["dsv4_server_extra_args"] = _without(config.get("dsv4_server_extra_args") or [], without_arg)
    return config


def _without(args: list, flag: str) -> list:
    kept, skip = [], False
    for item in (str(a) for a in args):
        if skip:
            skip = False
        elif item == flag:
            skip = True
        elif not item.startswith(flag + "="):
            kept.append(item)
    return kept


def comparability_key(record: dict) -> dict:
    """Two eval records compare only when all of these are equal (``records compare``)."""
    ev, gpus, model = record.get("eval") or {}, record.get("gpus") or {}, record.get("model") or {}
    software = record.get("software") or {}
    return {
        "model": model.get("name"), "model_revision": model.get("revision"),
        "weights": model.get("weights_fingerprint"), "gpu_model": gpus.get("model"),
        "gpu_count": gpus.get("serving_count"), "driver": gpus.get("driver"),
        "context_length": ev.get("context_length"), "seed": ev.get("seed"), "quick": ev.get("quick"),
        "spec": sha256_json(ev.get("spec"))[:16], "tasks": (ev.get("tasks_source") or {}).get("sha256"),
        "thresholds": sha256_json(ev.get("thresholds"))[:16],
        "sglang_wheel": (software.get("sglang_wheel") or {}).get("sha256"),
        "launch_args": launch_key((record.get("server") or {}).get("launch_args")),
    }


def is_eval(record: Any) -> bool:
    return isinstance(record, dict) and record.get("kind") == KIND


def check(record: Any, where: str = "record") -> dict:
    """Raise RecordError unless ``record`` is an eval record this dsv4kit reads; return it."""
    if not is_eval(record):
        raise RecordError(f"{where}: not a dsv4kit eval record")
    if record.get("schema_version") != SCHEMA_VERSION:
        raise RecordError(f"{where}: eval schema_version {record.get('schema_version')!r} is not supported "
                          f"(this dsv4kit reads {SCHEMA_VERSION})")
    for field in ("run_id", "checks", "outcome", "arms", "eval", "evidence", "comparability_key"):
        if field not in record:
            raise RecordError(f"{where}: missing field {field!r}")
    return record


def format_record(record: dict) -> str:
    """``records show`` of an eval record: provenance, the arms and what each ran, the checks."""
    ev, ab = record["eval"], record.get("ab")
    lines = [f"{record['run_id']}  (tag {record.get('tag')}, eval schema {record['schema_version']})",
             f"created {record.get('created_at_utc')}, {record.get('duration_wall_s', 0):.0f} s; host "
             f"{(record.get('host') or {}).get('name')}: {(record.get('gpus') or {}).get('model')}, driver "
             f"{(record.get('gpus') or {}).get('driver')}",
             f"model {(record.get('model') or {}).get('name')} @ {(record.get('model') or {}).get('revision')}; "
             f"context length {ev.get('context_length')}{' (quick set)' if ev.get('quick') else ''}; seed "
             f"{ev.get('seed')}; tasks {(ev.get('tasks_source') or {}).get('name')}"]
    if ab:
        lines.append(f"A/B: {ab['key']} A={ab['values']['A']} B={ab['values']['B']}")
    for arm, body in record["arms"].items():
        spec = (f"; {body['speculative_algorithm']}, acceptance length {body.get('avg_spec_accept_length')}"
                if body.get("speculative_algorithm") else "")
        lines.append(f"arm {arm}: {body.get('setting') or 'as served'}; kernel flags "
                     f"{(body.get('software') or {}).get('kernel_flags')}; {body.get('paths') or ''}{spec}")
        if "gpu_telemetry" in body:
            from dsv4kit.records.gpu_telemetry import telemetry_line

            lines.append(f"    {telemetry_line(body['gpu_telemetry'], body['gpu_telemetry'].get('gpu_throttle'))}")
    lines.append("")
    for c in record["checks"]:
        lines.append(f"{c['check']:<14} {c['outcome'].upper():<13} {c['why']}")
    lines.append(f"outcome: {record['outcome'].upper()}")
    for note in record.get("notes") or []:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def list_row(entry, record: dict) -> dict:
    """``records list``'s row for an eval record."""
    return {"run_id": entry.run_id, "tag": entry.tag, "kind": "eval",
            "context_length": (record.get("eval") or {}).get("context_length"),
            "ab": (record.get("ab") or {}).get("key"), "outcome": record.get("outcome"),
            "created_at_utc": record.get("created_at_utc")}
