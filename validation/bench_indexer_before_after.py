"""The FP8 indexer entry before and after a kernel change, timed in one process.

``python -m dsv4kit.validation.bench_indexer_before_after --before DIR [--out DIR] [--quick]``

``DIR`` holds the earlier ``indexer.py`` and ``indexer_tiles.py``, for example
``git show REV:kernels/indexer.py > DIR/indexer.py`` (the same for ``indexer_tiles.py``). Only
these two modules are swapped; the helpers they import (``indexer_rows``, ``errors``) are the
current ones.

Two runs of a benchmark, one per version, differ by more than a small change does: clocks and the
L2 move between processes, and a 3-10 us decode call moves by several percent between passes of
one run. Here both entries are timed at every shape of ``bench_indexer_prefill`` (decode, verify,
prefill), in ``PASSES`` passes that alternate which one goes first, on the same input copies,
each timed with ``timing.graph_time_us`` over a graph of at least ``MIN_GRAPH_US`` (small calls
repeated, so a 3 us call is not timed alone); a shape's ratio is the median of its per-pass
after/before ratios. Both versions are checked against the float64 reference on sampled rows.
Verdict, against the indexer issue's "no decode shape slower than today by more than 3%"
(``DECODE_BAR``): "yes" where every decode shape's median ratio is within it, "NO" where some decode
shape is beyond it in every pass, otherwise "inconclusive" (the passes disagree about it).
Writes ``bench_indexer_before_after.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import types

SCHEMA = 1
KIND = "dsv4kit-bench-indexer-before-after"
PASSES = 7
DECODE_BAR = 1.03
MIN_GRAPH_US = 2000.0
MAX_ROUNDS = 64
TILES_IMPORT = "from dsv4kit.kernels import indexer_tiles"
BEFORE_TILES = "dsv4kit_before_indexer_tiles"


class BeforeError(ValueError):
    """The ``--before`` directory cannot serve as the earlier kernels."""


def load_before(directory: str):
    """The earlier entry module from ``directory`` (its row-tile import bound to the earlier
    ``indexer_tiles.py`` there). Raises ``BeforeError`` naming what is missing or does not load."""
    paths = {name: os.path.join(directory, f"{name}.py") for name in ("indexer", "indexer_tiles")}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        raise BeforeError(f"--before {directory}: missing {', '.join(missing)}")
    tiles = _exec_module(BEFORE_TILES, paths["indexer_tiles"], "")
    sys.modules[BEFORE_TILES] = tiles
    return _exec_module("dsv4kit_before_indexer", paths["indexer"], f"import {BEFORE_TILES} as indexer_tiles")


def _exec_module(name: str, path: str, tiles_import: str):
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    if tiles_import:
        if TILES_IMPORT not in source:  # else it would run today's row-tile kernel unnoticed
            raise BeforeError(f"--before: {path} does not import its row-tile kernel as "
                              f"'{TILES_IMPORT}'")
        source = source.replace(TILES_IMPORT, tiles_import)
    module = types.ModuleType(name)
    module.__file__ = path  # Triton's jit reads the kernels' source from here
    sys.modules[name] = module
    try:
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the user's own kernel file
    except Exception as exc:  # noqa: BLE001 - any failure is the file's, named below
        raise BeforeError(f"--before: {path} does not load: {type(exc).__name__}: {exc}") from None
    if name != BEFORE_TILES and not hasattr(module, "fp8_paged_mqa_logits_for_sglang"):
        raise BeforeError(f"--before: {path} has no fp8_paged_mqa_logits_for_sglang")
    return module


def paired(before_us: list[float], after_us: list[float]) -> dict:
    """A shape's times over passes: each pass's after/before ratio, their median and spread."""
    ratios = [a / b for a, b in zip(after_us, before_us)]
    return {"before_us": before_us, "after_us": after_us, "ratios": ratios,
            "median_ratio": statistics.median(ratios),
            "ratio_spread": max(ratios) - min(ratios)}


def summarise(points: list[dict]) -> dict:
    decode = [p for p in points if p["kind"] == "decode"]
    worst = max((p["median_ratio"] for p in decode), default=None)
    if worst is None:
        verdict = "not measured"
    elif worst <= DECODE_BAR:
        verdict = "yes"
    elif any(min(p["ratios"]) > DECODE_BAR for p in decode):
        verdict = "NO"
    else:
        verdict = "inconclusive"
    return {"worst_decode_ratio": worst, "decode_not_slower": verdict,
            "checks_ok": all(c["pattern_ok"] and c["rel"] < 5e-3
                             for p in points for c in p["checks"].values())}


def bench_shape(torch, shape: dict, before, after) -> dict:
    from dsv4kit.validation import bench_indexer_prefill as prefill, timing

    first = prefill._inputs(torch, shape, seed=0)
    per_copy = sum(t.numel() * t.element_size() for t in first.__dict__.values()
                   if hasattr(t, "element_size"))
    copies = [first] + [prefill._inputs(torch, shape, seed=s)
                        for s in range(1, timing.copies_for_cold_l2(torch, per_copy, cap=8))]
    runs = {"before": before.fp8_paged_mqa_logits_for_sglang,
            "after": after.fp8_paged_mqa_logits_for_sglang}
    checks = {name: prefill._check(torch, fn(*first.args()), first, "page") for name, fn in runs.items()}
    calls = {name: [lambda c=c, fn=fn: fn(*c.args()) for c in copies] for name, fn in runs.items()}
    one = timing.graph_time_us(torch, calls["after"], warmup_s=prefill.WARMUP_S)
    rounds = max(1, min(MAX_ROUNDS, math.ceil(MIN_GRAPH_US / (one * len(copies)))))
    times = {"before": [], "after": []}
    for i in range(PASSES):
        for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
            times[name].append(timing.graph_time_us(torch, calls[name], rounds=rounds,
                                                    warmup_s=prefill.WARMUP_S))
    result = {"name": shape["name"], "kind": shape["kind"], "checks": checks, "rounds": rounds,
              **paired(times["before"], times["after"])}
    del copies, first
    torch.cuda.empty_cache()
    return result


def render(payload: dict) -> str:
    lines = ["| shape | before (us) | after (us) | after / before (median of passes) | spread of the ratio | checks |",
             "|---|---|---|---|---|---|"]
    for p in payload["points"]:
        ok = all(c["pattern_ok"] and c["rel"] < 5e-3 for c in p["checks"].values())
        lines.append(f"| {p['name']} | {statistics.median(p['before_us']):.1f} | "
                     f"{statistics.median(p['after_us']):.1f} | {p['median_ratio']:.3f} | "
                     f"{p['ratio_spread']:.3f} | {'ok' if ok else 'FAIL'} |")
    s = payload["summary"]
    lines.append("")
    worst = "-" if s["worst_decode_ratio"] is None else f"{s['worst_decode_ratio']:.3f}"
    lines.append(f"No decode shape slower by more than {round((DECODE_BAR - 1) * 100)}% (worst median "
                 f"ratio {worst}): {s['decode_not_slower']}. "
                 f"Before: `{payload['before']}`; {PASSES} passes, alternating which version goes first.")
    lines.append(f"Device: {payload['environment'].get('gpu')}; Triton {payload['environment'].get('triton')}. "
                 f"Command: `{payload['command']}`.")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.validation.bench_indexer_before_after",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", metavar="DIR", help="directory with the earlier indexer.py and indexer_tiles.py")
    parser.add_argument("--label", default=None, help="what the earlier version is (a commit), for the record")
    parser.add_argument("--out", default=".", help="directory for bench_indexer_before_after.json")
    parser.add_argument("--quick", action="store_true", help="the quick shape set of bench_indexer_prefill")
    parser.add_argument("--render", metavar="JSON", help="print the table of an existing result")
    parser.add_argument("--update-doc", metavar="MD",
                        help="with --render: fill the page's <!-- generated:before_after --> block")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as fh:
            table = render(json.load(fh))
        if args.update_doc:
            from dsv4kit.validation import bench_indexer

            bench_indexer.fill_generated(args.update_doc, {"before_after": table})
        print(table)
        return 0
    if not args.before:
        parser.error("--before DIR is required (or --render JSON)")
    try:
        before = load_before(args.before)
    except BeforeError as exc:
        print(f"bench_indexer_before_after: {exc}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench_indexer_before_after: needs a CUDA GPU", file=sys.stderr)
        return 5
    from dsv4kit.kernels import indexer
    from dsv4kit.validation import bench_indexer, bench_indexer_prefill as prefill

    started = time.time()
    points = []
    for shape in prefill.shapes(quick=args.quick):
        points.append(bench_shape(torch, shape, before, indexer))
        p = points[-1]
        print(f"{p['name']}: after/before {p['median_ratio']:.3f} (spread {p['ratio_spread']:.3f})",
              file=sys.stderr, flush=True)
    payload = {"schema": SCHEMA, "kind": KIND,
               "command": "python -m dsv4kit.validation.bench_indexer_before_after "
                          + shlex.join(argv if argv is not None else sys.argv[1:]),
               "before": args.label or os.path.abspath(args.before),
               "environment": bench_indexer.environment(torch, "cuda"), "host": platform.node(),
               "passes": PASSES, "points": points, "summary": summarise(points),
               "seconds": round(time.time() - started, 1)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_indexer_before_after.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1)
    os.replace(path + ".tmp", path)
    print(render(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
