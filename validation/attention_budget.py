"""What the "within 2x of the floor" target leaves for the KV loop, from committed results.

The benchmark's floor counts only the KV bytes and the MMA FLOPs. A decode call also loads q,
writes the output (and, with splits, writes and re-reads the partials) and pays its launches; the
sweep's "zero length" column times exactly that fixed part (every length 0). Whatever remains of
``2 x floor`` after the fixed part is the budget for the KV loop, which must do all the MMA work
of the floor on the SMs its programs occupy. This module turns a benchmark JSON and a sweep JSON
into that budget, for the kernel as measured (with and without splits) and for an ideal kernel
whose only fixed cost is moving q in and the output out at the measured copy bandwidth::

    python -m dsv4kit.validation.attention_budget docs/results/bench_attention_h200.json \\
        docs/results/bench_attention_sweep_h200_run5.json

No GPU needed; the numbers all come from the two files.
"""

from __future__ import annotations

import argparse
import json
import sys

from dsv4kit.kernels.sparse_mla_reference import HEAD_DIM

TARGET_RATIO = 2.0
BF16_BYTES = 2


def _point(bench: dict, layer: str, T: int) -> dict:
    for p in bench["points"]:
        if p["layer"] == layer and p["T"] == T:
            return p
    raise ValueError(f"the benchmark JSON has no {layer} T={T} point")


def _variant(sweep: dict, *, split: bool) -> dict:
    """The sweep's ``default`` row, or (``split=False``) its unsplit wide 64-head variant."""
    for v in sweep["variants"]:
        if not v.get("correct") or v.get("c4_T64_zero_length_us") is None:
            continue
        if split and v["name"] == "default":
            return v
        cfg = v["config"]
        if (not split and v["num_splits_T64"] == 1 and cfg.get("wide") and cfg["block_h"] == 64
                and not cfg.get("dim_split")):
            return v
    kind = "'default'" if split else "unsplit wide BLOCK_H=64"
    raise ValueError(f"the sweep JSON has no correct {kind} variant with a zero-length time")


def budget_rows(bench: dict, sweep: dict, layer: str = "c4", T: int = 64) -> list:
    """One row per design: fixed cost, loop budget, the loop's MMA time at the measured rate on
    the SMs its programs occupy, and the share of that rate the loop would have to sustain."""
    point = _point(bench, layer, T)
    sm_count = bench["environment"]["sm_count"]
    budget_total = TARGET_RATIO * point["floor_us"]
    io_bytes = 2 * T * point["H"] * HEAD_DIM * BF16_BYTES  # q in, output out (bf16)
    rows = []
    designs = [
        ("this kernel, auto splits (measured)", _variant(sweep, split=True), point["num_splits"]),
        ("this kernel, no split (measured)", _variant(sweep, split=False), 1),
    ]
    for label, variant, splits in designs:
        programs = T * -(-point["H"] // variant["config"]["block_h"]) * splits
        rows.append(_row(label, variant["name"], variant["c4_T64_zero_length_us"], programs, sm_count,
                         point, budget_total))
    ideal_fixed = io_bytes / bench["rates"]["copy_bytes_per_s"] * 1e6
    rows.append(_row("ideal: q in + output out at copy bandwidth, every SM busy", "-", ideal_fixed,
                     sm_count, sm_count, point, budget_total))
    return rows


def _row(label, variant, fixed_us, programs, sm_count, point, budget_total) -> dict:
    busy = min(programs, sm_count) / sm_count
    mma_us = point["floor_mma_us"] / busy
    loop_budget = budget_total - fixed_us
    return {
        "design": label, "variant": variant, "programs": programs, "fixed_us": fixed_us,
        "loop_budget_us": loop_budget, "loop_mma_us": mma_us,
        "needed_share_of_matmul_rate": mma_us / loop_budget if loop_budget > 0 else float("inf"),
    }


def budget_table(bench: dict, sweep: dict, layer: str = "c4", T: int = 64) -> str:
    point = _point(bench, layer, T)
    loop_now = None
    lines = [f"{layer} T={T}: floor {point['floor_us']:.1f} us (MMA {point['floor_mma_us']:.1f} us, KV bytes "
             f"{point['floor_bandwidth_us']:.1f} us), so {TARGET_RATIO:g}x the floor is "
             f"{TARGET_RATIO * point['floor_us']:.1f} us; kernel {point['kernel_us']:.1f} us.",
             "",
             "| design | sweep variant | programs | fixed cost us | left for the KV loop us | "
             "loop MMA at the measured rate us | share of the matmul rate the loop needs |",
             "|---|---|---|---|---|---|---|"]
    for r in budget_rows(bench, sweep, layer, T):
        need = r["needed_share_of_matmul_rate"]
        need_text = "impossible (nothing left)" if need == float("inf") else f"{need:.0%}"
        lines.append(f"| {r['design']} | {r['variant']} | {r['programs']} | {r['fixed_us']:.1f} | "
                     f"{r['loop_budget_us']:.1f} | {r['loop_mma_us']:.1f} | {need_text} |")
        if loop_now is None:
            loop_now = (point["kernel_us"] - r["fixed_us"], r["loop_mma_us"])
    lines += ["", f"The measured kernel's loop (kernel minus its fixed cost) takes {loop_now[0]:.1f} us: "
              f"{loop_now[1] / loop_now[0]:.0%} of the matmul rate."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.validation.attention_budget",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", help="bench_attention JSON (points, rates, sm_count)")
    parser.add_argument("sweep_json", help="bench_attention --sweep JSON (zero-length times)")
    args = parser.parse_args(argv)
    try:
        with open(args.bench_json) as fh:
            bench = json.load(fh)
        with open(args.sweep_json) as fh:
            sweep = json.load(fh)
        print(budget_table(bench, sweep), end="")
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
