"""Where the row-tile indexer's time above the FP8 floor goes: the kernel with parts taken out.

``python -m dsv4kit.validation.bench_indexer_breakdown [--out DIR]``; ``--render JSON`` prints the
table of a result (``--update-doc MD`` fills the page's ``prefill_breakdown`` block);
``--profile-call`` runs two calls of the entry at one 4K-row chunk over a 124K prefix and
exits, for ``ncu -k regex:_shared_rows_kernel --launch-skip 1 --launch-count 1``.

A measuring instrument, not a product path. ``_variant_kernel`` is the shared-page loop of
``dsv4kit.kernels.indexer_tiles`` (tile decision, pipelined key loads, one fp8 product of
``[64 x 128] @ [128 x ROWS*H]`` a page) with its epilogue cut at one of four places, or done
another way:

* ``full``: as the product (ReLU, weights, head sum, key scales, the length mask, the store);
* ``no relu/weights``: the head sum of the raw products, then scales, mask and store;
* ``no mask/store``: the full maths, summed in registers, one store per program at the end;
* ``product only``: the products accumulated into one register tile, one store at the end;
* ``fp16 head sum``: the weighted head sum as a second tensor-core product, as FlashAttention
  multiplies P by V: the ReLU'd products, times ``2^-10`` and cast to fp16, are the register
  operand of ``[64 x ROWS*H] @ [ROWS*H x 16]`` against a block-diagonal weight matrix built once
  a tile (column ``r`` holds row ``r``'s head weights, scaled by a power of two into fp16's
  range; 16 is ``tl.dot``'s least N, so columns ``>= ROWS`` are zero); the powers of two and the
  key scales are applied to the ``[64 x 16]`` result;
* ``full, ws``: ``full`` with the page loop as ``tl.range(..., warp_specialize=True)``;
  ``full, 8 warps`` and ``full, 8 warps, ws``: the same two at 8 warps.

Rows: the entry as the SGLang plugin calls it (``dsv4kit``) and the variants, at the prefill
shapes of ``bench_indexer_prefill`` (one request), on the same inputs and with the same timing
(``dsv4kit.validation.timing``), each over the same FP8 floor. The rows that compute the real
result (the entry, ``full``, ``fp16 head sum``) are checked against the float64 reference like
the entry; a variant that does not build is recorded under ``failed``.
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
# name -> (CUT, num_warps, warp_specialize)
VARIANTS = {"full": (0, 4, False), "no relu/weights": (1, 4, False), "no mask/store": (2, 4, False),
            "product only": (3, 4, False), "fp16 head sum": (4, 4, False),
            "full, ws": (0, 4, True), "full, 8 warps": (0, 8, False),
            "full, 8 warps, ws": (0, 8, True)}
CHECKED = ("dsv4kit", "full", "fp16 head sum")  # the rows that compute the real result
SHAPES = ("R=1024 prefix=32K", "R=1024 prefix=124K", "R=4096 prefix=32K", "R=4096 prefix=124K",
          "R=8192 prefix=32K", "R=8192 prefix=124K", "R=4096 prefix=0K", "R=8192 prefix=0K")
PROFILE_SHAPE = "R=4096 prefix=124K"


P_SCALE = tl.constexpr(2.0 ** -10)  # ReLU'd products times this fit fp16 (see CUT == 4)


@triton.jit
def _variant_page(kv_fp8, kv_f32, pt_rows, n_pages, num_pages, p, progs, ids_next, q, w, wmat,
                  w_unscale, seq_len, store_end, out_rows, seq_c, end_c, out_c, acc, acc_rows,
                  ROWS: tl.constexpr, H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                  PAGE_BYTES: tl.constexpr, SCALE_OFFSET: tl.constexpr, CUT: tl.constexpr):
    """One page of the shared-page loop with the epilogue of ``CUT``."""
    offs_t = tl.arange(0, PAGE)
    lead = tl.max(ids_next, axis=0)
    ids_next = tl.load(pt_rows + (p + progs), mask=(p + progs) < n_pages, other=-1)
    ok = (lead >= 0) & (lead < num_pages)
    k, s_k = load_key_page(kv_fp8, kv_f32, lead, ok, PAGE, D, PAGE_BYTES, SCALE_OFFSET)
    t = p * PAGE + offs_t
    if CUT == 3:
        acc = tl.dot(k, tl.trans(q), acc)
    elif CUT == 4:
        # ReLU'd products as an fp16 register operand times the block-diagonal weights. |q.k| <=
        # 448^2 * 128 < 2^25, so P * 2^-10 fits fp16; the weights were scaled into its range.
        p16 = (tl.maximum(tl.dot(k, tl.trans(q)), 0.0) * P_SCALE).to(tl.float16)
        logit = tl.dot(p16, wmat) * (w_unscale * s_k)[:, None]  # [PAGE, NC]; columns >= ROWS: 0
        logit = tl.where(t[:, None] < tl.where(ok, seq_c, 0)[None, :], logit, float("-inf"))
        tl.store(out_c[None, :] + t[:, None], logit, mask=t[:, None] < end_c[None, :])
    else:
        scores = tl.dot(k, tl.trans(q))
        if CUT != 1:
            scores = tl.maximum(scores, 0.0) * w[None, :]
        logit = tl.trans(tl.sum(tl.reshape(scores, (PAGE, ROWS, H)), axis=2))
        logit = logit * s_k[None, :]
        if CUT == 2:
            acc_rows += logit
        else:
            logit = tl.where(t[None, :] < tl.where(ok, seq_len, 0)[:, None], logit,
                             float("-inf"))
            tl.store(out_rows[:, None] + t[None, :], logit, mask=t[None, :] < store_end[:, None])
    return ids_next, acc, acc_rows


@triton.jit
def _variant_kernel(q_ptr, kv_ptr, w_ptr, seq_lens_ptr, page_table_ptr, out_ptr, seq_lens_stride,
                    pt_stride, num_pages, max_seq_len, batch, progs, ROWS: tl.constexpr,
                    H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    PAGE_BYTES: tl.constexpr, SCALE_OFFSET: tl.constexpr, CUT: tl.constexpr,
                    WARP_SPECIALIZE: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    offs_t = tl.arange(0, PAGE)
    offs_d = tl.arange(0, D)
    seq_len, n_pages, pt_rows, out_rows, store_end = row_scalars(
        seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr,
        tile * ROWS + tl.arange(0, ROWS), batch, max_seq_len, PAGE)
    # The fp16 head-sum product's N side: 16 columns (tl.dot's least), column r < ROWS is row r.
    NC: tl.constexpr = 16
    offs_c = tl.arange(0, NC)
    seq_c, _, _, out_c, end_c = row_scalars(seq_lens_ptr, seq_lens_stride, page_table_ptr,
                                            pt_stride, out_ptr, tile * ROWS + offs_c, batch,
                                            max_seq_len, PAGE)
    seq_c = tl.where(offs_c < ROWS, seq_c, 0)
    end_c = tl.where(offs_c < ROWS, end_c, 0)
    kv_fp8 = kv_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    kv_f32 = kv_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
    n_max = tl.max(n_pages, axis=0)
    if tile_shares_pages(pt_rows, n_pages, n_max, 0, 1, 64):
        offs_m = tl.arange(0, ROWS * H)
        m_live = (tile * ROWS + offs_m // H) < batch
        q = tl.load(q_ptr + (tile * (ROWS * H) + offs_m)[:, None] * D + offs_d[None, :],
                    mask=m_live[:, None], other=0.0)
        w = tl.load(w_ptr + tile * (ROWS * H) + offs_m, mask=m_live, other=0.0)
        # Block-diagonal weights [ROWS*H, NC] scaled by 2^(13-e), e = floor(log2 max|w|), so the
        # largest lies in [2^13, 2^15); w_unscale undoes that and P_SCALE.
        w_max = tl.max(tl.abs(w), axis=0)
        e = tl.where(w_max > 0, tl.floor(tl.log2(tl.where(w_max > 0, w_max, 1.0))), 0.0)
        w_unscale = tl.exp2(e - 13.0) / P_SCALE
        wmat = tl.where((offs_m // H)[:, None] == offs_c[None, :],
                        (w * tl.exp2(13.0 - e))[:, None], 0.0).to(tl.float16)
        acc = tl.zeros((PAGE, ROWS * H), tl.float32)
        acc_rows = tl.zeros((ROWS, PAGE), tl.float32)
        ids_next = tl.load(pt_rows + j, mask=j < n_pages, other=-1)
        if WARP_SPECIALIZE:
            for p in tl.range(j, n_max, progs, warp_specialize=True):
                ids_next, acc, acc_rows = _variant_page(
                    kv_fp8, kv_f32, pt_rows, n_pages, num_pages, p, progs, ids_next, q, w, wmat,
                    w_unscale, seq_len, store_end, out_rows, seq_c, end_c, out_c, acc, acc_rows,
                    ROWS, H, D, PAGE, PAGE_BYTES, SCALE_OFFSET, CUT)
        else:
            for p in range(j, n_max, progs):
                ids_next, acc, acc_rows = _variant_page(
                    kv_fp8, kv_f32, pt_rows, n_pages, num_pages, p, progs, ids_next, q, w, wmat,
                    w_unscale, seq_len, store_end, out_rows, seq_c, end_c, out_c, acc, acc_rows,
                    ROWS, H, D, PAGE, PAGE_BYTES, SCALE_OFFSET, CUT)
        # One store per program keeps the cut work live (the values are not logits).
        if CUT == 3:
            tl.store(out_ptr + tile * PAGE + offs_t, tl.sum(acc, axis=1))
        if CUT == 2:
            tl.store(out_ptr + tile * PAGE + offs_t, tl.sum(acc_rows, axis=0))


def launch_variant(torch, inputs, variant: tuple):
    """One call of the variant on ``inputs`` (``IndexerInputs``) with the entry's grid."""
    from dsv4kit.kernels import indexer, indexer_tiles

    cut, warps, warp_specialize = variant
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
        WARP_SPECIALIZE=warp_specialize, num_warps=warps, num_stages=indexer_tiles.NUM_STAGES)
    return out


def _shapes() -> list[dict]:
    from dsv4kit.validation import bench_indexer_prefill as prefill

    by_name = {s["name"]: s for s in prefill.shapes()}
    return [by_name[n] for n in SHAPES]


def bench_shape(torch, shape: dict, rates: dict, failed_before: dict) -> dict:
    """One shape's times and checks; a variant in ``failed_before`` (name -> why) is not tried
    again, and one that fails here is added to it."""
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
    runs += [(name, lambda c, v=v: launch_variant(torch, c, v)) for name, v in VARIANTS.items()]
    result["checks"], result["times_us"], result["failed"] = {}, {}, {}
    for name, fn in runs:
        if name in failed_before:
            result["failed"][name] = failed_before[name]
            continue
        try:
            if name in CHECKED:
                result["checks"][name] = prefill._check(torch, fn(first), first, "page")
            result["times_us"][name] = timing.graph_time_us(
                torch, [lambda c=c, fn=fn: fn(c) for c in copies], warmup_s=prefill.WARMUP_S)
        except Exception as exc:  # noqa: BLE001 - a variant that does not build is a result
            result["failed"][name] = failed_before[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    result["vs_floor"] = {n: t / result["floor_us"] for n, t in result["times_us"].items()}
    del copies, first
    torch.cuda.empty_cache()
    return result


def _cell(p: dict, name: str) -> str:
    if name not in p["times_us"]:
        return "failed"
    return f"{p['times_us'][name]:.1f} / {p['vs_floor'][name]:.2f}"


def render(payload: dict) -> str:
    names = ["dsv4kit"] + list(payload["variants"])
    checked = [n for n in CHECKED if n in names]
    lines = ["| shape | FP8 floor (us) | " + " | ".join(f"{n} (us / floor)" for n in names)
             + " | checks |", "|---|---|" + "---|" * len(names) + "---|"]
    for p in payload["points"]:
        ok = all(n in p["checks"] and p["checks"][n]["pattern_ok"] and p["checks"][n]["rel"] < 5e-3
                 for n in checked)
        lines.append(f"| {p['name']} | {p['floor_us']:.1f} | "
                     + " | ".join(_cell(p, n) for n in names) + f" | {'ok' if ok else 'FAIL'} |")
    worst = {n: max((p["checks"][n]["rel"] for p in payload["points"] if n in p["checks"]),
                    default=None) for n in checked}
    failed = sorted({f"`{n}`: {why}" for p in payload["points"]
                     for n, why in p.get("failed", {}).items()})
    r = payload["rates"]
    lines.append("")
    lines.append("Largest relative error against float64 over the shapes (checks pass below 5e-3): "
                 + ", ".join(f"`{n}` {'-' if v is None else f'{v:.1e}'}" for n, v in worst.items())
                 + ".")
    if failed:
        lines.append("Did not run: " + "; ".join(failed) + ".")
    lines.append(f"Device: {payload['environment'].get('gpu')}; FP8 `_scaled_mm` rate "
                 f"{r['fp8_flops_per_s'] / 1e12:.0f} TFLOP/s (same run). Command: "
                 f"`{payload['command']}`.")
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
    points, failed_before = [], {}
    for shape in _shapes():
        points.append(bench_shape(torch, shape, rates, failed_before))
        p = points[-1]
        print(f"{p['name']}: " + ", ".join(f"{n}={v:.2f}" for n, v in p["vs_floor"].items()),
              file=sys.stderr, flush=True)
    payload = {"schema": SCHEMA, "kind": KIND,
               "command": "python -m dsv4kit.validation.bench_indexer_breakdown "
                          + " ".join(argv if argv is not None else sys.argv[1:]),
               "environment": bench_indexer.environment(torch, "cuda"), "host": platform.node(),
               "rates": rates, "variants": {n: dict(zip(("cut", "num_warps", "warp_specialize"), v))
                            for n, v in VARIANTS.items()},
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
