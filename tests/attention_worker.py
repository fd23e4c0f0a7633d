"""Subprocess worker for the attention tests: ``python -m tests.attention_worker interp|aot``.

TRITON_INTERPRET is read when a kernel is decorated, so interpreter runs and ahead-of-time builds
each get their own process. Prints one JSON object (check name -> result) on the last line.
"""

from __future__ import annotations

import json
import os
import sys


def _interp() -> dict:
    import torch

    from dsv4kit.kernels.sparse_mla_decode import DecodeConfig, default_config, flash_mla_with_kvcache_sm120
    from dsv4kit.kernels.sparse_mla_reference import as_sglang_views, compare, make_inputs, sparse_mla_reference

    results = {}

    def check(name, inputs, **overrides):
        ref, ref_lse = sparse_mla_reference(**inputs.kwargs)
        out, lse = flash_mla_with_kvcache_sm120(**inputs.kwargs, **overrides)
        stats = compare(out, ref, inputs.real_heads)
        H = inputs.real_heads
        empty = (ref[:, 0, :H] == 0).all(dim=-1)
        got = out[:, 0, :H].float()
        stats["empty_zero"] = bool(torch.where(empty.unsqueeze(-1), got, torch.zeros_like(got)).eq(0).all())
        stats["empty_rows"] = int(empty.all(dim=-1).sum())
        same_inf = torch.isneginf(lse[:, :H]) == torch.isneginf(ref_lse[:, :H])
        finite = torch.isfinite(ref_lse[:, :H])
        stats["lse_ok"] = bool(same_inf.all()) and bool(
            ((lse[:, :H] - ref_lse[:, :H]).abs()[finite] <= 1e-3 * (1 + ref_lse[:, :H].abs()[finite])).all())
        stats["shape"] = [list(out.shape), str(out.dtype), list(lse.shape)]
        results[name] = stats

    base = dict(holes=True, empty_rows=1)
    swa = make_inputs(T=3, heads=16, padded_heads=32, swa_page_size=256, seq_lens=[300, 40, 5], **base)
    check("swa_ps256_split", swa)
    check("swa_ps256_nosplit", swa, num_splits=1)
    c4 = make_inputs(T=3, heads=16, padded_heads=16, swa_page_size=64, extra="c4", extra_width=64,
                     seq_lens=[400, 150, 2], seed=1, **base)
    check("c4_ps64_split", c4, num_splits=3)
    check("c4_ps64_nosplit", c4, num_splits=1)
    # The sm_90 tiles (64 heads a program: 48 of them masked here) and a larger pipelined tile.
    check("c4_sm90_tiles", c4, config=DecodeConfig(64, 16, 8, 3), num_splits=2)
    check("c4_bn32_tiles", c4, config=DecodeConfig(32, 32, 8, 1))
    check("c4_no_prefetch", c4, config=DecodeConfig(16, 16, 4, 2, False), num_splits=2)
    check("c4_wide_prefetch", c4, config=DecodeConfig(32, 16, 4, 1, True, True), num_splits=2)
    check("c4_wide", c4, config=DecodeConfig(16, 32, 4, 2, 0, True))
    check("c4_wide_idx_ahead", c4, config=DecodeConfig(16, 16, 4, 2, 2, True), num_splits=2)
    h64 = make_inputs(T=2, heads=64, padded_heads=64, swa_page_size=256, extra="c4", extra_width=64,
                      seq_lens=[400, 90], seed=5, holes=True)
    check("c4_H64_default_tiles", h64)  # the interpreter gets sm_120's tiles
    check("c4_H64_sm90_default", h64, config=default_config(64, (9, 0)))  # wide, 64 x 64, indices ahead
    # One token (the C=1 latency case): the small-call tiles, and many one-step splits merged by
    # the combine (every split slot up to SPLITS_P2 = 16 is looked at; only the active ones count).
    t1 = make_inputs(T=1, heads=64, padded_heads=64, swa_page_size=256, extra="c4", extra_width=256,
                     seq_lens=[900], seed=7, holes=True)
    check("c4_T1_small_call_tiles", t1)
    check("c4_T1_small_call_tiles_9_splits", t1, num_splits=9)
    c128 = make_inputs(T=2, heads=24, padded_heads=24, swa_page_size=64, extra="c128", extra_width=128,
                       seq_lens=[9000, 100], seed=2, holes=True)
    check("c128_ps2_H24", c128)
    check("c128_ps2_H24_fp16dot", c128, dot_dtype="fp16")

    # Sink: large sinks dominate the denominator, negative ones vanish; both against the reference.
    sink = make_inputs(T=2, heads=16, padded_heads=16, seq_lens=[128, 64], seed=3)
    sink.kwargs["attn_sink"] = torch.tensor([30.0, -30.0] * 8)
    check("sink_extremes", sink)
    sink.kwargs["attn_sink"] = None
    check("no_sink", sink)

    # Bad slot ids (>= num_pages * page_size), lengths past the width or negative, strided indices.
    odd = make_inputs(T=3, heads=16, padded_heads=16, extra="c4", extra_width=64, seq_lens=[500, 200, 30],
                      seed=4)
    kw = odd.kwargs
    kw["indices"][0, 0, 3] = 1 << 30
    kw["extra_indices_in_kvcache"][1, 0, 0] = kw["extra_k_cache"].shape[0] * 64
    kw["topk_length"][2] = 100000
    kw["extra_topk_length"][2] = -5
    wide = torch.full((3, 1, 2 * kw["indices"].shape[2]), -7, dtype=torch.int32)
    wide[:, :, ::2] = kw["indices"]
    kw["indices"] = wide[:, :, ::2]
    check("bad_slots_lengths_strided_indices", odd)

    # SGLang may pass fp8 views of the caches (get_key_buffer) and lengths / sinks that are
    # strided or broadcast views; the kernel and the reference must read the same bytes.
    views = make_inputs(T=3, heads=16, padded_heads=16, extra="c4", extra_width=64, seq_lens=[500, 200, 30],
                        seed=6, holes=True)
    views.kwargs = as_sglang_views(views.kwargs)
    views.kwargs["extra_topk_length"] = torch.tensor([40], dtype=torch.int32).expand(3)  # broadcast
    check("fp8_views_strided_lengths_and_sink", views)
    return results


def _aot() -> dict:
    from dsv4kit.kernels.sparse_mla_aot import compile_combine, compile_decode, summary
    from dsv4kit.kernels.sparse_mla_decode import default_config

    results = {}
    cfg64 = default_config(64, (12, 0))
    cfg16 = default_config(16, (12, 0))
    results["sm120_c4_split_H64"] = summary(compile_decode(120, cfg64, page_size=256, extra_page_size=64,
                                                           split=True))
    results["sm120_c128_nosplit_H16"] = summary(compile_decode(120, cfg16, page_size=64, extra_page_size=2,
                                                               split=False))
    # The small-call tiles (T <= SMALL_CALL_TOKENS) on both targets, as launched (split, PDL).
    small = default_config(64, (12, 0), tokens=1)
    results["sm120_c4_small_call_H64"] = summary(compile_decode(120, small, page_size=256, extra_page_size=64,
                                                                split=True))
    results["sm90_c4_small_call_H64"] = summary(compile_decode(90, default_config(64, (9, 0), tokens=1),
                                                               page_size=256, extra_page_size=64, split=True))
    results["sm90_c4_split_H64"] = summary(compile_decode(90, default_config(64, (9, 0)), page_size=256,
                                                          extra_page_size=64, split=True))
    results["sm90_c4_nosplit_H32"] = summary(compile_decode(90, default_config(32, (9, 0)), page_size=64,
                                                            extra_page_size=64, split=False))
    from dsv4kit.validation.bench_attention import sm120_variants

    for name, cfg, _ in sm120_variants():  # what `bench_attention --sweep --mma-sync` times
        if cfg != cfg64:
            results[f"sm120_sweep_{name}"] = summary(compile_decode(120, cfg, page_size=256, extra_page_size=64,
                                                                    split=True))
    combine = compile_combine(120)
    results["sm120_combine"] = {"shared_bytes": combine.metadata.shared, "ptx": bool(combine.asm["ptx"])}
    widest = compile_combine(120, splits_p2=32, block_d=16)  # MAX_SPLITS slots, unrolled
    results["sm120_combine_32_splits"] = {"shared_bytes": widest.metadata.shared, "ptx": bool(widest.asm["ptx"])}
    return results


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "interp":
        os.environ["TRITON_INTERPRET"] = "1"
        payload = _interp()
    elif mode == "aot":
        os.environ.pop("TRITON_INTERPRET", None)
        payload = _aot()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(payload, default=str))
