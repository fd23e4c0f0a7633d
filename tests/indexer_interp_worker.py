"""Runs the indexer kernel through Triton's CPU interpreter and prints JSON results.

Run in a subprocess by tests/kernels/test_indexer_kernel.py: TRITON_INTERPRET must be set before the kernel
module is imported (Triton reads it at decoration time), which a shared pytest process cannot
guarantee.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from dsv4kit.kernels import indexer  # noqa: E402
from dsv4kit.kernels import indexer_reference as ref  # noqa: E402


def check(name, inputs, out=None, **extra):
    if out is None:
        out = indexer.fp8_paged_mqa_logits(*inputs.args())
    exact = ref.exact_logits_f64(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                                 inputs.page_table, inputs.max_seq_len)
    stats = ref.compare(out, exact, inputs.seq_lens)
    stats.update(name=name, shape=list(out.shape), dtype=str(out.dtype),
                 contiguous=out.is_contiguous(), **extra)
    return stats


def main():
    results = []
    # (B, P, max_len, H, options)
    shapes = [
        (1, 8, 512, 64, {}),
        (16, 8, 512, 64, {}),  # R < n_pages: each program loops over several pages
        (3, 1, 64, 64, {}),  # one page, lengths 0 and exactly 64
        (12, 5, 300, 64, {"seq_lens_2d": True}),
        (64, 2, 128, 64, {}),
        (4, 4, 256, 32, {}),
        (2, 3, 192, 16, {}),
        (8, 3, 192, 64, {"stale": "invalid"}),  # stale ids far outside the pool: never read
    ]
    for batch, pages, max_len, heads, opts in shapes:
        inputs = ref.make_indexer_inputs(batch, heads, pages, max_len, seed=batch * 31 + pages, **opts)
        results.append(check(f"{batch}x{pages}x{max_len}xh{heads}{'-' + '-'.join(opts) if opts else ''}",
                             inputs))

    # The same case with the other prefetch setting of the kernel.
    inputs = ref.make_indexer_inputs(16, 64, 8, 512, seed=5)
    checked = indexer.check_args(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                                 inputs.page_table, inputs.max_seq_len, False)
    batch, _, pages, num_pages, seq, kv, msl = checked
    for prefetch in (False, True):
        out = torch.empty(batch, msl)
        indexer.launch(inputs.q_fp8, kv, inputs.weight, seq, inputs.page_table, out, num_pages, msl,
                       2, prefetch=prefetch)
        results.append(check(f"prefetch={prefetch}", inputs, out))

    # Tail policies on a sentinel-filled buffer: "skip" leaves everything at or past L's page
    # end unwritten, "exact" writes -inf there; both -inf on [L, page end). The straight-line
    # one-page path (R >= pages) and the loop (R = 1) both.
    inputs = ref.make_indexer_inputs(6, 64, 5, 300, seed=21)
    assert inputs.seq_lens[1] == 0
    inputs.page_table[1, :] = -2 ** 31  # INT32_MIN past the length: sends its programs on
    batch, _, pages, num_pages, seq, kv, msl = indexer.check_args(
        inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens, inputs.page_table,
        inputs.max_seq_len, False)
    lengths = seq.long().clamp(0, msl)
    cols = torch.arange(msl)
    past_page = cols.unsqueeze(0) >= ((lengths + 63) // 64 * 64).unsqueeze(1)
    for tail in ("skip", "exact"):
        for progs in (1, pages):
            out = torch.full((batch, msl), 123.0)
            indexer.launch(inputs.q_fp8, kv, inputs.weight, seq, inputs.page_table, out, num_pages,
                           msl, progs, tail=tail)
            r = check(f"tail={tail} R={progs}", inputs, out)
            r["page_tail"] = ref.compare(out, ref.exact_logits_f64(
                inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens, inputs.page_table,
                msl), inputs.seq_lens, tail="page")["pattern_ok"]
            r["past_page_untouched"] = bool(torch.all(out[past_page] == 123.0))
            r["past_page_cells"] = int(past_page.sum())
            results.append(r)
    out = indexer.fp8_paged_mqa_logits_for_sglang(*inputs.args())
    results.append({"name": "plugin call", **ref.compare(out, ref.exact_logits_f64(
        inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens, inputs.page_table, msl),
        inputs.seq_lens, tail="page")})

    # Prefill style: max_seq_len < P*64 and not a multiple of 64.
    inputs = ref.make_indexer_inputs(5, 64, 4, 200, seed=9)
    inputs.max_seq_len = 200
    results.append(check("max_seq_len=200<P*64", inputs))

    # Lengths beyond max_seq_len are clamped to it (and negative ones to 0).
    inputs = ref.make_indexer_inputs(3, 64, 2, 128, seed=11, lengths=[128, 0, 128])
    inputs.seq_lens = torch.tensor([500, -3, 128], dtype=torch.int32)
    out = indexer.fp8_paged_mqa_logits(*inputs.args())
    clamped = ref.make_indexer_inputs(3, 64, 2, 128, seed=11, lengths=[128, 0, 128])
    clamped.seq_lens = torch.tensor([128, 0, 128], dtype=torch.int32)
    results.append(check("seq_lens clamped", clamped, out))

    # A corrupt page id inside [0, L): never dereferenced, its 64 positions score -inf.
    inputs = ref.make_indexer_inputs(2, 64, 3, 192, seed=13, lengths=[192, 192])
    inputs.page_table[0, 1] = 2 ** 31 - 1
    inputs.page_table[1, 2] = -5
    out = indexer.fp8_paged_mqa_logits(*inputs.args())
    corrupt_inf = bool(torch.all(out[0, 64:128] == float("-inf"))) and bool(
        torch.all(out[1, 128:192] == float("-inf")))
    intact = torch.isfinite(out[0, :64]).all() and torch.isfinite(out[0, 128:]).all() and \
        torch.isfinite(out[1, :128]).all()
    results.append({"name": "corrupt page ids", "corrupt_positions_inf": corrupt_inf,
                    "other_positions_finite": bool(intact)})

    # Empty batch: no launch, an empty [0, max_seq_len] result.
    inputs = ref.make_indexer_inputs(1, 64, 2, 128, seed=1)
    empty = indexer.fp8_paged_mqa_logits(inputs.q_fp8[:0], inputs.kvcache, inputs.weight[:0],
                                         inputs.seq_lens[:0], inputs.page_table[:0], None, 128)
    results.append({"name": "empty batch", "shape": list(empty.shape)})

    # The bf16 fallback against float64: about 1e-3 (docs/sglang-contract.md §2.5).
    inputs = ref.make_indexer_inputs(16, 64, 8, 512, seed=17)
    fallback = ref.fallback_logits(*inputs.args())
    results.append(check("fallback", inputs, fallback))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
