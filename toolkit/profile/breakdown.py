"""Per-rank breakdowns -> one profile; the table; two contexts compared; the class-share gate.

A profile (the ``--json`` output and a bench record's ``profile`` section) holds the ranks'
mean per class, each rank's own breakdown, the step time and throughput. See docs/profiling.md.
"""

from __future__ import annotations

import re
import statistics
from typing import Optional

from dsv4kit.core import exitcodes
from dsv4kit.core.exitcodes import Abort
from dsv4kit.profile.classes import CLASSES

#: A class grows "with the configured context" when its time per step at the large context is at
#: least this many times its time at the small one while the actual lengths are the same.
GROWTH_FLAG = 1.5
#: ... and it is at least this share of the step at the large context (noise in tiny classes is not news).
GROWTH_MIN_SHARE = 0.02


#: What a profile with no indexer kernel by name says (and what a flag on these classes means).
UNNAMED_INDEXER = ("no indexer kernel ran by name: SGLang's torch indexer fallback (SGLANG_OPT_USE_TILELANG_INDEXER=0, "
                   "dsv4kit's indexer off) runs as generic kernels, counted in dense GEMM, elementwise and copies")
FALLBACK_CLASSES = ("dense_gemm", "elementwise", "memcpy")


def combine(ranks: list[dict], **context) -> dict:
    """The ranks' mean per class (each rank runs the same step); the step time is the slowest rank's."""
    if not ranks:
        raise Abort(exitcodes.TOOL_FAILED, "no trace to analyse")
    classes = {}
    for klass in CLASSES:
        us = statistics.fmean(r["classes"][klass]["us_per_step"] for r in ranks)
        impls: dict = {}
        for r in ranks:
            for impl, v in r["classes"][klass]["impls"].items():
                impls[impl] = impls.get(impl, 0.0) + v / len(ranks)
        classes[klass] = {"us_per_step": round(us, 3), "impls": {k: round(v, 3) for k, v in impls.items()}}
    total = sum(c["us_per_step"] for c in classes.values())
    for c in classes.values():
        c["share"] = round(c["us_per_step"] / total, 6) if total else 0.0
    steps = [r["step_time_ms"] for r in ranks if r.get("step_time_ms") is not None]
    unknown: dict = {}
    for r in ranks:
        for u in r["unknown"]:
            unknown[u["name"]] = unknown.get(u["name"], 0.0) + u["us_per_step"] / len(ranks)
    toks = [r["trace_tok_s"] for r in ranks if r.get("trace_tok_s")]
    # Every decode step runs the indexer (DeepSeek-V4's c4 layers). No indexer kernel by name means
    # SGLang's torch fallback ran: its bf16 bmm, multiplies, sums and copies are generic kernels.
    named = classes["indexer"]["us_per_step"] > 0
    return {
        "schema": "dsv4kit-profile/1",
        **context,
        "mode": ranks[0]["mode"],
        "ranks": len(ranks),
        "decode_steps": ranks[0].get("decode_steps"),
        "step_time_ms": max(steps) if steps else None,
        "trace_tok_s": min(toks) if toks else None,
        "kernel_us_per_step": round(total, 3),
        "classes": classes,
        "indexer_by_name": named,
        "indexer_note": None if named else UNNAMED_INDEXER,
        "unknown": [{"name": k, "us_per_step": round(v, 3)} for k, v in sorted(unknown.items(), key=lambda kv: -kv[1])][:50],
        "per_rank": ranks,
    }


def format_table(profile: dict, title: Optional[str] = None) -> str:
    """The breakdown as text: one line per class with time per step, share and implementations."""
    lines = [title] if title else []
    lines.append(f"{'class':<22} {'us/step':>10} {'share':>7}  implementations")
    for klass, label in CLASSES.items():
        c = profile["classes"][klass]
        impls = ", ".join(f"{k} {v:.0f}" for k, v in sorted(c["impls"].items(), key=lambda kv: -kv[1]) if v)
        lines.append(f"{label:<22} {c['us_per_step']:>10.1f} {100 * c['share']:>6.1f}%  {impls}")
    step = profile.get("step_time_ms")
    unit = "host" if profile.get("mode") == "cpu" else "GPU"
    lines.append(f"{unit} time per decode step: {step:.3f} ms" if step is not None else
                 f"{unit} time per decode step: - (no decode step spans in the trace)")
    lines.append(f"kernel time per step (all classes): {profile['kernel_us_per_step']:.1f} us over "
                 f"{profile.get('ranks', 1)} rank(s), {profile.get('decode_steps') or '-'} decode step(s)")
    if profile.get("tok_s") is not None:
        lines.append(f"decode throughput: {profile['tok_s']:.1f} tok/s ({profile.get('tok_s_source')})")
    if profile.get("indexer_note"):
        lines.append(f"note: {profile['indexer_note']}")
    if profile["unknown"]:
        names = "; ".join(f"{u['name'][:70]} ({u['us_per_step']:.0f} us)" for u in profile["unknown"][:8])
        lines.append(f"not in the class table (counted as other): {names}")
    return "\n".join(lines)


def compare_contexts(large: dict, small: dict) -> dict:
    """The context tax: per class the time per step at the large context over the small one, the
    throughput retention, and the classes that grew with the configured context."""
    growth = {}
    flagged = []
    for klass in CLASSES:
        a, b = large["classes"][klass]["us_per_step"], small["classes"][klass]["us_per_step"]
        ratio = a / b if b else None
        growth[klass] = {"large_us": a, "small_us": b, "delta_us": round(a - b, 3),
                         "ratio": round(ratio, 4) if ratio is not None else None}
        grew = (ratio is not None and ratio >= GROWTH_FLAG) or (b == 0 and a > 0)
        if grew and large["classes"][klass]["share"] >= GROWTH_MIN_SHARE and klass != "other":
            flagged.append(klass)
    tok_large, tok_small = large.get("tok_s"), small.get("tok_s")
    retention = round(tok_large / tok_small, 4) if tok_large and tok_small else None
    same_lengths = (large.get("input_len"), large.get("output_len")) == (small.get("input_len"), small.get("output_len"))
    return {"large_ctx": large.get("context_length"), "small_ctx": small.get("context_length"),
            "same_actual_lengths": same_lengths, "growth": growth, "retention": retention,
            "grows_with_configured_context": flagged if same_lengths else [],
            "indexer_in": [k for k in flagged if k in FALLBACK_CLASSES] if same_lengths and not large.get(
                "indexer_by_name", True) else [],
            "step_time_ratio": round(large["step_time_ms"] / small["step_time_ms"], 4)
            if large.get("step_time_ms") and small.get("step_time_ms") else None}


def format_comparison(tax: dict) -> str:
    lines = [f"context tax: {tax['large_ctx']} against {tax['small_ctx']} (same request lengths: "
             f"{'yes' if tax['same_actual_lengths'] else 'NO'})",
             f"{'class':<22} {'us/step small':>14} {'us/step large':>14} {'x':>7}"]
    for klass, label in CLASSES.items():
        g = tax["growth"][klass]
        ratio = f"{g['ratio']:.2f}" if g["ratio"] is not None else "-"
        lines.append(f"{label:<22} {g['small_us']:>14.1f} {g['large_us']:>14.1f} {ratio:>7}")
    if tax["retention"] is not None:
        lines.append(f"throughput retention: {100 * tax['retention']:.1f}% (tok/s at {tax['large_ctx']} over tok/s "
                     f"at {tax['small_ctx']})")
    for klass in tax["grows_with_configured_context"]:
        lines.append(f"FLAG: {CLASSES[klass]} grows with the configured context, not the actual length "
                     f"(x{tax['growth'][klass]['ratio'] or float('inf'):.2f} per step at the same request lengths)"
                     + (": the torch indexer fallback's kernels are counted here (no indexer kernel ran by name)"
                        if klass in tax.get("indexer_in", []) else ""))
    return "\n".join(lines)


def parse_share_limits(values: list[str]) -> dict[str, float]:
    """``indexer=2%`` (or ``indexer=0.02``) -> {"indexer": 0.02}; Abort(USAGE) naming a bad one."""
    limits = {}
    aliases = {label.lower(): key for key, label in CLASSES.items()}
    for text in values or []:
        name, sep, value = text.partition("=")
        key = aliases.get(name.strip().lower(), name.strip().lower().replace("-", "_"))
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", value)
        if not sep or key not in CLASSES or not match:
            raise Abort(exitcodes.USAGE, f"--max-class-share {text!r}: give CLASS=PERCENT%, CLASS one of "
                                         f"{', '.join(CLASSES)} (e.g. indexer=2%)")
        number = float(match.group(1)) / (100.0 if match.group(2) else 1.0)
        if not 0.0 <= number <= 1.0:
            raise Abort(exitcodes.USAGE, f"--max-class-share {text!r}: the share must be between 0% and 100%")
        limits[key] = number
    return limits


def check_shares(profile: dict, limits: dict[str, float]) -> list[str]:
    """The breaches of ``limits`` in ``profile`` (empty: the gate passes)."""
    return [f"{CLASSES[k]} is {100 * profile['classes'][k]['share']:.2f}% of decode kernel time, above the "
            f"limit {100 * limit:g}%" for k, limit in limits.items() if profile["classes"][k]["share"] > limit]


def format_diff(old: dict, new: dict) -> str:
    """Two records' breakdowns side by side (``records compare``): per class old and new us/step and share."""
    lines = [f"decode breakdown (A: context {old.get('context_length')}, B: context {new.get('context_length')})",
             f"{'class':<22} {'A us/step':>10} {'A share':>8} {'B us/step':>10} {'B share':>8}"]
    for klass, label in CLASSES.items():
        a, b = old["classes"][klass], new["classes"][klass]
        lines.append(f"{label:<22} {a['us_per_step']:>10.1f} {100 * a['share']:>7.1f}% {b['us_per_step']:>10.1f} "
                     f"{100 * b['share']:>7.1f}%")
    return "\n".join(lines)


def record_profile(record: dict) -> Optional[dict]:
    """The profile a bench record carries (``bench --profile``), or None."""
    profile = record.get("profile")
    return profile if isinstance(profile, dict) and profile.get("classes") else None


def record_report(record: dict, share_limits: list[str]) -> tuple[str, list[str]]:
    """(text, gate breaches) for ``records show``: the record's breakdown and the ``--max-class-share`` gate."""
    limits = parse_share_limits(share_limits)
    profile = record_profile(record)
    if profile is None:
        error = (record.get("profile") or {}).get("error")
        text = f"profile: {error}" if error else ""
        return text, ([f"the record carries no profile to check {', '.join(share_limits)} against"] if limits else [])
    return format_table(profile, title=f"decode breakdown at context {profile.get('context_length')}, "
                                        f"C={profile.get('concurrency')}"), check_shares(profile, limits)
