"""Indexer benchmark: our Triton kernel beside SGLang's own indexers (TileLang, torch fallback).

``python -m dsv4kit.validation.bench_indexer [--out DIR] [--quick] [--tune]``

* Measures the device's copy bandwidth first, in the same run.
* Grid: B in {1, 16, 64}, H = 64, actual length in {2K, 32K, 128K} tokens (c4 length = tokens/4),
  context in {8K, 128K, 1M} tokens with ``max_seq_len`` as SGLang computes it (docs/sglang-contract.md §2.8:
  ``P = ceil((ctx + 4) / 256)``, ``max_seq_len = P * 64``); points with length > context are skipped.
* Every implementation of ``dsv4kit.validation.implementations`` ("dsv4kit": ours as the SGLang
  plugin calls it; "dsv4kit-exact": ours with the exact -inf tail; SGLang 0.5.23's TileLang
  indexer and torch fallback, unmodified) runs on the same inputs in this process, is checked
  against the float64 reference and timed under CUDA-graph replay. Each row reads its own pages.
* Read floor = ``B * L * 136`` bytes (K values, scales, logits on ``[0, L)``) / copy bandwidth.
* Targets: ours <= TileLang at every point; ours <= 1.2 x floor where the length is >= 32K
  tokens; at B=64, 128K context, 2K-token requests ours is >= 300x faster than the torch fallback.

Writes ``bench_indexer.json`` and ``bench_indexer.png`` under ``--out`` and prints a table.
``--render JSON`` prints the markdown table of an existing result (used by docs/indexer.md).
Stock SGLang modules come from the installed SGLang or from ``DSV4KIT_SGLANG_SOURCE`` (see
``dsv4kit.validation.sglang_stock``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from typing import Callable, Optional

from dsv4kit.validation import bench_cli

SCHEMA = 1
HEADS = 64
PAGE = 64
PAGE_BYTES = 8448
BATCHES = (1, 16, 64)
LENGTHS_TOKENS = (2048, 32768, 131072)
CONTEXTS_TOKENS = (8192, 131072, 1048576)
FLOOR_FACTOR = 1.2  # ours <= 1.2 x the read floor ...
FLOOR_MIN_TOKENS = 32768  # ... where the actual length is at least this many tokens
READ_BYTES_PER_POSITION = 136  # 128 fp8 K values + a 4-byte scale read, a 4-byte logit written
OURS = "dsv4kit"  # the kernel as the SGLang plugin calls it (tail policy "skip")
EXACT_NAME = "dsv4kit-exact"  # the kernel with the exact -inf tail
TILELANG_NAME = "sglang-tilelang"
TORCH_NAME = "sglang-torch"
SPEEDUP_POINT = {"batch": 64, "context": 131072, "tokens": 2048}
SPEEDUP_TARGET = 300.0
CALLS_PER_GRAPH = 10
TIMING_ROUNDS = 3  # interleaved timing rounds per point (the best kept)


def table_pages(context_tokens: int, extra: int = 4) -> int:
    """SGLang's page-table width: ceil((context + extra) / 256) (no speculative decoding)."""
    return -(-(context_tokens + extra) // 256)


def fallback_peak_bytes(batch: int, pages: int, heads: int = HEADS) -> int:
    """Rough peak of the fallback's temporaries (gather, bf16 K, bf16 scores, fp32 products)."""
    positions = batch * pages * PAGE
    return (batch * pages * PAGE_BYTES * 2 + positions * 128 * 2
            + positions * heads * (2 + 2 + 4) + positions * 4 * 3)


def fmt_tokens(n: int) -> str:
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K"


# --------------------------------------------------------------------------------------------
# measurement (CUDA only)


def _elapsed_s(torch, device: str, fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes on the device (CUDA events), or wall-clock on the CPU smoke path."""
    if device != "cuda":
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def measure_bandwidth(torch, device: str = "cuda", nbytes: int = 1 << 30, reps: int = 20) -> dict:
    """Copy bandwidth as ``dsv4kit.validation.timing`` defines it, and the -inf fill rate."""
    if device == "cuda":
        from dsv4kit.validation import timing

        copy = timing.copy_bandwidth(torch, nbytes)
        fill = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        fill_us = timing.graph_time_us(torch, [lambda: fill.fill_(float("-inf"))], rounds=reps)
        del fill
        torch.cuda.empty_cache()
        return {"copy_GBps": copy / 1e9, "fill_GBps": nbytes / fill_us / 1e3, "bytes": nbytes,
                "method": f"dsv4kit.validation.timing.copy_bandwidth of {nbytes >> 20} MiB"}
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    copy_s = _elapsed_s(torch, device, lambda: dst.copy_(src))
    return {"copy_GBps": 2 * nbytes / copy_s / 1e9, "fill_GBps": nbytes / copy_s / 1e9,
            "bytes": nbytes, "method": "CPU smoke run: meaningless"}


def time_under_graph(torch, fn: Callable[[], object], calls: int, reps: int,
                     device: str = "cuda") -> float:
    """Microseconds per call (``dsv4kit.validation.timing.graph_time_us``: a graph of
    ``calls * reps`` calls, median of 5 replays).

    On the CPU smoke path (``--device cpu``) this times eager calls instead; those numbers are
    meaningless and only prove the code path runs.
    """
    if device != "cuda":
        fn()
        return _elapsed_s(torch, device, fn) * 1e6
    from dsv4kit.validation import timing

    return timing.graph_time_us(torch, [fn], rounds=calls * reps, samples=5)


def make_bench_inputs(torch, batch: int, c4_len: int, pages: int, seed: int = 0, device: str = "cuda"):
    """Uniform-length rows on the GPU: shuffled live pages, random valid stale entries past L."""
    from dsv4kit.kernels.indexer_reference import IndexerInputs, INDEX_WEIGHT_SCALE

    gen = torch.Generator(device=device).manual_seed(seed)
    live = -(-c4_len // PAGE)
    num_pages = max(batch * live + 1, 2)
    k = torch.randn(num_pages, PAGE, 128, device=device, generator=gen)
    s_k = k.abs().amax(-1).clamp_min(1e-4) / 448.0
    k8 = (k / s_k.unsqueeze(-1)).to(torch.float8_e4m3fn)
    del k
    pool = torch.empty(num_pages, PAGE_BYTES, dtype=torch.uint8, device=device)
    pool[:, :PAGE * 128] = k8.view(torch.uint8).reshape(num_pages, -1)
    pool[:, PAGE * 128:] = s_k.contiguous().view(torch.uint8).reshape(num_pages, -1)
    del k8
    q = torch.randn(batch, HEADS, 128, device=device, generator=gen)
    s_q = q.abs().amax(-1).clamp_min(1e-4) / 448.0
    q8 = (q / s_q.unsqueeze(-1)).to(torch.float8_e4m3fn)
    weight = (torch.randn(batch, HEADS, device=device, generator=gen) * INDEX_WEIGHT_SCALE * s_q).contiguous()
    table = torch.randint(0, num_pages, (batch, pages), device=device, generator=gen, dtype=torch.int32)
    perm = torch.randperm(num_pages, device=device, generator=gen)[: batch * live].to(torch.int32)
    table[:, :live] = perm.view(batch, live)
    seq_lens = torch.full((batch,), c4_len, dtype=torch.int32, device=device)
    return IndexerInputs(q8.unsqueeze(1).contiguous(), pool.view(num_pages, PAGE, 1, 132), weight,
                         seq_lens, table, pages * PAGE)


def grid_points(quick: bool) -> list[dict]:
    batches = (1, 64) if quick else BATCHES
    lengths = (2048, 32768) if quick else LENGTHS_TOKENS
    contexts = (8192, 131072) if quick else CONTEXTS_TOKENS
    points = []
    for batch in batches:
        for context in contexts:
            for tokens in lengths:
                if tokens > context:
                    continue
                pages = table_pages(context)
                points.append({"batch": batch, "heads": HEADS, "tokens": tokens, "c4_len": tokens // 4,
                               "context": context, "pages": pages, "max_seq_len": pages * PAGE})
    return points


def floor_bytes(point: dict) -> int:
    """The read floor: each row's K values and scales for its length, and its logits on [0, L)
    (``B * L * 136`` bytes)."""
    return point["batch"] * point["c4_len"] * READ_BYTES_PER_POSITION


def _timed(torch, fn, device, eager_s: float) -> float:
    reps = max(2, min(20, int(0.3 / max(eager_s, 1e-6))))
    calls = 1 if eager_s > 1e-3 else CALLS_PER_GRAPH
    return time_under_graph(torch, fn, calls, reps, device)


def bench_point(torch, point: dict, bandwidth: dict, budget_bytes: int, log,
                device: str = "cuda", impls=None) -> dict:
    """Every implementation on one grid point: error against the float64 reference, time."""
    from dsv4kit.kernels import indexer
    from dsv4kit.kernels.indexer_reference import compare, exact_logits_f64

    inputs = make_bench_inputs(torch, point["batch"], point["c4_len"], point["pages"], device=device)
    args = inputs.args()
    exact = exact_logits_f64(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                             inputs.page_table, inputs.max_seq_len)
    # Ours in both tail policies: "dsv4kit" is what the SGLang plugin runs (skip), the exact
    # policy is the torch fallback's contract.
    runs = [(EXACT_NAME, lambda *a: indexer.fp8_paged_mqa_logits(*a, tail=indexer.TAIL_EXACT), "exact")]
    runs += [(impl.name, impl.fn, impl.tail) for impl in (impls or [])]
    result = dict(point)
    result.update(times_us={}, rel={}, max_abs={}, pattern_ok={}, skipped={})
    peak = fallback_peak_bytes(point["batch"], point["pages"])
    timers = {}
    for name, fn, tail in runs:
        if name == TORCH_NAME and peak > budget_bytes:
            result["times_us"][name] = None
            result["skipped"][name] = (f"needs ~{peak / 2**30:.1f} GiB of temporaries, over the "
                                       f"{budget_bytes / 2**30:.1f} GiB budget")
            continue
        try:
            out = fn(*args)  # the first call may compile: not timed
            stats = compare(out, exact, inputs.seq_lens, tail=tail)
            del out
            result["rel"][name] = stats["rel"]
            result["max_abs"][name] = stats["max_abs"]
            result["pattern_ok"][name] = stats["pattern_ok"]
            started = time.perf_counter()
            fn(*args)
            if device == "cuda":
                torch.cuda.synchronize()
            timers[name] = (fn, time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - one implementation failing is recorded
            log(f"{name} failed at B={point['batch']} len={point['tokens']} ctx={point['context']}: "
                f"{type(exc).__name__}: {str(exc)[:200]}")
            result["times_us"][name] = None
            result["skipped"][name] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
    # Fast implementations are timed in interleaved rounds (best round kept), so a drift in the
    # GPU's clocks cannot favour whichever ran first; a slow one (> 1 ms a call) once.
    samples: dict = {name: [] for name in timers}
    for round_index in range(TIMING_ROUNDS):
        for name, (fn, eager_s) in timers.items():
            if round_index and eager_s > 1e-3:
                continue
            try:
                samples[name].append(_timed(torch, lambda fn=fn: fn(*args), device, eager_s))
            except Exception as exc:  # noqa: BLE001
                log(f"{name} timing failed: {type(exc).__name__}: {str(exc)[:200]}")
                result["skipped"][name] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
    for name, values in samples.items():
        result["times_us"][name] = min(values) if values and name not in result["skipped"] else None
    ours = result["times_us"].get(OURS)
    nbytes = floor_bytes(point)
    result["floor_bytes"] = nbytes
    result["floor_us"] = nbytes / (bandwidth["copy_GBps"] * 1e9) * 1e6
    result["kernel_us"] = ours
    result["kernel_vs_floor"] = None if ours is None else ours / result["floor_us"]
    result["floor_target_applies"] = point["tokens"] >= FLOOR_MIN_TOKENS
    result["floor_target_met"] = (None if not result["floor_target_applies"] else
                                  ours is not None and ours <= FLOOR_FACTOR * result["floor_us"])
    stock = result["times_us"].get(TILELANG_NAME)
    result["vs_tilelang"] = None if ours is None or stock is None else ours / stock
    result["tilelang_target_met"] = None if stock is None else ours is not None and ours <= stock
    fallback = result["times_us"].get(TORCH_NAME)
    result["speedup"] = None if ours is None or fallback is None else fallback / ours
    del inputs, args, exact
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


TUNE_POINTS = [
    {"batch": 1, "tokens": 2048, "context": 1048576},
    {"batch": 1, "tokens": 32768, "context": 131072},
    {"batch": 16, "tokens": 2048, "context": 131072},
    {"batch": 64, "tokens": 2048, "context": 8192},
    {"batch": 1, "tokens": 131072, "context": 1048576},
    {"batch": 16, "tokens": 32768, "context": 131072},
    {"batch": 16, "tokens": 131072, "context": 131072},
    {"batch": 64, "tokens": 2048, "context": 1048576},
    {"batch": 64, "tokens": 32768, "context": 1048576},
    {"batch": 64, "tokens": 131072, "context": 131072},
]
TUNE_KEYS = ("programs_per_sm", "num_warps", "num_stages", "prefetch", "direct", "pin_first")


def _tune_configs():
    from dsv4kit.kernels import indexer

    for per_sm in (2, 4, 8):
        for stages in (2, 3, 4):
            for prefetch, direct in ((True, True), (True, False), (False, True)):
                for pin_first in (False, True):
                    yield {"programs_per_sm": per_sm, "num_warps": indexer.NUM_WARPS,
                           "num_stages": stages, "prefetch": prefetch,
                           "fill_block": indexer.FILL_BLOCK, "direct": direct, "pin_first": pin_first}


def tune(torch, log) -> list[dict]:
    """Sweep the static launch configuration (skip tail policy) on a few points."""
    from dsv4kit.kernels import indexer

    rows = []
    for spec in TUNE_POINTS:
        pages = table_pages(spec["context"])
        inputs = make_bench_inputs(torch, spec["batch"], spec["tokens"] // 4, pages)
        batch, _, _, num_pages, seq, kv, msl = indexer.check_args(
            inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens, inputs.page_table,
            inputs.max_seq_len, False)
        point_rows = []
        for cfg in _tune_configs():
            r = indexer.programs_per_row(batch, pages, torch.device("cuda"), cfg["programs_per_sm"],
                                         tail=indexer.TAIL_SKIP)

            def call(r=r, cfg=cfg):
                out = torch.empty((batch, msl), dtype=torch.float32, device="cuda")
                indexer.launch(inputs.q_fp8, kv, inputs.weight, seq, inputs.page_table, out,
                               num_pages, msl, r, num_warps=cfg["num_warps"],
                               num_stages=cfg["num_stages"], fill_block=cfg["fill_block"],
                               prefetch=cfg["prefetch"], tail=indexer.TAIL_SKIP,
                               direct=cfg["direct"], pin_first=cfg["pin_first"])
                return out

            try:
                us = time_under_graph(torch, call, CALLS_PER_GRAPH, 10)
            except Exception as exc:  # noqa: BLE001 - a config that fails is recorded, not fatal
                log(f"tune config {cfg} failed: {type(exc).__name__}: {exc}")
                us = None
            point_rows.append({"sweep": "skip", **spec, **cfg, "programs_per_row": r, "us": us})
        rows.extend(point_rows)
        timed = [r for r in point_rows if r["us"] is not None]
        if timed:
            best = min(timed, key=lambda r: r["us"])
            log(f"tune B={spec['batch']} len={fmt_tokens(spec['tokens'])} "
                f"ctx={fmt_tokens(spec['context'])}: best {best['us']:.2f} us with "
                + ", ".join(f"{k}={best[k]}" for k in TUNE_KEYS))
        del inputs
        torch.cuda.empty_cache()
    return rows


def graph_node_floor_us(torch) -> float:
    """Time of a trivial kernel node (a 64-float fill) under the same graph timing: launch floor."""
    tiny = torch.empty(64, dtype=torch.float32, device="cuda")
    return time_under_graph(torch, lambda: tiny.fill_(0.0), CALLS_PER_GRAPH, 20)


# --------------------------------------------------------------------------------------------
# reporting


def _names(payload: dict) -> list[str]:
    """Implementations in table order: ours, ours with the exact tail, then the stock ones."""
    seen = []
    for p in payload["points"]:
        for name in p.get("times_us", {}):
            if name not in seen:
                seen.append(name)
    order = [OURS, EXACT_NAME, TILELANG_NAME, TORCH_NAME]
    return [n for n in order if n in seen] + [n for n in seen if n not in order]


def fmt_us(value) -> str:
    return "-" if value is None else (f"{value:.1f}" if value >= 10 else f"{value:.2f}")


def render_table(payload: dict) -> str:
    """Markdown table of a result JSON (docs/indexer.md quotes this output verbatim)."""
    names = _names(payload)
    lines = [
        "| B | length | context | " + " | ".join(f"{n} (us)" for n in names)
        + " | floor (us) | ours/floor | ours/TileLang | <= TileLang | <= 1.2x floor |",
        "|---:|---:|---:|" + "---:|" * len(names) + "---:|---:|---:|:---:|:---:|",
    ]
    for p in payload["points"]:
        head = f"| {p['batch']} | {fmt_tokens(p['tokens'])} | {fmt_tokens(p['context'])} | "
        if p.get("error"):
            lines.append(head + f"error: {p['error'][:60]} |" + " |" * (len(names) + 4))
            continue
        cells = []
        for n in names:
            t = p["times_us"].get(n)
            cells.append("skipped" if t is None and n in p.get("skipped", {}) else fmt_us(t))
        vs_floor = "-" if p.get("kernel_vs_floor") is None else f"{p['kernel_vs_floor']:.2f}"
        vs_tl = "-" if p.get("vs_tilelang") is None else f"{p['vs_tilelang']:.2f}"
        tl_met = {None: "-", True: "yes", False: "NO"}[p.get("tilelang_target_met")]
        fl_met = {None: "-", True: "yes", False: "NO"}[p.get("floor_target_met")]
        lines.append(head + " | ".join(cells) + f" | {p['floor_us']:.2f} | {vs_floor} | {vs_tl} "
                     f"| {tl_met} | {fl_met} |")
    return "\n".join(lines)


def render_errors(payload: dict) -> str:
    """Markdown table: each implementation's largest error against the float64 reference."""
    names = _names(payload)
    lines = ["| implementation | origin | worst rel | worst max abs | -inf pattern | points |",
             "|---|---|---:|---:|:---:|---:|"]
    origins = payload.get("implementations", {})

    def origin(name: str) -> str:  # "wheel:<dir>" -> "wheel": the directory is the run's own
        return origins.get(name, {}).get("origin", "-").split(":", 1)[0]
    for n in names:
        rels = [p["rel"][n] for p in payload["points"] if n in p.get("rel", {})]
        absd = [p["max_abs"][n] for p in payload["points"] if n in p.get("max_abs", {})]
        pats = [p["pattern_ok"][n] for p in payload["points"] if n in p.get("pattern_ok", {})]
        if not rels:
            lines.append(f"| {n} | {origin(n)} | - | - | - | 0 |")
            continue
        lines.append(f"| {n} | {origin(n)} | {max(rels):.2e} "
                     f"| {max(absd):.2e} | {'match' if all(pats) else 'MISMATCH'} | {len(rels)} |")
    for n, why in payload.get("unavailable", {}).items():
        lines.append(f"| {n} | - | {why} | | | 0 |")
    return "\n".join(lines)


def render_summary(payload: dict) -> str:
    env = payload["environment"]
    bw = payload["bandwidth"]
    s = payload["summary"]
    speed = s["speedup_target"]

    def listing(missed):
        return f"; missed at {', '.join(missed)}." if missed else "."

    lines = [
        f"Device: {env.get('gpu')} ({env.get('capability')}), torch {env.get('torch')}, "
        f"triton {env.get('triton')}. Command: `{payload['command']}`.",
        f"Measured copy bandwidth: {bw['copy_GBps']:.0f} GB/s ({bw['method']}); "
        f"fill bandwidth {bw['fill_GBps']:.0f} GB/s"
        + (f"; a trivial kernel node takes {bw['graph_node_floor_us']:.1f} us under the same graph "
           "timing." if bw.get("graph_node_floor_us") is not None else "."),
        f"Stock target (ours <= SGLang's TileLang indexer, same run): met at "
        f"{s['tilelang_target_met']} of {s['tilelang_points']} points"
        + listing(s["tilelang_target_missed"]),
        f"Floor target (ours <= {FLOOR_FACTOR} x B*L*{READ_BYTES_PER_POSITION} bytes at the copy "
        f"bandwidth, lengths >= {fmt_tokens(FLOOR_MIN_TOKENS)}): met at {s['floor_target_met']} of "
        f"{s['floor_points']} points" + listing(s["floor_target_missed"]),
        f"Speedup over SGLang's torch fallback (B={SPEEDUP_POINT['batch']}, "
        f"{fmt_tokens(SPEEDUP_POINT['context'])} context, "
        f"{fmt_tokens(SPEEDUP_POINT['tokens'])}-token requests, >= {SPEEDUP_TARGET:.0f}x): "
        + ("not measured." if speed["speedup"] is None else
           f"{speed['speedup']:.0f}x, {'met' if speed['met'] else 'MISSED'}."),
    ]
    return "\n".join(lines)


def render_tuning(payload: dict) -> str:
    """Markdown table of the launch-configuration sweep: best config per point vs the committed one."""
    rows = [r for r in payload.get("tuning", []) if r.get("us") is not None]
    if not rows:
        return ""
    chosen = {"direct": False, "pin_first": False, **payload["kernel_config"]}
    keys = TUNE_KEYS if "pin_first" in rows[0] else (
        "programs_per_sm", "num_warps", "num_stages", "prefetch", "fill_block")
    lines = ["| sweep | B | length | context | best (us) | best config | committed config (us) |",
             "|---|---:|---:|---:|---:|---|---:|"]
    seen = []
    for r in rows:
        point = (r["sweep"], r["batch"], r["tokens"], r["context"])
        if point not in seen:
            seen.append(point)
    for sweep, batch, tokens, context in seen:
        sel = [r for r in rows if (r["sweep"], r["batch"], r["tokens"], r["context"])
               == (sweep, batch, tokens, context)]
        best = min(sel, key=lambda r: r["us"])
        mine = next((r for r in sel if all(r[k] == chosen[k] for k in keys)), None)
        cfg = ", ".join(f"{k}={best[k]}" for k in keys)
        lines.append(f"| {sweep} | {batch} | {fmt_tokens(tokens)} | {fmt_tokens(context)} "
                     f"| {best['us']:.2f} | {cfg} | {'-' if mine is None else format(mine['us'], '.2f')} |")
    return "\n".join(lines)


def _label(p: dict) -> str:
    return f"B={p['batch']} len={fmt_tokens(p['tokens'])} ctx={fmt_tokens(p['context'])}"


def summarise(points: list[dict]) -> dict:
    tl = [p for p in points if p.get("tilelang_target_met") is not None or p.get("error")]
    tl_missed = [_label(p) for p in tl if not p.get("tilelang_target_met")]
    fl = [p for p in points if p.get("floor_target_applies") or (
        p.get("error") and p["tokens"] >= FLOOR_MIN_TOKENS)]
    fl_missed = [_label(p) for p in fl if not p.get("floor_target_met")]
    speed_point = next((p for p in points if p["batch"] == SPEEDUP_POINT["batch"]
                        and p["context"] == SPEEDUP_POINT["context"]
                        and p["tokens"] == SPEEDUP_POINT["tokens"]), None)
    speedup = None if speed_point is None else speed_point.get("speedup")
    unmeasured = [_label(p) for p in points if p.get("tilelang_target_met") is None]
    return {
        "points": len(points),
        "tilelang_points": len(tl),
        "tilelang_target_met": len(tl) - len(tl_missed),
        "tilelang_target_missed": tl_missed,
        "tilelang_not_measured": unmeasured,
        "floor_points": len(fl),
        "floor_target_met": len(fl) - len(fl_missed),
        "floor_target_missed": fl_missed,
        "speedup_target": {**SPEEDUP_POINT, "target": SPEEDUP_TARGET, "speedup": speedup,
                           "met": speedup is not None and speedup >= SPEEDUP_TARGET},
        "all_targets_met": (not tl_missed and not unmeasured and not fl_missed
                            and speedup is not None and speedup >= SPEEDUP_TARGET),
    }


#: Printed under the figure: what a point is and what the terms mean.
PLOT_NOTE = (
    "Each point: the median over 3 timed batches of CUDA-graph replays of the time of one call (a single "
    "median; no interval is drawn).\n"
    "B: requests in the batch. length: tokens of each request. context: the max context the page "
    "table is sized for (the torch fallback's cost follows it; the kernel's follows the length).\n"
    "read floor: the bytes the call must move on [0, L) (B*L*136: fp8 K values, scales, logits) / measured "
    "copy bandwidth, the time no kernel can beat on this GPU.")


def plot(payload: dict, path: str, log) -> Optional[str]:
    return bench_cli.save_figure(figure, payload, path, log)


def figure(payload: dict):
    """The benchmark figure (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = payload["points"]
    batches = sorted({p["batch"] for p in points})
    lengths = sorted({p["tokens"] for p in points})
    fig, axes = plt.subplots(len(batches), len(lengths), figsize=(4.2 * len(lengths), 3.4 * len(batches)),
                             squeeze=False)
    for i, batch in enumerate(batches):
        for j, tokens in enumerate(lengths):
            ax = axes[i][j]
            sel = sorted((p for p in points if p["batch"] == batch and p["tokens"] == tokens),
                         key=lambda p: p["context"])
            styles = {OURS: ("s-", "tab:blue"), EXACT_NAME: ("s:", "tab:cyan"),
                      TILELANG_NAME: ("D-", "tab:green"), TORCH_NAME: ("o-", "tab:red")}
            for name in _names(payload):
                style, color = styles.get(name, ("x-", "tab:gray"))
                xs = [p["context"] for p in sel if p.get("times_us", {}).get(name) is not None]
                ys = [p["times_us"][name] for p in sel if p.get("times_us", {}).get(name) is not None]
                if xs:
                    ax.plot(xs, ys, style, color=color, label=name)
            xs = [p["context"] for p in sel if p.get("floor_us") is not None]
            ys = [p["floor_us"] for p in sel if p.get("floor_us") is not None]
            if xs:
                ax.plot(xs, ys, "^--", color="black", label="read floor")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"B={batch}, length {fmt_tokens(tokens)} tokens", fontsize=9)
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel("time per call (us, median)")
            ax.grid(True, which="both", alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    env = payload["environment"]
    fig.suptitle(f"DSV4 indexer logits under CUDA-graph replay, H=64 - {env.get('gpu')}", fontsize=10)
    fig.text(0.01, 0.005, PLOT_NOTE, fontsize=7, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.16 / len(batches), 1, 1))
    return fig


_GENERATED = re.compile(r"(<!-- generated:(\w+) -->\n)(.*?)(<!-- /generated -->)", re.S)


def update_doc(doc_path: str, bench_payload: dict, validation_payload: Optional[dict],
               tuning_payload: Optional[dict] = None) -> None:
    """Regenerate the ``<!-- generated:NAME -->`` blocks of a markdown page from result JSON.

    The tuning block comes from ``tuning_payload`` (a ``--tune`` run) when given, else from the
    benchmark result itself.
    """
    from dsv4kit.validation import indexer_suite

    blocks = {"summary": render_summary(bench_payload), "table": render_table(bench_payload),
              "errors": render_errors(bench_payload),
              "tuning": render_tuning(tuning_payload or bench_payload)}
    if validation_payload is not None:
        blocks["validation"] = "```\n" + indexer_suite.report_lines(validation_payload) + "\n```"
    fill_generated(doc_path, blocks)


def fill_generated(doc_path: str, blocks: dict) -> None:
    """Replace the ``<!-- generated:NAME -->`` blocks of a page named in ``blocks``; keep the rest."""
    with open(doc_path) as fh:
        text = fh.read()

    def fill(match):
        name = match.group(2)
        if name not in blocks:
            return match.group(0)
        return f"{match.group(1)}{blocks[name]}\n{match.group(4)}"

    updated = _GENERATED.sub(fill, text)
    tmp = f"{doc_path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(updated)
    os.replace(tmp, doc_path)


def environment(torch, device: str) -> dict:
    import triton

    from dsv4kit import __version__

    if device != "cuda":
        return {"gpu": "cpu (Triton interpreter smoke run: timings are meaningless)",
                "capability": None, "sm_count": None, "torch": torch.__version__,
                "triton": triton.__version__, "dsv4kit": __version__,
                "python": platform.python_version(), "host": platform.node()}
    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(), "capability": "sm_%d%d" % torch.cuda.get_device_capability(),
            "sm_count": props.multi_processor_count, "memory_GiB": round(props.total_memory / 2**30, 1),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "dsv4kit": __version__, "python": platform.python_version(), "host": platform.node()}


def main(argv=None) -> int:
    from dsv4kit.core import exitcodes

    parser = bench_cli.new_parser("bench_indexer",
                                  description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="directory for bench_indexer.json and .png")
    parser.add_argument("--quick", action="store_true", help="a small subset of the grid")
    parser.add_argument("--tune", action="store_true", help="also sweep launch configurations")
    parser.add_argument("--budget-gib", type=float, default=None,
                        help="memory budget for the fallback's temporaries (default: half of free memory)")
    parser.add_argument("--render", metavar="JSON", help="print the markdown table of a result and exit")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: smoke-run the code path through the Triton interpreter "
                             "(needs TRITON_INTERPRET=1; timings are meaningless)")
    parser.add_argument("--update-doc", metavar="MD",
                        help="regenerate the generated blocks of this page from --bench-json "
                             "(and --validation-json), then exit")
    parser.add_argument("--bench-json", help="bench result for --update-doc")
    parser.add_argument("--validation-json", help="harness report for --update-doc")
    parser.add_argument("--tuning-json", help="a --tune result whose sweep --update-doc shows")
    args = parser.parse_args(list(argv) if argv is not None else None)

    if args.update_doc:
        if not args.bench_json:
            print("error: --update-doc needs --bench-json", file=sys.stderr)
            return exitcodes.USAGE
        try:
            with open(args.bench_json) as fh:
                bench_payload = json.load(fh)
            validation_payload = None
            if args.validation_json:
                with open(args.validation_json) as fh:
                    validation_payload = json.load(fh)
            tuning_payload = None
            if args.tuning_json:
                with open(args.tuning_json) as fh:
                    tuning_payload = json.load(fh)
            update_doc(args.update_doc, bench_payload, validation_payload, tuning_payload)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exitcodes.USAGE
        print(f"updated {args.update_doc}")
        return exitcodes.OK

    if args.render:
        try:
            with open(args.render) as fh:
                payload = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"error: cannot read {args.render}: {exc}", file=sys.stderr)
            return exitcodes.USAGE
        print(render_summary(payload))
        print()
        print(render_table(payload))
        if payload.get("tuning"):
            print()
            print(render_tuning(payload))
        return exitcodes.OK

    import torch

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("error: the indexer benchmark needs a CUDA GPU (none is visible); "
              "--device cpu only smoke-tests the code path", file=sys.stderr)
        return exitcodes.ENVIRONMENT
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("error: --device cpu needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
        return exitcodes.ENVIRONMENT
    if device == "cpu" and args.tune:
        print("error: --tune needs a CUDA GPU", file=sys.stderr)
        return exitcodes.USAGE

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    env = environment(torch, device)
    log(f"device: {env['gpu']} ({env['capability']}, {env['sm_count']} SMs)")
    bandwidth = measure_bandwidth(torch, device, nbytes=(1 << 30) if device == "cuda" else (1 << 24),
                                  reps=20 if device == "cuda" else 2)
    if device == "cuda":
        bandwidth["graph_node_floor_us"] = graph_node_floor_us(torch)
    log(f"copy bandwidth {bandwidth['copy_GBps']:.0f} GB/s, fill {bandwidth['fill_GBps']:.0f} GB/s")
    if args.budget_gib:
        budget = int(args.budget_gib * 2**30)
    else:
        budget = torch.cuda.mem_get_info()[0] // 2 if device == "cuda" else 1 << 30

    from dsv4kit.kernels import indexer
    from dsv4kit.validation.implementations import implementations

    impls, unavailable = implementations("indexer", device)
    for name, why in unavailable.items():
        log(f"{name}: {why}")
    points = []
    for point in grid_points(args.quick or device == "cpu"):
        if device == "cpu" and point["context"] > 131072:
            continue
        try:
            result = bench_point(torch, point, bandwidth, budget, log, device, impls)
        except Exception as exc:  # noqa: BLE001 - record the failure, keep measuring the rest
            log(f"point {point} failed: {type(exc).__name__}: {exc}")
            result = {**point, "error": f"{type(exc).__name__}: {exc}", "kernel_us": None,
                      "times_us": {}, "floor_us": None, "tilelang_target_met": False,
                      "floor_target_met": False}
        points.append(result)
        if result.get("error"):
            continue
        log(f"B={point['batch']:>2} len={fmt_tokens(point['tokens']):>4} "
            f"ctx={fmt_tokens(point['context']):>4}  "
            + "  ".join(f"{n}={fmt_us(t)}" for n, t in result["times_us"].items())
            + f"  floor={result['floor_us']:.2f} us")

    payload = {
        "schema": SCHEMA,
        "kind": "dsv4kit-bench-indexer",
        "command": "python -m dsv4kit.validation.bench_indexer " + " ".join(
            sys.argv[1:] if argv is None else list(argv)),
        "started_unix": started,
        "seconds": None,
        "environment": env,
        "bandwidth": bandwidth,
        "fallback_budget_bytes": budget,
        "timing": f"CUDA-graph replay, {CALLS_PER_GRAPH} calls per graph (1 when a call takes over "
                  f"1 ms), median of 5 batches; {TIMING_ROUNDS} interleaved rounds over the "
                  "implementations, the best kept (one round over 1 ms a call); inputs stay "
                  "resident between calls; every implementation on the same inputs in this process",
        "implementations": {
            EXACT_NAME: {"origin": "dsv4kit", "stock_default": False, "tail": "exact"},
            **{i.name: {"origin": i.origin, "stock_default": i.stock_default, "tail": i.tail}
               for i in impls}},
        "unavailable": unavailable,
        "kernel_config": {"programs_per_sm": indexer.PROGRAMS_PER_SM, "num_warps": indexer.NUM_WARPS,
                          "num_stages": indexer.NUM_STAGES, "fill_block": indexer.FILL_BLOCK,
                          "prefetch": indexer.PREFETCH, "direct": indexer.DIRECT,
                          "pin_first": indexer.PIN_FIRST},
        "targets": {"floor_factor": FLOOR_FACTOR, "floor_min_tokens": FLOOR_MIN_TOKENS,
                    "read_bytes_per_position": READ_BYTES_PER_POSITION,
                    "stock": f"{OURS} <= {TILELANG_NAME} at every point",
                    "speedup": {**SPEEDUP_POINT, "target": SPEEDUP_TARGET}},
        "points": points,
        "summary": summarise(points),
    }
    payload["seconds"] = round(time.time() - started, 1)
    json_path = os.path.join(args.out, "bench_indexer.json")
    bench_cli.write_json_atomic(json_path, payload)
    png = plot(payload, os.path.join(args.out, "bench_indexer.png"), log)
    print(render_summary(payload))
    print()
    print(render_table(payload))
    print()
    print(render_errors(payload))
    print(f"\nwrote {json_path}" + (f" and {png}" if png else ""), flush=True)
    if args.tune:  # after the main result is safely written
        payload["tuning"] = tune(torch, log)
        payload["seconds"] = round(time.time() - started, 1)
        bench_cli.write_json_atomic(json_path, payload)
    broken = [p for p in points if p.get("error") or p.get("pattern_ok", {}).get(OURS) is False]
    return exitcodes.CHECK_FAILED if broken else exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
