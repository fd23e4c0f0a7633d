"""Indexer benchmark at prefill and verify shapes: rows that share one request's keys.

``python -m dsv4kit.validation.bench_indexer_prefill [--out DIR] [--quick] [--fp4]``

SGLang 0.5.23 sends prefill through the paged decode entry (docs/sglang-contract.md §2.8): one row
per extend token, every row of a request with the same page-table row and a causal length.

* Shapes: one request's extend chunk of R in {1024, 4096, 8192} rows at prefixes of 0, 32K and
  124K tokens; two requests in one batch; verify steps of 6 rows a request at 16 and 64 requests;
  decode batches (one row a request, distinct pages) at B in {1, 16, 64, 256}. Pages are shuffled
  pool pages (fragmented); lengths are causal, ``(prefix + r + 1) // 4`` compressed positions.
* Rows: "dsv4kit" (the entry as the SGLang plugin calls it), "dsv4kit-per-row" (the per-row
  kernel every call used before the row-tile kernel), SGLang's TileLang indexer and torch fallback
  where they load (and the fallback fits the memory budget), each checked against the float64
  reference on a sample of rows.
* The FP8 floor: the shape's FLOPs (``sum_r L_r * H * 128 * 2``) at the ``torch._scaled_mm`` rate
  measured in the same run (``dsv4kit.validation.timing``). Times are medians of CUDA-graph
  replays over input copies that rotate past the L2; each implementation is timed in
  ``PASSES`` passes over all of them (every other pass in reverse order) and keeps its median
  pass (all passes are kept as ``times_us_passes``), after ``WARMUP_S`` of untimed replays.
* The launch floor: an empty one-program Triton kernel timed the same way
  (``timing.launch_floor_us``), a row of its own: no kernel launched like this beats it.
* ``--fp4``: the same prefill and verify shapes over the FP4 cache
  (``dsv4kit.kernels.indexer_fp4``): "dsv4kit-fp4" (the entry as the plugin calls it, row tiles
  from 1,024 rows) and "dsv4kit-fp4-per-row", each checked against the FP4 float64 reference on
  sampled rows. The floors are the same FLOPs at the FP8 and the bf16 rate: a GPU without an FP4
  tensor-core product (sm_90) runs the block-scaled product as bf16. SGLang's FP4 route on sm_120
  calls only DeepGEMM, which has no sm_90 kernel, so no stock row; no targets. Writes
  ``bench_indexer_fp4_prefill.json``.
* Targets (FP8): at every prefill shape ours <= 1.3x the floor where the prefix is >= 32K tokens and
  <= 1.6x at an empty prefix, faster than TileLang. Decode: the entry launches the per-row kernel
  at every decode shape (``indexer.uses_row_tiles``, an exact state, recorded per shape as
  ``entry_kernel``); the two columns are then the same launch, and ``pass_spread`` says how far
  their times moved between passes.

Writes ``bench_indexer_prefill.json`` under ``--out`` and prints the table; ``--render JSON`` prints
the table of an existing result (``--update-doc docs/indexer.md`` also writes it into the page's
``prefill`` block, or ``fp4_prefill`` for an ``--fp4`` result).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

SCHEMA = 1
HEADS = 64
OURS = "dsv4kit"
PER_ROW = "dsv4kit-per-row"
TILELANG = "sglang-tilelang"
TORCH = "sglang-torch"
OURS_FP4 = "dsv4kit-fp4"
PER_ROW_FP4 = "dsv4kit-fp4-per-row"
KIND = "dsv4kit-bench-indexer-prefill"
KIND_FP4 = "dsv4kit-bench-indexer-fp4-prefill"
FLOOR_LONG = 1.3  # prefix >= 32K tokens
FLOOR_EMPTY = 1.6  # empty prefix
FALLBACK_BUDGET = 40 << 30
# Passes over the implementations: whichever is timed first in a pass read up to ~10% slow on the
# H100, and a 3 us decode call moves by as much between passes; the median of three, in
# alternating order, takes both out.
PASSES = 3
WARMUP_S = 0.05  # untimed replays before each timing (timing.graph_time_us)


def shapes(quick: bool = False, fp4: bool = False) -> list[dict]:
    """Every benchmark shape: ``kind`` in prefill / verify / decode (decode not with ``fp4``),
    the requests as ``(prefix_tokens, rows)``."""
    out = []
    for rows in ((4096,) if quick else (1024, 4096, 8192)):
        for prefix in ((0, 126976) if quick else (0, 32768, 126976)):
            out.append({"kind": "prefill", "name": f"R={rows} prefix={prefix // 1024}K",
                        "requests": [(prefix, rows)], "prefix": prefix})
    out.append({"kind": "prefill", "name": "2 requests: 32K+2K, 124K+2K",
                "requests": [(32768, 2048), (126976, 2048)], "prefix": 32768})
    for n in (16, 64):
        out.append({"kind": "verify", "name": f"verify 6 rows x {n} requests at 32K",
                    "requests": [(32768 + 512 * i, 6) for i in range(n)], "prefix": 32768})
    if fp4:
        return out
    for batch in ((1, 256) if quick else (1, 16, 64, 256)):
        out.append({"kind": "decode", "name": f"decode B={batch} len 32K ctx 128K", "batch": batch})
    return out


def _inputs(torch, shape: dict, seed: int, fp4: bool = False):
    from dsv4kit.kernels import indexer_reference as ref
    from dsv4kit.validation import bench_indexer

    if fp4:
        from dsv4kit.kernels import indexer_fp4_reference as ref4

        return ref4.make_fp4_prefill_inputs(shape["requests"], HEADS, seed=seed, device="cuda")
    if shape["kind"] == "decode":
        pages = bench_indexer.table_pages(131072)
        return bench_indexer.make_bench_inputs(torch, shape["batch"], 32768 // 4, pages, seed=seed)
    return ref.make_prefill_inputs(shape["requests"], HEADS, seed=seed, device="cuda")


def _weights(inputs):
    return inputs.weights if hasattr(inputs, "weights") else inputs.weight


def flops(inputs) -> float:
    lengths = inputs.seq_lens.reshape(-1).clamp(0, inputs.max_seq_len).double()
    return float(lengths.sum()) * _weights(inputs).shape[1] * 128 * 2


def sample_rows(batch: int) -> list[int]:
    """The rows a check compares: the first and last six, and about 24 spread between."""
    rows = set(range(min(batch, 6))) | set(range(max(batch - 6, 0), batch))
    rows |= {r for r in range(0, batch, max(1, batch // 24))}
    return sorted(rows)


def _check(torch, out, inputs, tail: str) -> dict:
    from dsv4kit.kernels import indexer_fp4_reference as ref4
    from dsv4kit.kernels import indexer_reference as ref

    weights = _weights(inputs)
    rows = torch.tensor(sample_rows(weights.shape[0]), device=out.device)
    lens = inputs.seq_lens.reshape(-1)[rows]
    if hasattr(inputs, "q_fp4"):
        exact = ref4.exact_logits_f64((inputs.q_fp4[rows], inputs.q_sf[rows]), inputs.kv_cache,
                                      weights[rows], lens, inputs.page_table[rows],
                                      inputs.max_seq_len)
    else:
        exact = ref.exact_logits_f64(inputs.q_fp8[rows], inputs.kvcache, weights[rows], lens,
                                     inputs.page_table[rows], inputs.max_seq_len)
    stats = ref.compare(out[rows], exact, inputs.seq_lens.reshape(-1)[rows], tail=tail)
    return {"rel": stats["rel"], "pattern_ok": stats["pattern_ok"], "rows_checked": len(rows)}


def _per_row(q, kv, w, lens, table, meta, msl, clean=False):
    """The per-row kernel as the entry called it for every batch before the row-tile kernel."""
    from dsv4kit.kernels import indexer

    batch, _, pages, _, lens1, kv2, msl = indexer.check_args(q, kv, w, lens, table, msl, clean,
                                                             indexer.TAIL_SKIP)
    out = torch_empty(batch, msl, q.device)
    indexer.launch(q, kv2, w, lens1, table, out, kv2.shape[0], msl,
                   indexer.programs_per_row(batch, pages, q.device, tail=indexer.TAIL_SKIP),
                   tail=indexer.TAIL_SKIP)
    return out


def _fp4_per_row(q, kv, w, lens, table, meta, msl, clean=False):
    """The FP4 per-row kernel, as the FP4 entry called it for every batch before row tiles."""
    from dsv4kit.kernels import indexer, indexer_fp4

    q_fp4, q_sf, batch, _, pages, num_pages, lens1, kv2, msl = indexer_fp4.check_args(
        q, kv, w, lens, table, msl, clean, indexer.TAIL_SKIP)
    out = torch_empty(batch, msl, q_fp4.device)
    indexer_fp4.launch(q_fp4, q_sf, kv2, w, lens1, table, out, num_pages, msl,
                       indexer.programs_per_row(batch, pages, q_fp4.device, tail=indexer.TAIL_SKIP),
                       tail=indexer.TAIL_SKIP)
    return out


def torch_empty(batch, msl, device):
    import torch

    return torch.empty((batch, msl), dtype=torch.float32, device=device)


def implementations(torch, log, fp4: bool = False) -> tuple[list[tuple[str, object, str]], dict]:
    from dsv4kit.kernels import indexer
    from dsv4kit.validation import implementations as impls

    if fp4:
        from dsv4kit.kernels import indexer_fp4

        return [(OURS_FP4, indexer_fp4.fp8_fp4_paged_mqa_logits_for_sglang, "page"),
                (PER_ROW_FP4, _fp4_per_row, "page")], {}

    runs = [(OURS, indexer.fp8_paged_mqa_logits_for_sglang, "page"), (PER_ROW, _per_row, "page")]
    loaded, missing = impls.implementations("indexer", torch.device("cuda"))
    runs += [(i.name, i.fn, i.tail) for i in loaded if i.name in (TILELANG, TORCH)]
    for name, why in missing.items():
        log(f"{name}: {why}")
    return runs, missing


def bench_shape(torch, shape: dict, runs, rates: dict, log, fp4: bool = False) -> dict:
    from dsv4kit.validation import bench_indexer, timing

    first = _inputs(torch, shape, seed=0, fp4=fp4)
    per_copy = sum(t.numel() * t.element_size() for t in first.__dict__.values()
                   if hasattr(t, "element_size"))
    copies = [first] + [_inputs(torch, shape, seed=s, fp4=fp4) for s in
                        range(1, timing.copies_for_cold_l2(torch, per_copy, cap=8))]
    batch = _weights(first).shape[0]
    result = {k: v for k, v in shape.items() if k != "requests"}
    result.update(rows=batch, max_seq_len=first.max_seq_len, copies=len(copies),
                  flops=flops(first), times_us={}, checks={}, skipped={})
    result["floor_us"] = result["flops"] / rates["fp8_flops_per_s"] * 1e6
    if fp4:
        result["bf16_floor_us"] = result["flops"] / rates["bf16_flops_per_s"] * 1e6
    pages = first.page_table.shape[1]
    passes = [{} for _ in range(PASSES)]
    for i, timed in enumerate(passes):
        for name, fn, tail in (runs if i % 2 == 0 else runs[::-1]):
            if name in result["skipped"]:
                continue
            if name == TORCH and bench_indexer.fallback_peak_bytes(batch, pages) > FALLBACK_BUDGET:
                result["skipped"][name] = "over the fallback memory budget"
                continue
            try:
                if name not in result["checks"]:
                    out = fn(*first.args())
                    result["checks"][name] = _check(torch, out, first, tail)
                    del out
                calls = [lambda c=c, fn=fn: fn(*c.args()) for c in copies]
                timed[name] = timing.graph_time_us(torch, calls, warmup_s=WARMUP_S)
            except Exception as exc:  # noqa: BLE001 - one implementation failing is recorded
                result["skipped"][name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
                log(f"{name} at {shape['name']}: {result['skipped'][name]}")
            torch.cuda.empty_cache()
    result["times_us_passes"] = passes
    result["times_us"] = {name: statistics.median(p[name] for p in passes if name in p)
                          for name, _, _ in runs
                          if name not in result["skipped"] and any(name in p for p in passes)}
    ours, per_row = (result["times_us"].get(OURS_FP4 if fp4 else OURS),
                     result["times_us"].get(PER_ROW_FP4 if fp4 else PER_ROW))
    stock = result["times_us"].get(TILELANG)
    result["vs_floor"] = None if ours is None else ours / result["floor_us"]
    result["per_row_vs_floor"] = None if per_row is None else per_row / result["floor_us"]
    result["vs_per_row"] = None if ours is None or per_row is None else ours / per_row
    result["vs_tilelang"] = None if ours is None or stock is None else ours / stock
    if fp4:
        result["vs_bf16_floor"] = None if ours is None else ours / result["bf16_floor_us"]
    elif shape["kind"] == "prefill":
        bar = FLOOR_EMPTY if shape["prefix"] == 0 else FLOOR_LONG
        result["floor_bar"] = bar
        result["floor_met"] = result["vs_floor"] is not None and result["vs_floor"] <= bar
        result["tilelang_met"] = None if stock is None else ours is not None and ours < stock
    if not fp4:
        from dsv4kit.kernels import indexer

        # Which kernel the entry launches here: an exact state from its dispatch rule. Below the
        # row-tile thresholds the two columns are the same launch, and differ by the spread.
        result["entry_kernel"] = ("row tiles" if indexer.uses_row_tiles(batch, first.max_seq_len)
                                  else "per row")
        pairs = [p[OURS] / p[PER_ROW] for p in passes if OURS in p and PER_ROW in p]
        result["pass_spread"] = max((abs(r - 1) for r in pairs), default=None)
    if shape["kind"] == "decode":
        result["decode_met"] = result["entry_kernel"] == "per row"
    del copies, first
    torch.cuda.empty_cache()
    return result


def _fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _checks_ok(p: dict) -> bool:
    return all(c["pattern_ok"] and c["rel"] < 5e-3 for c in p["checks"].values())


def render_fp4(payload: dict) -> str:
    names = [OURS_FP4, PER_ROW_FP4]
    lines = ["| shape | rows | FP8 floor (us) | bf16 floor (us) | "
             + " | ".join(f"{n} (us)" for n in names)
             + " | ours / FP8 floor | ours / bf16 floor | ours / per-row | checks |",
             "|---|---|---|---|" + "---|" * len(names) + "---|---|---|---|"]
    for p in payload["points"]:
        t = p["times_us"]
        lines.append(f"| {p['name']} | {p['rows']} | {_fmt(p['floor_us'], 1)} | "
                     f"{_fmt(p['bf16_floor_us'], 1)} | "
                     + " | ".join(_fmt(t.get(n), 1) for n in names)
                     + f" | {_fmt(p['vs_floor'])} | {_fmt(p['vs_bf16_floor'])} | "
                     f"{_fmt(p['vs_per_row'])} | {'ok' if _checks_ok(p) else 'FAIL'} |")
    lines.append(f"| empty kernel (launch floor) | - | - | - | "
                 + " | ".join(_fmt(payload.get("launch_floor_us"), 1) for _ in names)
                 + " | - | - | - | - |")
    r, s = payload["rates"], payload["summary"]
    lines.append("")
    lines.append(f"Row tiles faster than the FP4 per-row kernel at every prefill shape with a "
                 f"prefix >= 32K: {'yes' if s['tiles_faster_long'] else 'NO'} (ours / per-row "
                 f"{_fmt(s['best_vs_per_row_long'])}-{_fmt(s['worst_vs_per_row_long'])}).")
    lines.append(f"Device: {payload['environment'].get('gpu')}; FP8 `_scaled_mm` rate "
                 f"{r['fp8_flops_per_s'] / 1e12:.0f} TFLOP/s, bf16 {r['bf16_flops_per_s'] / 1e12:.0f} "
                 f"TFLOP/s (same run). Command: `{payload['command']}`.")
    return "\n".join(lines)


def render(payload: dict) -> str:
    if payload.get("kind") == KIND_FP4:
        return render_fp4(payload)
    names = [OURS, PER_ROW, TILELANG, TORCH]
    lines = ["| shape | rows | FP8 floor (us) | " + " | ".join(f"{n} (us)" for n in names)
             + " | ours / floor | per-row / floor | ours / TileLang | checks |",
             "|---|---|---|" + "---|" * len(names) + "---|---|---|---|"]
    for p in payload["points"]:
        t = p["times_us"]
        ok = _checks_ok(p)
        lines.append(f"| {p['name']} | {p['rows']} | {_fmt(p['floor_us'], 1)} | "
                     + " | ".join(_fmt(t.get(n), 1) for n in names)
                     + f" | {_fmt(p['vs_floor'])} | {_fmt(p['per_row_vs_floor'])} | "
                     f"{_fmt(p['vs_tilelang'])} | {'ok' if ok else 'FAIL'} |")
    if payload.get("launch_floor_us") is not None:
        lines.append(f"| empty kernel (launch floor) | - | - | "
                     + " | ".join(_fmt(payload["launch_floor_us"], 1) for _ in names)
                     + " | - | - | - | - |")
    r = payload["rates"]
    s = payload["summary"]
    lines.append("")
    lines.append(f"Targets: ours <= {FLOOR_LONG}x the FP8 floor at a prefix >= 32K (worst "
                 f"{_fmt(s['worst_vs_floor_long'])}x), <= {FLOOR_EMPTY}x at an empty prefix (worst "
                 f"{_fmt(s['worst_vs_floor_empty'])}x): {'met' if s['floor_met_everywhere'] else 'NOT met'}; "
                 f"faster than TileLang at every prefill shape: "
                 f"{ {True: 'yes', False: 'NO', None: 'TileLang not measured'}[s['faster_than_tilelang_everywhere']] }; "
                 f"decode launches the per-row kernel at every decode shape: "
                 f"{'yes' if s['decode_is_per_row_kernel'] else 'NO'} (the same launch in both "
                 f"columns; they differ between passes by up to {_pct(s['decode_pass_spread'])}).")
    launch = payload.get("launch_floor_us")
    below = [p["name"] for p in payload["points"] if p.get("floor_bar") and launch is not None
             and p["floor_us"] * p["floor_bar"] < launch]
    if below:
        lines.append(f"Below the launch floor: at {', '.join(below)} the bar (FP8 floor x "
                     f"{FLOOR_EMPTY}) is less than one empty kernel's {launch:.1f} us.")
    lines.append(f"Device: {payload['environment'].get('gpu')}; FP8 `_scaled_mm` rate "
                 f"{r['fp8_flops_per_s'] / 1e12:.0f} TFLOP/s, bf16 {r['bf16_flops_per_s'] / 1e12:.0f} "
                 f"TFLOP/s, copy {payload['copy_bytes_per_s'] / 1e12:.2f} TB/s (same run). "
                 f"Command: `{payload['command']}`.")
    return "\n".join(lines)


def summarise_fp4(points: list[dict]) -> dict:
    long = [p["vs_per_row"] for p in points if p["kind"] == "prefill" and p["prefix"]
            and p["vs_per_row"] is not None]
    return {"tiles_faster_long": bool(long) and max(long) < 1.0,
            "best_vs_per_row_long": min(long, default=None),
            "worst_vs_per_row_long": max(long, default=None)}


def summarise(points: list[dict]) -> dict:
    prefill = [p for p in points if p["kind"] == "prefill"]
    decode = [p for p in points if p["kind"] == "decode"]
    return {
        "floor_met_everywhere": all(p.get("floor_met") for p in prefill),
        "faster_than_tilelang_everywhere": (all(p.get("tilelang_met") for p in prefill)
                                            if all(p.get("tilelang_met") is not None for p in prefill)
                                            else None),
        "decode_is_per_row_kernel": bool(decode) and all(p.get("decode_met") for p in decode),
        "decode_pass_spread": max((p["pass_spread"] for p in decode
                                   if p.get("pass_spread") is not None), default=None),
        "worst_vs_floor_long": max((p["vs_floor"] for p in prefill if p["prefix"] and p["vs_floor"]),
                                   default=None),
        "worst_vs_floor_empty": max((p["vs_floor"] for p in prefill if not p["prefix"] and p["vs_floor"]),
                                    default=None),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.validation.bench_indexer_prefill",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="directory for bench_indexer_prefill.json")
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--fp4", action="store_true",
                        help="the FP4-cache entry at the prefill and verify shapes")
    parser.add_argument("--render", metavar="JSON", help="print the table of an existing result")
    parser.add_argument("--update-doc", metavar="MD",
                        help="with --render: fill the page's <!-- generated:prefill --> block "
                             "(fp4_prefill for an --fp4 result)")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as fh:
            payload = json.load(fh)
        table = render(payload)
        if args.update_doc:
            from dsv4kit.validation import bench_indexer

            block = "fp4_prefill" if payload.get("kind") == KIND_FP4 else "prefill"
            bench_indexer.fill_generated(args.update_doc, {block: table})
        print(table)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_indexer_prefill: needs a CUDA GPU", file=sys.stderr)
        return 5
    from dsv4kit.validation import bench_indexer, timing

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    started = time.time()
    env = bench_indexer.environment(torch, "cuda")
    rates = timing.matmul_rates(torch)
    copy = timing.copy_bandwidth(torch)
    launch_floor = timing.launch_floor_us(torch)
    log(f"launch floor (empty kernel): {launch_floor:.2f} us")
    log(f"rates: fp8 {rates['fp8_flops_per_s'] / 1e12:.0f} TFLOP/s, bf16 "
        f"{rates['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s, copy {copy / 1e12:.2f} TB/s")
    runs, missing = implementations(torch, log, fp4=args.fp4)
    points = []
    for shape in shapes(args.quick, fp4=args.fp4):
        points.append(bench_shape(torch, shape, runs, rates, log, fp4=args.fp4))
        p = points[-1]
        log(f"{p['name']}: " + ", ".join(f"{n}={_fmt(t, 1)}" for n, t in p["times_us"].items())
            + f" floor={_fmt(p['floor_us'], 1)} ours/floor={_fmt(p['vs_floor'])}")
    payload = {"schema": SCHEMA, "kind": KIND_FP4 if args.fp4 else KIND,
               "command": "python -m dsv4kit.validation.bench_indexer_prefill "
                          + " ".join(argv if argv is not None else sys.argv[1:]),
               "environment": env, "host": platform.node(), "rates": rates,
               "copy_bytes_per_s": copy, "launch_floor_us": launch_floor,
               "unavailable": missing,
               "timing": timing.__doc__.split("\n\n")[1].strip(),
               "points": points,
               "summary": summarise_fp4(points) if args.fp4 else summarise(points),
               "seconds": round(time.time() - started, 1)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_indexer_fp4_prefill.json" if args.fp4
                        else "bench_indexer_prefill.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1)
    os.replace(path + ".tmp", path)
    print(render(payload))
    print(json.dumps(payload["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
