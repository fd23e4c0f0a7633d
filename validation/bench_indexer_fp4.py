"""The FP4-cache indexer beside the FP8 ones, against each cache's read floor, in one run.

``python -m dsv4kit.validation.bench_indexer_fp4 [--out DIR] [--quick]``; ``--render JSON`` prints
the table of a result, ``--update-doc MD --fp4-json JSON`` regenerates a page's ``fp4_summary``
and ``fp4_table`` blocks. It uses ``bench_indexer``'s bandwidth, environment and page-table pieces.

* Rows: ours FP4 (``dsv4kit.kernels.indexer_fp4`` as the plugin calls it), ours FP8
  (``dsv4kit.kernels.indexer`` as the plugin calls it) and SGLang 0.5.23's TileLang FP8 indexer,
  unmodified, where it loads (``dsv4kit.validation.implementations``). DeepGEMM's
  ``fp8_fp4_paged_mqa_logits`` is not a row here (no sm_90 FP4 kernel); ``validate`` measures
  it on the box.
* Grid: B in {1, 16, 64, 128} x context in {8K, 128K, 1M} x actual length in {2K, 32K, 128K}
  tokens (length <= context), H = 64, ``max_seq_len = ceil((ctx + 4) / 256) * 64``.
* Fragmented page tables: each row's live pages are a random permutation of pool pages; entries
  past the length are random valid ids.
* Pools cycled: each point builds ``copies`` page tables over disjoint pages of one pool (FP8 and
  FP4 pools with the same page ids), enough that the cycled FP4 bytes reach ``CYCLE_BYTES``
  (4x the box's 128 MB L2) where memory allows (``MAX_COPIES``); the CUDA graph replays one call
  per copy in turn. Points whose cycled bytes stay under ``2 * L2`` are marked ``l2`` in the table.
* Floors: ``B * L * 72`` bytes (68 FP4 cache bytes read, a 4-byte logit written) and
  ``B * L * 136`` (FP8), over the copy bandwidth measured in the same run.
* Targets where the FP4 reads exceed 64 MB: ours FP4 <= 1.2 x its floor and <= 0.6 x ours FP8.

Prefill and verify shapes (rows that share keys, the FP4 row-tile path) are in
``python -m dsv4kit.validation.bench_indexer_prefill --fp4``.
"""

from __future__ import annotations

import math
import os
import sys
import time

from dsv4kit.validation import bench_cli
from dsv4kit.validation import bench_indexer as base

SCHEMA = 1
KIND = "dsv4kit-bench-indexer-fp4"
BATCHES = (1, 16, 64, 128)
LENGTHS_TOKENS = (2048, 32768, 131072)
CONTEXTS_TOKENS = (8192, 131072, 1048576)
FP4_BYTES_PER_POSITION = 72  # 64 packed values + 4 exponents read, a 4-byte logit written
FP8_BYTES_PER_POSITION = base.READ_BYTES_PER_POSITION  # 136
L2_BYTES = 128 << 20  # the box's L2 (the H200 has 50 MB)
CYCLE_BYTES = 4 * L2_BYTES
MAX_COPIES = 64
TARGET_MIN_BYTES = 64 << 20
FLOOR_FACTOR = 1.2
VS_FP8_FACTOR = 0.6
FP4 = "dsv4kit-fp4"
FP8 = "dsv4kit-fp8"
TILELANG = base.TILELANG_NAME
ORDER = (FP4, FP8, TILELANG)
REL_BAR = 5e-4


def grid_points(quick: bool) -> list[dict]:
    batches = (1, 64) if quick else BATCHES
    lengths = (2048, 32768) if quick else LENGTHS_TOKENS
    contexts = (8192, 131072) if quick else CONTEXTS_TOKENS
    points = []
    for batch in batches:
        for context in contexts:
            for tokens in lengths:
                if tokens <= context:
                    pages = base.table_pages(context)
                    points.append({"batch": batch, "heads": base.HEADS, "tokens": tokens,
                                   "c4_len": tokens // 4, "context": context, "pages": pages,
                                   "max_seq_len": pages * base.PAGE})
    return points


def copies_for(point: dict) -> int:
    live_bytes = point["batch"] * point["c4_len"] * FP4_BYTES_PER_POSITION
    return max(2, min(MAX_COPIES, math.ceil(CYCLE_BYTES / max(live_bytes, 1))))


def make_point_inputs(torch, point: dict, copies: int, device: str, seed: int = 0):
    """One FP8 and one FP4 pool with the same page count; ``copies`` fragmented tables into
    disjoint pages of them; shared q / weights / lengths. Returns ``(fp8_args, fp4_args)``, two
    lists of per-copy SGLang argument tuples."""
    from dsv4kit.kernels import indexer_fp4_reference as r4
    from dsv4kit.kernels.indexer_reference import INDEX_WEIGHT_SCALE, quantize_rows

    batch, heads, length, pages = point["batch"], point["heads"], point["c4_len"], point["pages"]
    gen = torch.Generator(device=device).manual_seed(seed)
    live = -(-length // base.PAGE)
    num_pages = copies * batch * live + 1
    fp8_pool = torch.empty(num_pages, base.PAGE_BYTES, dtype=torch.uint8, device=device)
    fp4_pool = torch.empty(num_pages, r4.PAGE_BYTES, dtype=torch.uint8, device=device)
    step = 4096  # pages generated at a time: bounds the fp32 temporaries
    for start in range(0, num_pages, step):
        n = min(step, num_pages - start)
        k = torch.randn(n, base.PAGE, 128, device=device, generator=gen)
        k8, s_k = quantize_rows(k)
        fp8_pool[start:start + n, :8192] = k8.view(torch.uint8).reshape(n, -1)
        fp8_pool[start:start + n, 8192:] = s_k.contiguous().view(torch.uint8).reshape(n, -1)
        fp4_pool[start:start + n] = r4.pack_pool(*r4.quantize_fp4(k)).view(n, -1)
    q = torch.randn(batch, heads, 128, device=device, generator=gen)
    q8, s_q = quantize_rows(q)
    w_raw = torch.randn(batch, heads, device=device, generator=gen) * INDEX_WEIGHT_SCALE
    q4 = r4.pack_q(*r4.quantize_fp4(q))
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=device)
    perm = torch.randperm(num_pages - 1, device=device, generator=gen).to(torch.int32) + 1
    fp8_view = fp8_pool.view(num_pages, base.PAGE, 1, 132)
    fp4_view = fp4_pool.view(num_pages, base.PAGE, 1, r4.SLOT_BYTES)
    fp8_args, fp4_args = [], []
    for c in range(copies):
        table = torch.randint(0, num_pages, (batch, pages), device=device, generator=gen,
                              dtype=torch.int32)
        table[:, :live] = perm[c * batch * live:(c + 1) * batch * live].view(batch, live)
        fp8_args.append((q8.unsqueeze(1).contiguous(), fp8_view, (w_raw * s_q).float().contiguous(),
                         seq_lens, table, None, pages * base.PAGE, False))
        fp4_args.append((q4, fp4_view, w_raw.float().contiguous(), seq_lens, table, None,
                         pages * base.PAGE, False))
    return fp8_args, fp4_args


def _time(torch, fn, args_list, eager_s: float) -> float:
    """Microseconds per call (``dsv4kit.validation.timing``): one graph cycling the copies."""
    from dsv4kit.validation import timing

    rounds = max(2, min(50, int(0.2 / max(eager_s * len(args_list), 1e-6))))
    return timing.graph_time_us(torch, [lambda a=a: fn(*a) for a in args_list], rounds=rounds,
                                samples=5)


def _check(torch, name, fn, args, tail):
    """rel error of one call (copy 0) against float64, and whether the pattern holds."""
    from dsv4kit.kernels import indexer_fp4_reference as r4
    from dsv4kit.kernels import indexer_reference as r8

    out = fn(*args)
    if name == FP4:
        exact = r4.exact_logits_f64(*args[:5], args[6])
    else:
        exact = r8.exact_logits_f64(args[0], args[1], args[2], args[3], args[4], args[6])
    stats = r8.compare(out, exact, args[3], tail=tail)
    del out, exact
    return stats


def bench_point(torch, point: dict, bandwidth: dict, impls: dict, log) -> dict:
    copies = copies_for(point)
    fp8_args, fp4_args = make_point_inputs(torch, point, copies, "cuda")
    result = dict(point, copies=copies, times_us={}, rel={}, pattern_ok={}, skipped={})
    timers = {}
    for name, (fn, tail) in impls.items():
        args_list = fp4_args if name == FP4 else fp8_args
        try:
            stats = _check(torch, name, fn, args_list[0], tail)
            result["rel"][name] = stats["rel"]
            result["pattern_ok"][name] = stats["pattern_ok"]
            started = time.perf_counter()
            fn(*args_list[0])
            torch.cuda.synchronize()
            timers[name] = (fn, args_list, time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - one implementation failing is recorded
            log(f"{name} failed at {_label(point)}: {type(exc).__name__}: {str(exc)[:200]}")
            result["skipped"][name] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
    samples = {name: [] for name in timers}
    for _ in range(base.TIMING_ROUNDS):  # interleaved, best round kept
        for name, (fn, args_list, eager_s) in timers.items():
            try:
                samples[name].append(_time(torch, fn, args_list, eager_s))
            except Exception as exc:  # noqa: BLE001
                result["skipped"][name] = f"timing failed: {type(exc).__name__}: {str(exc)[:120]}"
    for name in impls:
        values = samples.get(name)
        result["times_us"][name] = min(values) if values and name not in result["skipped"] else None
    _derive(result, bandwidth)
    del fp8_args, fp4_args
    torch.cuda.empty_cache()
    return result


def _derive(result: dict, bandwidth: dict) -> None:
    positions = result["batch"] * result["c4_len"]
    gbps = bandwidth["copy_GBps"] * 1e9
    result["fp4_bytes"] = positions * FP4_BYTES_PER_POSITION
    result["fp8_bytes"] = positions * FP8_BYTES_PER_POSITION
    result["fp4_floor_us"] = result["fp4_bytes"] / gbps * 1e6
    result["fp8_floor_us"] = result["fp8_bytes"] / gbps * 1e6
    result["cycled_fp4_bytes"] = result["copies"] * result["fp4_bytes"]
    result["l2_resident"] = result["cycled_fp4_bytes"] < 2 * L2_BYTES
    times = result["times_us"]
    fp4, fp8, tl = times.get(FP4), times.get(FP8), times.get(TILELANG)
    result["fp4_vs_floor"] = None if fp4 is None else fp4 / result["fp4_floor_us"]
    result["fp8_vs_floor"] = None if fp8 is None else fp8 / result["fp8_floor_us"]
    result["fp4_vs_fp8"] = None if fp4 is None or fp8 is None else fp4 / fp8
    result["fp4_vs_tilelang"] = None if fp4 is None or tl is None else fp4 / tl
    applies = result["fp4_bytes"] > TARGET_MIN_BYTES
    result["target_applies"] = applies
    result["target_met"] = None if not applies else bool(
        result["fp4_vs_floor"] is not None and result["fp4_vs_floor"] <= FLOOR_FACTOR
        and result["fp4_vs_fp8"] is not None and result["fp4_vs_fp8"] <= VS_FP8_FACTOR)


def _label(p: dict) -> str:
    return (f"B={p['batch']} len={base.fmt_tokens(p['tokens'])} "
            f"ctx={base.fmt_tokens(p['context'])}")


def summarise(points: list[dict]) -> dict:
    applies = [p for p in points if p.get("target_applies")]
    missed = [_label(p) for p in applies if not p.get("target_met")]
    wrong = [f"{_label(p)} {n}" for p in points for n, ok in p.get("pattern_ok", {}).items()
             if not ok or (p.get("rel", {}).get(n) or 0) > REL_BAR]
    return {"points": len(points), "target_points": len(applies),
            "target_met": len(applies) - len(missed), "target_missed": missed,
            "incorrect": wrong}


def _fmt(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_table(payload: dict) -> str:
    """Markdown table of a result: one row per point, the three implementations side by side."""
    head = ("| B | context | length | FP4 read MB | ours FP4 us | FP4 floor us | FP4/floor | "
            "ours FP8 us | FP8 floor us | FP8/floor | TileLang FP8 us | FP4/FP8 | FP4/TileLang | "
            "pools |")
    lines = [head, "|" + "---|" * 14]
    for p in payload["points"]:
        t = p.get("times_us", {})
        pools = f"{p.get('copies', '-')}" + (" (l2)" if p.get("l2_resident") else "")
        lines.append(
            f"| {p['batch']} | {base.fmt_tokens(p['context'])} | {base.fmt_tokens(p['tokens'])} | "
            f"{_fmt(p.get('fp4_bytes', 0) / 1e6, 1)} | {base.fmt_us(t.get(FP4))} | "
            f"{_fmt(p.get('fp4_floor_us'))} | {_fmt(p.get('fp4_vs_floor'))} | "
            f"{base.fmt_us(t.get(FP8))} | {_fmt(p.get('fp8_floor_us'))} | {_fmt(p.get('fp8_vs_floor'))} | "
            f"{base.fmt_us(t.get(TILELANG))} | {_fmt(p.get('fp4_vs_fp8'))} | "
            f"{_fmt(p.get('fp4_vs_tilelang'))} | {pools} |")
    return "\n".join(lines)


def render_summary(payload: dict) -> str:
    s = payload["summary"]
    env = payload["environment"]
    bw = payload["bandwidth"]
    lines = [f"{env.get('gpu')} ({env.get('capability')}), torch {env.get('torch')}, triton "
             f"{env.get('triton')}; copy bandwidth {bw['copy_GBps']:.0f} GB/s.",
             f"Target (FP4 reads > 64 MB: ours FP4 <= {FLOOR_FACTOR} x FP4 floor and <= "
             f"{VS_FP8_FACTOR} x ours FP8): met at {s['target_met']} of {s['target_points']} points"
             + (f"; missed: {', '.join(s['target_missed'])}" if s["target_missed"] else "") + "."]
    unavailable = payload.get("unavailable") or {}
    if unavailable:
        lines.append("Not measured: " + "; ".join(f"{k}: {v}" for k, v in unavailable.items()) + ".")
    lines.append("Correctness (each implementation against float64 on copy 0, rel <= "
                 f"{REL_BAR:g}, -inf pattern): "
                 + ("all correct." if not s["incorrect"] else "INCORRECT: " + ", ".join(s["incorrect"])))
    return "\n".join(lines)


def implementations_here(torch, log):
    """``{name: (fn, tail)}`` for the rows, and ``{name: why}`` for those that cannot run."""
    from dsv4kit.kernels import indexer, indexer_fp4
    from dsv4kit.validation.implementations import implementations

    impls = {FP4: (indexer_fp4.fp8_fp4_paged_mqa_logits_for_sglang, "page"),
             FP8: (indexer.fp8_paged_mqa_logits_for_sglang, "page")}
    loaded, missing = implementations("indexer", "cuda")
    unavailable = {k: v for k, v in missing.items() if k == TILELANG}
    for impl in loaded:
        if impl.name == TILELANG:
            impls[TILELANG] = (impl.fn, impl.tail)
    for name, why in unavailable.items():
        log(f"{name}: {why}")
    return impls, unavailable


def run(args, log) -> int:
    """The benchmark (``args``: ``out``, ``quick``)."""
    import torch

    from dsv4kit.core import exitcodes

    if not torch.cuda.is_available():
        print("error: the FP4 indexer benchmark needs a CUDA GPU", file=sys.stderr)
        return exitcodes.ENVIRONMENT
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    env = base.environment(torch, "cuda")
    bandwidth = base.measure_bandwidth(torch, "cuda")
    log(f"device: {env['gpu']}; copy bandwidth {bandwidth['copy_GBps']:.0f} GB/s")
    impls, unavailable = implementations_here(torch, log)
    points = []
    for point in grid_points(args.quick):
        try:
            result = bench_point(torch, point, bandwidth, impls, log)
        except Exception as exc:  # noqa: BLE001 - record the failure, keep measuring
            log(f"{_label(point)} failed: {type(exc).__name__}: {exc}")
            result = {**point, "error": f"{type(exc).__name__}: {exc}", "times_us": {}}
            torch.cuda.empty_cache()
        points.append(result)
        log(_label(point) + "  " + "  ".join(
            f"{n}={base.fmt_us(t)}" for n, t in result.get("times_us", {}).items()))
    payload = {
        "schema": SCHEMA, "kind": KIND,
        "command": "python -m dsv4kit.validation.bench_indexer_fp4 " + " ".join(sys.argv[1:]),
        "started_unix": started, "environment": env, "bandwidth": bandwidth,
        "timing": ("CUDA-graph replay of one call per pool copy in turn (copies: enough page "
                   f"tables over disjoint pages that the cycled FP4 bytes reach {CYCLE_BYTES >> 20} "
                   f"MB, at most {MAX_COPIES}, at least 2), median of 5 batches; "
                   f"{base.TIMING_ROUNDS} interleaved rounds, the best kept"),
        "implementations": {FP4: "dsv4kit.kernels.indexer_fp4 (skip tail)",
                            FP8: "dsv4kit.kernels.indexer (skip tail)",
                            TILELANG: "SGLang 0.5.23 tilelang_fp8_paged_mqa_logits, unmodified"},
        "unavailable": unavailable,
        "floors": {"fp4_bytes_per_position": FP4_BYTES_PER_POSITION,
                   "fp8_bytes_per_position": FP8_BYTES_PER_POSITION},
        "targets": {"min_fp4_bytes": TARGET_MIN_BYTES, "floor_factor": FLOOR_FACTOR,
                    "vs_fp8_factor": VS_FP8_FACTOR},
        "points": points, "summary": summarise(points),
    }
    payload["seconds"] = round(time.time() - started, 1)
    path = os.path.join(args.out, "bench_indexer_fp4.json")
    bench_cli.write_json_atomic(path, payload)
    print(render_summary(payload))
    print()
    print(render_table(payload))
    print(f"\nwrote {path}", flush=True)
    broken = [p for p in points if p.get("error")] or payload["summary"]["incorrect"]
    return exitcodes.CHECK_FAILED if broken else exitcodes.OK


def main(argv=None) -> int:
    import json

    from dsv4kit.core import exitcodes

    parser = bench_cli.new_parser("bench_indexer_fp4", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="directory for bench_indexer_fp4.json")
    parser.add_argument("--quick", action="store_true", help="a small subset of the grid")
    parser.add_argument("--render", metavar="JSON", help="print the markdown table of a result and exit")
    parser.add_argument("--update-doc", metavar="MD",
                        help="regenerate the fp4_summary / fp4_table blocks of this page from --fp4-json")
    parser.add_argument("--fp4-json", help="the result --update-doc shows")
    args = parser.parse_args(list(argv) if argv is not None else None)
    source = args.render or args.fp4_json
    if args.update_doc and not args.fp4_json:
        print("error: --update-doc needs --fp4-json", file=sys.stderr)
        return exitcodes.USAGE
    if source:
        try:
            with open(source) as fh:
                payload = json.load(fh)
            if args.update_doc:
                base.fill_generated(args.update_doc, {"fp4_summary": render_summary(payload),
                                                      "fp4_table": render_table(payload)})
                print(f"updated {args.update_doc}")
                return exitcodes.OK
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exitcodes.USAGE
        print(render_summary(payload))
        print()
        print(render_table(payload))
        return exitcodes.OK
    return run(args, lambda msg: print(msg, file=sys.stderr, flush=True))


if __name__ == "__main__":
    sys.exit(main())
