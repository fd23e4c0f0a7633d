"""Record assembly: one point's evidence into its record entry, and the points into the record.

``measured_point`` turns what the box returned for one point (the client's line and
``dsv4box run-point``'s evidence) into the point's entry: the exact-occupancy window
(``dsv4kit.bench.window``), the gates (``dsv4kit.bench.gates``), the latency block and the
derived numbers. ``not_run_point`` is the entry of a point whose servers were busy before it.
``build_record`` assembles the record from the sweep's state (``SweepState``).
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from dsv4kit.bench.config import CLIENT_MODULE, SweepConfig, client_section
from dsv4kit.bench.conservation import analyze as second_sources
from dsv4kit.bench.gates import PointExpectation, effective_max_running, evaluate
from dsv4kit.bench.gpu_throttle import apply_throttle_gate
from dsv4kit.bench.metrics import cross_check
from dsv4kit.bench.slo import latency_block
from dsv4kit.bench.window import analyze as analyze_window
from dsv4kit.core.scrub import scrub
from dsv4kit.records.record import (KIND, SCHEMA_VERSION, comparability_key, decode_info, derive, dumps,
                                    split_client_line, strict_json, summarize_points)
from dsv4kit.serving.session import context_length_of


@dataclass
class SweepResult:
    record: dict
    details: dict[str, dict]  # details file name -> per-request arrays

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    @property
    def tag(self) -> str:
        return self.record["tag"]

    def files(self) -> dict[str, bytes]:
        """Repository paths -> bytes: the record and its gzipped details (deterministic bytes)."""
        base = f"records/{self.run_id}"
        out = {f"{base}/record.json": dumps(self.record).encode()}
        for name, details in sorted(self.details.items()):
            data = json.dumps(strict_json(scrub(details)), separators=(",", ":"), allow_nan=False).encode()
            out[f"{base}/{name}"] = gzip.compress(data, mtime=0)
        return out



def _num(value, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


_context_of = context_length_of



def _provenance_differs(first: dict, later: dict) -> list[str]:
    """Which provenance facts of a later server start differ from the first start's."""
    paths = (("software", "packages"), ("software", "sglang_wheel"), ("software", "dsv4kit_wheel"),
             ("software", "kernel_flags"), ("model", "weights_fingerprint"), ("server", "launch_args_sha256"),
             ("server", "resolved_args_sha256"), ("gpus", "driver"))
    return [".".join(p) for p in paths if (first.get(p[0]) or {}).get(p[1]) != (later.get(p[0]) or {}).get(p[1])]



def format_summary(record: dict) -> str:
    summary = record["summary"]
    if summary.get("per_arm"):
        ab = record.get("ab") or {}
        blocks = []
        for arm, per_c in summary["per_arm"].items():
            blocks.append(f"arm {arm}: {ab.get('key')}={(ab.get('values') or {}).get(arm)}")
            blocks.append(_summary_table(per_c["per_concurrency"]))
        if ab.get("summary") is not None:
            blocks.append(f"A/B (B against A): {ab.get('outcome')}: {ab.get('summary')}")
        return "\n".join(blocks) + _prefill_table(record.get("prefill"))
    return _summary_table(summary["per_concurrency"]) + _prefill_table(record.get("prefill"))


def _prefill_table(prefill: Optional[dict]) -> str:
    """``bench --prefill``'s lines under the table (empty without it)."""
    if not prefill:
        return ""
    def num(value, digits):
        return "INVALID" if value is None else f"{value:.{digits}f}"

    if "arms" in prefill:
        lines = ["", f"{'prompt':>8} {'cold tok/s A':>13} {'B':>10} {'B/A':>6} {'TTFT s A':>9} {'B':>8} {'B/A':>6}"
                 "  (the prefill server's counters)"]
        for length, e in prefill.get("per_length", {}).items():
            rate, ttft = e["tokens_per_s"], e["ttft_s"]
            lines.append(f"{length:>8} {num(rate['A'], 1):>13} {num(rate['B'], 1):>10} "
                         f"{num(e['B_over_A_tokens_per_s'], 2):>6} {num(ttft['A'], 3):>9} {num(ttft['B'], 3):>8} "
                         f"{num(e['B_over_A_ttft'], 2):>6}")
        return "\n".join(lines)
    lines = ["", f"{'prompt':>8} {'cold prefill tok/s':>19} {'TTFT s':>8}  (the prefill server's counters)"]
    for length, entry in prefill.get("per_length", {}).items():
        value = "INVALID" if not entry["valid"] else f"{entry['tokens_per_s']:.1f}"
        lines.append(f"{length:>8} {value:>19} {num(entry.get('ttft_s'), 3):>8}")
    return "\n".join(lines)


def _summary_table(per_concurrency: dict) -> str:
    lines = [f"{'C':>5} {'valid':>7} {'decode tok/s':>24} {'per GPU':>9} {'output tok/s':>13} "
             f"{'TTFT p50 ms':>12} {'TPOT p50 ms':>12}"]
    for c, entry in per_concurrency.items():
        dec = entry["decode_tok_s"]

        def m(name: str, digits: int = 1) -> str:
            value = (entry.get(name) or {}).get("mean")
            return "-" if value is None else f"{value:.{digits}f}"

        if dec.get("n"):
            ci = dec.get("ci95")
            dec_text = f"{dec['mean']:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")
        else:
            dec_text = "-"
        lines.append(f"{c:>5} {entry['valid_repetitions']:>3}/{entry['total_repetitions']:<3} {dec_text:>24} "
                     f"{m('decode_tok_s_per_gpu'):>9} {m('output_throughput'):>13} {m('median_ttft_ms'):>12} "
                     f"{m('median_tpot_ms', 2):>12}")
    return "\n".join(lines)

@dataclass
class SweepState:
    """What a running sweep has so far: the record is assembled from it after every point."""

    cfg: SweepConfig
    run_id: str
    tag: str
    created: datetime
    started: float
    argv: Optional[list]
    total: int
    ab: Any = None
    points: list = field(default_factory=list)
    details: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    extras: dict = field(default_factory=dict)
    probe: dict = field(default_factory=dict)
    base_url: str = ""
    first_provenance: dict = field(default_factory=dict)
    starts: list = field(default_factory=list)
    arm_provenance: dict = field(default_factory=dict)
    slo: Optional[dict] = None
    #: Seconds each finished point took (the ETA of the rest).
    point_seconds: list = field(default_factory=list)


def arm_comparison(record: dict):
    """The A/B verdicts: arm B against arm A, from the one record's points (``dsv4kit.records.compare``)."""
    from dsv4kit.records.compare import compare, select_arm
    from dsv4kit.serving.arms import ABSpec

    sides = {arm: select_arm(record, arm) for arm in ABSpec.arms}
    # One record: the arms differ by design, in the A/B key itself (served_flags.key_value names both,
    # and a server flag changes the launch arguments).
    return compare(sides["A"], sides["B"], ignore=("kernel_flags", "launch_args"))


def build_record(s: SweepState, incomplete: Optional[str] = None) -> SweepResult:
    """The record of the sweep so far (``incomplete``: why it stopped early)."""
    from dsv4kit.records.provenance import toolkit_info

    cfg, points = s.cfg, s.points
    finished = datetime.now(timezone.utc)
    invalid = sum(1 for p in points if not p["validity"]["passed"])
    record_notes = list(s.notes)
    if invalid:
        record_notes.append(f"{invalid} of {len(points)} points failed a validity gate; they are excluded "
                            f"from the summary")
    if incomplete:
        record_notes.append(f"INCOMPLETE: the sweep stopped after {len(points)} of {s.total} points: {incomplete}")
    record = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "run_id": s.run_id,
        "tag": s.tag,
        "created_at_utc": s.created.isoformat(timespec="seconds"),
        "finished_at_utc": finished.isoformat(timespec="seconds"),
        "duration_wall_s": round(time.time() - s.started, 3),
        "toolkit": toolkit_info(s.argv),
        **s.first_provenance,
        "client": client_section(cfg, tool_version=(s.probe.get("packages") or {}).get("sglang"),
                                 base_url=s.base_url),
        "starts": list(s.starts) if s.ab is None else None,
        "sweep": {"concurrency": list(cfg.concurrency), "repeat": cfg.repeat, "order": "repetition-major",
                  "restarts": cfg.restarts,
                  "point_timeout_s": cfg.point_timeout_s, "metrics_interval_s": cfg.metrics_interval_s,
                  "gates": cfg.gates.to_dict(), "slo": s.slo},
        "points": list(points),
        "summary": summarize_points(points) if s.ab is None else {
            "per_concurrency": {}, "per_arm": {arm: summarize_points([p for p in points if p.get("arm") == arm])
                                               for arm in s.ab.arms}},
        "validity_passed": invalid == 0 and bool(points) and not incomplete,
        "invalid_points": invalid,
        "incomplete": bool(incomplete),
        "incomplete_reason": incomplete,
        "notes": record_notes,
    }
    record.update(s.extras)
    prefill = s.extras.get("prefill")
    if prefill is not None and not prefill.get("valid"):
        record["validity_passed"] = False
        bad = [k for k, e in prefill["per_length"].items() if not e["valid"]]
        record["notes"].append(f"--prefill: the cold prefill at {', '.join(bad)} tokens is invalid (see prefill)")
    record["comparability_key"] = comparability_key(record)
    if s.ab is not None:
        record["ab"] = s.ab.to_dict()
        record["ab"]["provenance"] = dict(s.arm_provenance)
        comparison = arm_comparison(record)
        record["ab"]["comparison"] = comparison.to_dict()
        record["ab"]["outcome"] = comparison.outcome
        record["ab"]["summary"] = comparison.summary()
    return SweepResult(record=scrub(record), details=dict(s.details))



@dataclass
class PointContext:
    """The sweep-wide facts a point is judged against."""

    decode_port: int
    prefill_port: Optional[int]
    metrics_ports: list
    serving_gpus: Optional[int]
    #: The record's model: ``{"path", "served_name", "revision"}`` (``dsv4kit.serving.served_model``).
    model: Optional[dict] = None


def measured_point(s: SweepState, ctx: PointContext, current: dict, *, c: int, rep: int, arm: Optional[str],
                   n: int, argv_point: list, wall: float, line: dict, evidence: dict) -> dict:
    """The record entry of a point the client ran; its per-request details go into ``s.details``."""
    cfg = s.cfg
    suffix = f"_{arm}" if arm else ""
    limits = decode_info(current["info"])
    expected = PointExpectation(num_prompts=n, input_len=cfg.input_len, output_len=cfg.output_len,
                                max_concurrency=c, startup_time=current["startup_time"],
                                prefill_port=ctx.prefill_port,
                                prefill_startup_time=current["prefill_startup_time"],
                                max_running_requests=effective_max_running(current["info"]),
                                max_total_num_tokens=limits.get("max_total_num_tokens"),
                                model=ctx.model, api=cfg.api)
    window = analyze_window(line, c, evidence, ctx.decode_port, cfg.gates)
    problem = cross_check(evidence, ctx.decode_port)
    if problem:
        window["parse_problem"] = problem
    window["sources"] = second_sources(line, evidence, decode_port=ctx.decode_port, metrics_ports=ctx.metrics_ports,
                                       num_prompts=n, concurrency=c,
                                       server_info=decode_info(line.get("server_info") or {}) or limits,
                                       occupancy=window.get("occupancy"), headline=window.get("decode_tok_s"),
                                       api=cfg.api)
    validity = evaluate(line, expected, cfg.gates, evidence, window)
    latency = latency_block(line, s.slo)
    raw, point_details, _ = split_client_line(line)
    derived = derive(raw, ctx.serving_gpus, window, latency)
    details_file = f"details/c{c}_r{rep}{suffix}.json.gz"
    point_details["metrics_samples"] = evidence.get("samples") or []
    telemetry = evidence.get("telemetry") or {"available": False, "reason": "not collected"}
    apply_throttle_gate(validity, telemetry)
    point_details["gpu_telemetry_samples"] = telemetry.get("samples") or []
    s.details[details_file] = point_details
    return {
        "max_concurrency": c, "repetition": rep, "num_prompts": n, **({"arm": arm} if arm else {}),
        "warmup_requests": cfg.warmup_for(c), "server_start": current["start"],
        "argv": argv_point, "wall_s": round(wall, 3), "raw": raw, "details_file": details_file,
        "derived": derived, "validity": validity, "window": window, "latency": latency,
        "server_evidence": {"metrics_ports": ctx.metrics_ports, "interval_s": cfg.metrics_interval_s,
                            "samples": len(evidence.get("samples") or ()),
                            "scrape_errors": evidence.get("scrape_errors") or {},
                            "meta_info": evidence.get("meta_info"),
                            "served_model": evidence.get("served_model"),
                            "startup_after": evidence.get("startup_after")},
        "gpu_telemetry": {k: v for k, v in telemetry.items() if k != "samples"},
    }


def not_run_point(s: SweepState, ctx: PointContext, current: dict, *, c: int, rep: int, arm: Optional[str],
                  n: int, argv_point: list, wall: float, evidence: dict) -> dict:
    """The servers were busy with another client's load: the point is invalid, never run."""
    idle = evidence.get("idle_before") or {}
    detail = idle.get("detail") or "the servers were not idle before the point"
    return {
        "max_concurrency": c, "repetition": rep, "num_prompts": n, **({"arm": arm} if arm else {}),
        "warmup_requests": s.cfg.warmup_for(c), "server_start": current["start"], "not_run": True,
        "argv": argv_point, "wall_s": round(wall, 3), "raw": {}, "details_file": None,
        "derived": derive({}, ctx.serving_gpus, None, None), "window": {}, "latency": None,
        "validity": {"passed": False, "failed": ["idle"], "gates": {"idle": {"passed": False, "detail": detail}},
                     "retok_ratio": None, "achieved_concurrency_ratio": None, "cache_hit_pct": None,
                     "errors": 0},
        "server_evidence": {"metrics_ports": ctx.metrics_ports, "idle_before": idle},
    }


def point_line(label: str, point: dict, wall: float) -> str:
    """The progress line of a finished point."""
    derived, raw, window, validity = point["derived"], point["raw"], point["window"], point["validity"]
    verdict = "valid" if validity["passed"] else f"INVALID ({', '.join(validity['failed'])})"
    occupancy = window.get("occupancy") or {}
    share = occupancy.get("exact_share")
    spec = (f", acceptance {_num(derived.get('acceptance_length'), 2)}"
            if derived.get("acceptance_length") is not None else "")
    return (f"{label}: decode {_num(derived.get('decode_tok_s'))} tok/s, "
            f"{_num(derived.get('forward_passes_per_s'))} passes/s{spec} (exact occupancy "
            f"{'-' if share is None else f'{100 * share:.0f}%'} of {occupancy.get('window_scrapes') or 0} scrapes), "
            f"output {_num(raw.get('output_throughput'))} tok/s, TTFT p50 {_num(raw.get('median_ttft_ms'))} ms, "
            f"TPOT p50 {_num(raw.get('median_tpot_ms'), 2)} ms [{wall:.0f}s]: {verdict}")
