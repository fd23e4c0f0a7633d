"""Runs the row-tile indexer kernel through Triton's CPU interpreter and prints JSON results.

Run in a subprocess by tests/kernels/test_indexer_tiles.py (TRITON_INTERPRET must be set before the
kernel modules are imported). fp8 ``tl.dot`` is exact in the interpreter (bf16 is not).
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from dsv4kit.kernels import indexer, indexer_tiles  # noqa: E402
from dsv4kit.kernels import indexer_reference as ref  # noqa: E402

# (name, requests as (prefix tokens, rows), options)
CASES = [
    ("two requests in one tile", [(130, 30), (70, 11)], {}),
    ("shared prefix page", [(100, 6), (300, 9)], {"shared_prefix_pages": 1}),
    ("chunk starts mid-page", [(250, 9)], {}),
    ("zero-length row inside a chunk", [(500, 13)], {"zero_rows": (6,)}),
    ("rows not a multiple of the tile", [(700, 7)], {}),
    ("32 heads", [(300, 10)], {"heads": 32}),
    ("verify: 6 rows a request", [(200 + 40 * i, 6) for i in range(4)], {}),
]


def launch(inputs, tail, progs):
    batch, _, _, num_pages, seq, kv, msl = indexer.check_args(
        inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens, inputs.page_table,
        inputs.max_seq_len, False, tail)
    out = torch.full((batch, msl), 123.0)  # a sentinel: unwritten cells stay 123
    indexer_tiles.launch(inputs.q_fp8, kv, inputs.weight, seq, inputs.page_table, out, num_pages,
                         msl, progs, tail, indexer.FILL_BLOCK)
    return out


def result(name, inputs, out, tail):
    exact = ref.exact_logits_f64(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                                 inputs.page_table, out.shape[1])
    stats = ref.compare(out, exact, inputs.seq_lens, tail="exact" if tail == "exact" else "page")
    lengths = inputs.seq_lens.reshape(-1).long()
    past = torch.arange(out.shape[1]).unsqueeze(0) >= ((lengths + 63) // 64 * 64).unsqueeze(1)
    stats.update(name=name, tail=tail, past_page_untouched=bool(torch.all(out[past] == 123.0)),
                 past_page_cells=int(past.sum()))
    return stats


def main():
    results = []
    for name, requests, opts in CASES:
        heads = opts.pop("heads", 64)
        inputs = ref.make_prefill_inputs(requests, heads, seed=len(results) + 7, **opts)
        for tail, progs in (("exact", 2), ("skip", 1), ("skip", 8)):
            results.append(result(name, inputs, launch(inputs, tail, progs), tail))

    # Corrupt ids inside [0, L) on a page the tile shares, and on one it does not: never read,
    # those positions score -inf, every other position is finite.
    inputs = ref.make_prefill_inputs([(600, 8)], seed=3)
    inputs.page_table[:, 1] = 2 ** 31 - 1  # shared by the whole tile
    inputs.page_table[5, 0] = -7  # one row differs: that tile goes per row
    out = launch(inputs, "skip", 1)
    lengths = inputs.seq_lens.tolist()
    bad = all(bool(torch.all(out[r, 64:min(128, n)] == float("-inf"))) for r, n in enumerate(lengths))
    bad = bad and bool(torch.all(out[5, :64] == float("-inf")))
    good = all(bool(torch.isfinite(out[r, :64]).all()) for r in range(8) if r != 5)
    good = good and all(bool(torch.isfinite(out[r, 128:n]).all()) for r, n in enumerate(lengths))
    results.append({"name": "corrupt page ids", "corrupt_inf": bad, "others_finite": good})

    # The entry sends calls of at least SHARED_ROWS_MIN_BATCH rows and SHARED_ROWS_MIN_LEN
    # positions to the row-tile kernel, others to the per-row one (thresholds scaled down here).
    indexer.SHARED_ROWS_MIN_BATCH, indexer.SHARED_ROWS_MIN_LEN = 24, 96
    seen = []
    real = indexer_tiles.launch
    indexer_tiles.launch = lambda *a, **k: (seen.append(a[-2]), real(*a, **k))
    inputs = ref.make_prefill_inputs([(360, 24)], seed=5)  # max_seq_len 96
    out = indexer.fp8_paged_mqa_logits_for_sglang(*inputs.args())
    stats = result("entry at the row-tile batch", inputs, out, "skip")
    stats["used_tiles"] = seen == ["skip"]
    results.append(stats)
    below = []
    for requests in ([(360, 23)], [(356, 24)]):  # one row short; max_seq_len 95
        seen.clear()
        indexer.fp8_paged_mqa_logits_for_sglang(*ref.make_prefill_inputs(requests, seed=5).args())
        below.append(seen == [])
    indexer_tiles.launch = real
    results.append({"name": "entry below the row-tile thresholds", "per_row": below})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
