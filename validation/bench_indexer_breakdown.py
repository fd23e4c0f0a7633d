"""Where the row-tile indexer's time above the FP8 floor goes: the kernel with parts taken out.

``python -m dsv4kit.validation.bench_indexer_breakdown [--out DIR]``; ``--render JSON`` prints the
table of a result (``--update-doc MD`` fills the page's ``prefill_breakdown`` block);
``--profile-call`` runs two calls of the entry at one 4K-row chunk over a 124K prefix and
exits, for ``ncu -k regex:_shared_rows_kernel --launch-skip 1 --launch-count 1``.

A measuring instrument, not a product path. ``_variant_kernel`` is the shared-page loop of
``dsv4kit.kernels.indexer_tiles`` (tile decision, pipelined key loads, one fp8 product of
``[64 x 128] @ [128 x ROWS*H]`` a page) with its epilogue cut at one of four places:

* ``full``: as the product (ReLU, weights, head sum, key scales, the length mask, the store);
* ``no relu/weights``: the head sum of the raw products, then scales, mask and store;
* ``no mask/store``: the full maths, summed in registers, one store per program at the end;
* ``product only``: the products accumulated into one register tile, one store at the end.

Rows: the entry as the SGLang plugin calls it (``dsv4kit``) and the four variants, at the
prefill shapes of ``bench_indexer_prefill`` (one request), on the same inputs and with the same
timing (``dsv4kit.validation.timing``), each over the same FP8 floor. Only ``full`` computes the
real result; it is checked against the float64 reference like the entry.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import triton
import triton.language as tl

from dsv4kit.kernels.indexer_rows import row_scalars, tile_shares_pages
from dsv4kit.kernels.indexer_tiles import load_key_page

SCHEMA = 1
KIND = "dsv4kit-bench-indexer-breakdown"
VARIANTS = {"full": 0, "no relu/weights": 1, "no mask/store": 2, "product only": 3}
SHAPES = ("R=1024 prefix=32K", "R=1024 prefix=124K", "R=4096 prefix=32K", "R=4096 prefix=124K",
          "R=8192 prefix=32K", "R=8192 prefix=124K", "R=4096 prefix=0K", "R=8192 prefix=0K")
PROFILE_SHAPE = "R=4096 prefix=124K"


@triton.jit
def _variant_kernel(q_ptr, kv_ptr, w_ptr, seq_lens_ptr, page_table_ptr, out_ptr, seq_lens_stride,
                    pt_stride, num_pages, max_seq_len, batch, progs, ROWS: tl.constexpr,
                    H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    PAGE_BYTES: tl.constexpr, SCALE_OFFSET: tl.constexpr, CUT: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    offs_t = tl.arange(0, PAGE)
    offs_d = tl.arange(0, D)
    seq_len, n_pages, pt_rows, out_rows, store_end = row_scalars(
        seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr,
        tile * ROWS + tl.arange(0, ROWS), batch, max_seq_len, PAGE)
    kv_fp8 = kv_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    kv_f32 = kv_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
    n_max = tl.max(n_pages, axis=0)
    if tile_shares_pages(pt_rows, n_pages, n_max, 0, 1, 64):
        offs_m = tl.arange(0, ROWS * H)
        m_live = (tile * ROWS + offs_m // H) < batch
        q = tl.load(q_ptr + (tile * (ROWS * H) + offs_m)[:, None] * D + offs_d[None, :],
                    mask=m_live[:, None], other=0.0)
        w = tl.load(w_ptr + tile * (ROWS * H) + offs_m, mask=m_live, other=0.0)
        acc = tl.zeros((PAGE, ROWS * H), tl.float32)
        acc_rows = tl.zeros((ROWS, PAGE), tl.float32)
        ids_next = tl.load(pt_rows + j, mask=j < n_pages, other=-1)
        for p in range(j, n_max, progs):
            lead = tl.max(ids_next, axis=0)
            ids_next = tl.load(pt_rows + (p + progs), mask=(p + progs) < n_pages, other=-1)
            ok = (lead >= 0) & (lead < num_pages)
            k, s_k = load_key_page(kv_fp8, kv_f32, lead, ok, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
            if CUT == 3:
                acc = tl.dot(k, tl.trans(q), acc)
            else:
                scores = tl.dot(k, tl.trans(q))
                if CUT != 1:
                    scores = tl.maximum(scores, 0.0) * w[None, :]
                logit = tl.trans(tl.sum(tl.reshape(scores, (PAGE, ROWS, H)), axis=2))
                logit = logit * s_k[None, :]
                if CUT == 2:
                    acc_rows += logit
                else:
                    t = p * PAGE + offs_t
                    logit = tl.where(t[None, :] < tl.where(ok, seq_len, 0)[:, None], logit,
                                     float("-inf"))
                    tl.store(out_rows[:, None] + t[None, :], logit,
                             mask=t[None, :] < store_end[:, None])
        # One store per program keeps the cut work live (the values are not logits).
        if CUT == 3:
            tl.store(out_ptr + tile * PAGE + offs_t, tl.sum(acc, axis=1))
        if CUT == 2:
            tl.store(out_ptr + tile * PAGE + offs_t, tl.sum(acc_rows, axis=0))


def launch_variant(torch, inputs, cut: int):
    """One call of the variant on ``inputs`` (``IndexerInputs``) with the entry's grid."""
    from dsv4kit.kernels import indexer, indexer_tiles

    batch, heads, pages, num_pages, lens, kv, msl = indexer.check_args(
        inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens, inputs.page_table,
        inputs.max_seq_len, False, indexer.TAIL_SKIP)
    out = torch.empty((batch, msl), dtype=torch.float32, device=inputs.q_fp8.device)
    tiles = -(-batch // indexer_tiles.ROWS)
    progs = indexer_tiles.programs_per_tile(indexer.programs_per_row(
        tiles, pages, inputs.q_fp8.device, programs_per_sm=indexer.SHARED_ROWS_PROGRAMS_PER_SM,
        tail=indexer.TAIL_SKIP))
    _variant_kernel[(tiles, progs)](
        inputs.q_fp8, kv, inputs.weight, lens, inputs.page_table, out, lens.stride(0),
        inputs.page_table.stride(0), num_pages, msl, batch, progs, ROWS=indexer_tiles.ROWS,
        H=heads, D=indexer_tiles.HEAD_DIM, PAGE=indexer_tiles.PAGE_SIZE,
        PAGE_BYTES=indexer_tiles.PAGE_BYTES, SCALE_OFFSET=indexer_tiles.SCALE_OFFSET, CUT=cut,
        num_warps=indexer_tiles.NUM_WARPS, num_stages=indexer_tiles.NUM_STAGES)
    return out


def _shapes() -> list[dict]:
    from dsv4kit.validation import bench_indexer_prefill as prefill

    by_name = {s["name"]: s for s in prefill.shapes()}
    return [by_name[n] for n in SHAPES]


def bench_shape(torch, shape: dict, rates: dict) -> dict:
    from dsv4kit.kernels import indexer
    from dsv4kit.validation import bench_indexer_prefill as prefill, timing

    first = prefill._inputs(torch, shape, seed=0)
    per_copy = sum(t.numel() * t.element_size() for t in first.__dict__.values()
                   if hasattr(t, "element_size"))
    copies = [first] + [prefill._inputs(torch, shape, seed=s)
                        for s in range(1, timing.copies_for_cold_l2(torch, per_copy, cap=8))]
    result = {"name": shape["name"], "rows": first.q_fp8.shape[0], "flops": prefill.flops(first)}
    result["floor_us"] = result["flops"] / rates["fp8_flops_per_s"] * 1e6
    runs = [("dsv4kit", lambda c: indexer.fp8_paged_mqa_logits_for_sglang(*c.args()))]
    runs += [(name, lambda c, cut=cut: launch_variant(torch, c, cut))
             for name, cut in VARIANTS.items()]
    result["checks"] = {name: prefill._check(torch, fn(first), first, "page")
                        for name, fn in runs[:2]}
    result["times_us"] = {}
    for name, fn in runs:
        result["times_us"][name] = timing.graph_time_us(
            torch, [lambda c=c, fn=fn: fn(c) for c in copies], warmup_s=prefill.WARMUP_S)
    result["vs_floor"] = {n: t / result["floor_us"] for n, t in result["times_us"].items()}
    del copies, first
    torch.cuda.empty_cache()
    return result


def render(payload: dict) -> str:
    names = ["dsv4kit"] + list(VARIANTS)
    lines = ["| shape | FP8 floor (us) | " + " | ".join(f"{n} (us / floor)" for n in names)
             + " | checks |", "|---|---|" + "---|" * len(names) + "---|"]
    for p in payload["points"]:
        ok = all(c["pattern_ok"] and c["rel"] < 5e-3 for c in p["checks"].values())
        lines.append(f"| {p['name']} | {p['floor_us']:.1f} | "
                     + " | ".join(f"{p['times_us'][n]:.1f} / {p['vs_floor'][n]:.2f}" for n in names)
                     + f" | {'ok' if ok else 'FAIL'} |")
    r = payload["rates"]
    lines.append("")
    lines.append(f"Device: {payload['environment'].get('gpu')}; FP8 `_scaled_mm` rate "
                 f"{r['fp8_flops_per_s'] / 1e12:.0f} TFLOP/s (same run). Checks: the entry and "
                 f"`full` against float64. Command: `{payload['command']}`.")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.validation.bench_indexer_breakdown",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="directory for bench_indexer_breakdown.json")
    parser.add_argument("--render", metavar="JSON", help="print the table of an existing result")
    parser.add_argument("--update-doc", metavar="MD",
                        help="with --render: fill the page's <!-- generated:prefill_breakdown --> block")
    parser.add_argument("--profile-call", action="store_true",
                        help=f"two entry calls at {PROFILE_SHAPE} (for ncu), then exit")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as fh:
            table = render(json.load(fh))
        if args.update_doc:
            from dsv4kit.validation import bench_indexer

            bench_indexer.fill_generated(args.update_doc, {"prefill_breakdown": table})
        print(table)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_indexer_breakdown: needs a CUDA GPU", file=sys.stderr)
        return 5
    from dsv4kit.kernels import indexer
    from dsv4kit.validation import bench_indexer, bench_indexer_prefill as prefill, timing

    if args.profile_call:
        shape = {s["name"]: s for s in prefill.shapes()}[PROFILE_SHAPE]
        inputs = prefill._inputs(torch, shape, seed=0)
        for _ in range(2):
            indexer.fp8_paged_mqa_logits_for_sglang(*inputs.args())
            torch.cuda.synchronize()
        return 0
    started = time.time()
    rates = timing.matmul_rates(torch)
    points = []
    for shape in _shapes():
        points.append(bench_shape(torch, shape, rates))
        p = points[-1]
        print(f"{p['name']}: " + ", ".join(f"{n}={v:.2f}" for n, v in p["vs_floor"].items()),
              file=sys.stderr, flush=True)
    payload = {"schema": SCHEMA, "kind": KIND,
               "command": "python -m dsv4kit.validation.bench_indexer_breakdown "
                          + " ".join(argv if argv is not None else sys.argv[1:]),
               "environment": bench_indexer.environment(torch, "cuda"), "host": platform.node(),
               "rates": rates, "variants": {n: c for n, c in VARIANTS.items()},
               "timing": timing.__doc__.split("\n\n")[1].strip(), "points": points,
               "seconds": round(time.time() - started, 1)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_indexer_breakdown.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1)
    os.replace(path + ".tmp", path)
    print(render(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
