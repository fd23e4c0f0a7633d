"""Validation suite for the FP4-cache indexer (``dsv4kit.kernels.indexer_fp4``); protocol in harness.py.

A case spec is ``BxPxN`` or ``BxPxNxH`` as in the FP8 suite (``indexer_suite.parse_case``). Every
case includes lengths 0, 1, 63/64/65, exact page multiples and N, shuffled page tables and random
stale entries past each length; odd-numbered cases pass ``context_lens`` as ``[B, 1]`` (what
SGLang passes on this route).

Rows per case: the kernel with the exact ``-inf`` tail vs float64 (``KERNEL_REL_BAR``, exact
pattern); the kernel as the SGLang plugin calls it ("dsv4kit-fp4": skip tail, the same bar); and,
where DeepGEMM's ``fp8_fp4_paged_mqa_logits`` runs (the box's sm_120 build), DeepGEMM against the
same reference (informational; its tail is unwritten). On CUDA: CUDA-graph replay and
determinism.
"""

from __future__ import annotations

import math
import time
import zlib
from typing import Iterator

from dsv4kit.validation.indexer_suite import IndexerCase, parse_case  # noqa: F401 - the protocol
from dsv4kit.validation.rows import CheckRow, RunOptions, skipped_row

NAME = "indexer_fp4"
KERNEL_REL_BAR = 5e-4
DETERMINISM_CALLS = 20
GRAPH_REPLAY_ROUNDS = 3

_GPU_CASES = ["1x8x512", "16x32x2048", "8x4x256", "64x64x4096", "3x1x64", "12x5x300",
              "128x33x2112", "64x513x32832", "2x4097x262208", "4x4x256x32"]
_CPU_CASES = ["1x8x512", "3x1x64", "12x5x300", "4x4x256x32"]


def default_cases(profile: str) -> list[str]:
    if profile not in ("gpu", "cpu"):
        raise ValueError(f"unknown profile {profile!r}; expected 'gpu' or 'cpu'")
    return list(_GPU_CASES if profile == "gpu" else _CPU_CASES)


def _row(impl: str, case: IndexerCase, stats: dict, bar, note: str = "", **extra) -> CheckRow:
    rel = stats["rel"]
    rel_ok = bar is None or (not math.isnan(rel) and rel <= bar)
    return CheckRow(suite=NAME, case=case.label, impl=impl,
                    passed=bool(rel_ok and stats["pattern_ok"]), max_abs=stats["max_abs"], rel=rel,
                    pattern_ok=stats["pattern_ok"], bar=bar, note=note,
                    extra={"spec": case.spec, "compared": stats["compared"], **extra})


def deep_gemm_fn():
    """DeepGEMM's ``fp8_fp4_paged_mqa_logits`` as SGLang calls it, or a reason it cannot run."""
    from dsv4kit.validation.implementations import _deep_gemm_fp4

    try:
        return _deep_gemm_fp4(), None
    except Exception as exc:  # noqa: BLE001 - absent, or its extension does not load here
        return None, f"deep_gemm does not import ({type(exc).__name__}: {str(exc)[:80]})"


def run(specs: list[str], options: RunOptions) -> Iterator[CheckRow]:
    import torch

    from dsv4kit.kernels import indexer_fp4
    from dsv4kit.kernels import indexer_fp4_reference as ref

    cases = [parse_case(s) for s in specs]
    dg, why = deep_gemm_fn() if options.device == "cuda" and options.compare_sglang \
        else (None, "needs CUDA and SGLang's implementations")
    if dg is None:
        yield skipped_row(NAME, "-", "deepgemm-fp4", f"{why}: its rows are skipped")
    progress = options.progress or (lambda _msg: None)
    for index, case in enumerate(cases):
        progress(f"{NAME}: {case.label}")
        two_d = index % 2 == 1
        inputs = ref.make_fp4_inputs(case.batch, case.heads, case.pages, case.max_len,
                                     seed=zlib.crc32(case.spec.encode()), device=options.device,
                                     seq_lens_2d=two_d)
        exact = inputs.exact()
        started = time.perf_counter()
        out = indexer_fp4.fp8_fp4_paged_mqa_logits(*inputs.args())
        if options.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        stats = ref.compare(out, exact, inputs.seq_lens)
        if tuple(out.shape) != (case.batch, inputs.max_seq_len) or out.dtype != torch.float32:
            stats["pattern_ok"] = False
        yield _row("fp4-kernel", case, stats, KERNEL_REL_BAR,
                   "context_lens [B,1]" if two_d else "", seconds=round(seconds, 4))
        skipped = indexer_fp4.fp8_fp4_paged_mqa_logits_for_sglang(*inputs.args())
        yield _row("dsv4kit-fp4", case, ref.compare(skipped, exact, inputs.seq_lens, tail="page"),
                   KERNEL_REL_BAR, "as the SGLang plugin calls it (tail not written)")
        if dg is not None:
            try:
                theirs = dg(*inputs.args())
                yield _row("deepgemm-fp4", case,
                           ref.compare(theirs, exact, inputs.seq_lens, tail="none"), None,
                           "DeepGEMM, installed")
            except Exception as exc:  # noqa: BLE001 - a stock failure is reported, not fatal
                yield skipped_row(NAME, case.label, "deepgemm-fp4",
                                  f"raised {type(exc).__name__}: {str(exc)[:80]}")
        del inputs, exact, out, skipped
    if options.device == "cuda" and cases:
        largest = max(cases, key=lambda c: (c.batch, c.pages))
        yield _graph_replay_row(largest, indexer_fp4.fp8_fp4_paged_mqa_logits, ref, progress)
        yield _determinism_row(largest, indexer_fp4.fp8_fp4_paged_mqa_logits, ref, progress)
    elif cases:
        for impl in ("graph-replay", "determinism"):
            yield skipped_row(NAME, "-", impl, "needs CUDA; skipped on the interpreter")


def _lengths(case: IndexerCase, seed: int) -> list[int]:
    import torch

    lengths = torch.randint(0, case.max_len + 1, (case.batch,),
                            generator=torch.Generator().manual_seed(seed)).tolist()
    lengths[seed % case.batch] = 0
    lengths[(seed + 1) % case.batch] = case.max_len
    return lengths


def _graph_replay_row(case: IndexerCase, fn, ref, progress) -> CheckRow:
    """Capture once; replay with new q, weights, lengths, page tables and cache bytes."""
    import torch

    progress(f"{NAME}: CUDA-graph replay on {case.label}")
    num_pages = case.batch * case.pages + 3

    def inputs(seed):
        return ref.make_fp4_inputs(case.batch, case.heads, case.pages, case.max_len,
                                   num_pages=num_pages, seed=seed, device="cuda",
                                   lengths=_lengths(case, seed))

    static = inputs(7)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*static.args())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*static.args())
    worst = {"max_abs": 0.0, "rel": 0.0, "pattern_ok": True, "compared": 0}
    for round_seed in range(GRAPH_REPLAY_ROUNDS + 1):
        fresh = static if round_seed == 0 else inputs(100 + round_seed)
        for name in ("q_fp4", "q_sf", "kv_cache", "weights", "seq_lens", "page_table"):
            getattr(static, name).copy_(getattr(fresh, name))
        graph.replay()
        torch.cuda.synchronize()
        stats = ref.compare(captured, fresh.exact(), fresh.seq_lens)
        worst = {"max_abs": max(worst["max_abs"], stats["max_abs"]),
                 "rel": max(worst["rel"], stats["rel"]),
                 "pattern_ok": worst["pattern_ok"] and stats["pattern_ok"],
                 "compared": worst["compared"] + stats["compared"]}
    del graph
    return _row("graph-replay", case, worst, KERNEL_REL_BAR,
                f"captured once, replayed with {GRAPH_REPLAY_ROUNDS} new lengths/page tables")


def _determinism_row(case: IndexerCase, fn, ref, progress) -> CheckRow:
    import torch

    progress(f"{NAME}: determinism ({DETERMINISM_CALLS} calls) on {case.label}")
    inputs = ref.make_fp4_inputs(case.batch, case.heads, case.pages, case.max_len,
                                 seed=zlib.crc32(case.spec.encode()), device="cuda")
    first = fn(*inputs.args())
    same = all(torch.equal(first, fn(*inputs.args())) for _ in range(DETERMINISM_CALLS - 1))
    return CheckRow(suite=NAME, case=case.label, impl="determinism", passed=same,
                    pattern_ok=same, bar=0.0,
                    note=f"{DETERMINISM_CALLS} calls bitwise identical" if same
                    else f"{DETERMINISM_CALLS} calls NOT bitwise identical",
                    extra={"spec": case.spec, "calls": DETERMINISM_CALLS})
