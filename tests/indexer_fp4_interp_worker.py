"""Runs the FP4-cache indexer kernel through Triton's CPU interpreter and prints JSON results.

Run in a subprocess by tests/kernels/test_indexer_fp4_kernel.py (TRITON_INTERPRET must be set
before the kernel module is imported). Small cases: the interpreter is slow.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from dsv4kit.kernels import indexer_fp4 as k4  # noqa: E402
from dsv4kit.kernels import indexer_fp4_reference as ref  # noqa: E402


def check(name, inputs, out=None, tail="exact", **extra):
    if out is None:
        out = k4.fp8_fp4_paged_mqa_logits(*inputs.args())
    stats = ref.compare(out, inputs.exact(), inputs.seq_lens, tail=tail)
    stats.update(name=name, shape=list(out.shape), dtype=str(out.dtype),
                 contiguous=out.is_contiguous(), nan_free=not bool(torch.isnan(out).any()),
                 **extra)
    return stats


def _launch(inputs, progs, tail, fill=None):
    q_fp4, q_sf, batch, _, _, num_pages, lens, kv, msl = k4.check_args(
        inputs.q, inputs.kv_cache, inputs.weights, inputs.seq_lens, inputs.page_table,
        inputs.max_seq_len, False, tail)
    out = torch.full((batch, msl), fill) if fill is not None else torch.empty(batch, msl)
    k4.launch(q_fp4, q_sf, kv, inputs.weights, lens, inputs.page_table, out, num_pages, msl,
              progs, tail=tail)
    return out


def main():
    results = []
    # (B, P, max_len, H, options): B not a multiple of any block size, shuffled (random
    # permutation) live pages, rows on page boundaries (edge_lengths: 0, 1, 63, 64, 65, N).
    shapes = [
        (7, 3, 192, 64, {}),
        (5, 2, 128, 32, {"seq_lens_2d": True}),
        (3, 1, 64, 16, {}),
        (6, 3, 192, 64, {"stale": "invalid"}),
        (5, 3, 192, 64, {"live_pages": "repeated"}),  # one page id behind many positions/rows
    ]
    for batch, pages, max_len, heads, opts in shapes:
        inputs = ref.make_fp4_inputs(batch, heads, pages, max_len, seed=batch * 7 + pages, **opts)
        label = f"{batch}x{pages}x{max_len}xh{heads}" + ("-" + "-".join(opts) if opts else "")
        results.append(check(label, inputs))

    # Tail policies on a sentinel buffer, the straight-line path (R = P) and the loop (R = 1).
    inputs = ref.make_fp4_inputs(6, 64, 5, 300, seed=21)
    lengths = inputs.seq_lens.long()
    cols = torch.arange(inputs.max_seq_len)
    past_page = cols.unsqueeze(0) >= ((lengths + 63) // 64 * 64).unsqueeze(1)
    for tail in ("skip", "exact"):
        for progs in (1, 5):
            out = _launch(inputs, progs, tail, fill=123.0)
            r = check(f"tail={tail} R={progs}", inputs, out)
            r["page_tail"] = ref.compare(out, inputs.exact(), inputs.seq_lens, tail="page")["pattern_ok"]
            r["past_page_untouched"] = bool(torch.all(out[past_page] == 123.0))
            r["past_page_cells"] = int(past_page.sum())
            results.append(r)
    results.append(check("plugin call", inputs,
                         k4.fp8_fp4_paged_mqa_logits_for_sglang(*inputs.args()), tail="page"))

    # ue8m0 extremes every path represents exactly: the writers' floor (112: max(amax, 1e-4)/6)
    # and 252 (the largest whose code-6 value fits bf16, the sm_90 upcast), paired so each block
    # product stays a normal fp32; and all-zero pages (codes 0, the floor exponent): finite
    # zeros, never NaN.
    inputs = ref.make_fp4_inputs(4, 64, 2, 128, seed=31, lengths=[128, 100, 64, 1])
    packed, exps = ref.split_pages(inputs.kv_cache)
    exps[:, :, 0] = 252
    exps[:, :, 1] = 112
    exps[:, :, 2] = 112
    q_exps = inputs.q_sf.view(torch.uint8).view(4, 1, 64, 4)
    q_exps[..., 0] = 112
    q_exps[..., 1] = 252
    q_exps[..., 2] = 112
    results.append(check("ue8m0 extremes", inputs))
    zero = ref.make_fp4_inputs(3, 64, 2, 128, seed=33, lengths=[128, 70, 5])
    packed, exps = ref.split_pages(zero.kv_cache)
    packed.zero_()
    exps.fill_(112)
    out = k4.fp8_fp4_paged_mqa_logits(*zero.args())
    r = check("all-zero pages", zero, out)
    r["zeros"] = bool(torch.all(out[0] == 0)) and bool(torch.all(out[1, :70] == 0))
    results.append(r)

    # Prefill style: max_context_len < P*64 and not a multiple of 64.
    inputs = ref.make_fp4_inputs(5, 64, 4, 200, seed=9)
    inputs.max_seq_len = 200
    results.append(check("max_seq_len=200<P*64", inputs))

    # A corrupt page id inside [0, L): never dereferenced, its 64 positions score -inf.
    inputs = ref.make_fp4_inputs(2, 64, 3, 192, seed=13, lengths=[192, 192])
    inputs.page_table[0, 1] = 2 ** 31 - 1
    inputs.page_table[1, 2] = -5
    out = k4.fp8_fp4_paged_mqa_logits(*inputs.args())
    corrupt_inf = bool(torch.all(out[0, 64:128] == float("-inf"))) and bool(
        torch.all(out[1, 128:192] == float("-inf")))
    intact = bool(torch.isfinite(out[0, :64]).all() and torch.isfinite(out[0, 128:]).all()
                  and torch.isfinite(out[1, :128]).all())
    results.append({"name": "corrupt page ids", "corrupt_positions_inf": corrupt_inf,
                    "other_positions_finite": intact})

    # Lengths past max_context_len clamp to it, negative ones to 0.
    inputs = ref.make_fp4_inputs(3, 64, 2, 128, seed=11, lengths=[128, 0, 128])
    out_in = ref.make_fp4_inputs(3, 64, 2, 128, seed=11, lengths=[128, 0, 128])
    out_in.seq_lens = torch.tensor([500, -3, 128], dtype=torch.int32)
    results.append(check("lengths clamped", inputs,
                         k4.fp8_fp4_paged_mqa_logits(*out_in.args())))

    empty = ref.make_fp4_inputs(1, 64, 2, 128, seed=1)
    out = k4.fp8_fp4_paged_mqa_logits((empty.q_fp4[:0], empty.q_sf[:0]), empty.kv_cache,
                                      empty.weights[:0], empty.seq_lens[:0], empty.page_table[:0],
                                      None, 128)
    results.append({"name": "empty batch", "shape": list(out.shape)})

    # The row-tile kernel (rows that share keys): a tile across two requests with a zero-length
    # row and a chunk starting mid-page, and verify-like 6-row requests sharing a prefix page;
    # both tails, the per-row split (R = 8) and the single-program loop.
    tile_cases = [("tiles: two requests, zero row", [(130, 30), (70, 11)], {"zero_rows": (4,)}),
                  ("tiles: verify 6 rows, shared prefix page", [(200 + 40 * i, 6) for i in range(3)],
                   {"shared_prefix_pages": 1})]
    for name, requests, opts in tile_cases:
        inputs = ref.make_fp4_prefill_inputs(requests, 16, seed=len(results), **opts)
        for tail, progs in (("exact", 2), ("skip", 8), ("skip", 1)):
            q_fp4, q_sf, batch, _, _, num_pages, lens, kv, msl = k4.check_args(
                inputs.q, inputs.kv_cache, inputs.weights, inputs.seq_lens, inputs.page_table,
                inputs.max_seq_len, False, tail)
            out = torch.full((batch, msl), 123.0)
            k4.launch_tiles(q_fp4, q_sf, kv, inputs.weights, lens, inputs.page_table, out,
                            num_pages, msl, progs, tail=tail)
            lengths = inputs.seq_lens.long()
            past = torch.arange(msl).unsqueeze(0) >= ((lengths + 63) // 64 * 64).unsqueeze(1)
            results.append(check(f"{name} ({tail}, R={progs})", inputs, out,
                                 tail="exact" if tail == "exact" else "page",
                                 past_page_untouched=bool(torch.all(out[past] == 123.0))))

    # The entry sends prefill-sized calls to the row-tile kernel (thresholds scaled down here).
    from dsv4kit.kernels import indexer as fp8_entry

    fp8_entry.SHARED_ROWS_MIN_BATCH, fp8_entry.SHARED_ROWS_MIN_LEN = 24, 96
    seen, real = [], k4.launch_tiles
    k4.launch_tiles = lambda *a, **k: (seen.append(k.get("tail")), real(*a, **k))
    inputs = ref.make_fp4_prefill_inputs([(360, 24)], 16, seed=5)
    out = k4.fp8_fp4_paged_mqa_logits_for_sglang(*inputs.args())
    results.append(check("tiles: entry at the row-tile batch", inputs, out, tail="page",
                         used_tiles=seen == ["skip"]))
    k4.launch_tiles = real
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
