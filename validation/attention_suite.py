"""Validation suite for the sparse-MLA decode kernel (``dsv4kit.kernels.sparse_mla_decode``).

Protocol in harness.py. A case spec is dash-separated::

    KIND-T<tokens>-H<heads>[of<padded>][-ps<swa page size>][-x<extra width>][-L<max seq_len>]
        [-holes][-empty][-views][-seed<n>]

``KIND`` is ``swa`` (SWA only), ``c4`` (SWA 128 + top-512 of 64-slot pages) or ``c128`` (SWA 128 +
``x`` ascending slots of 2-slot pages, default 8256 = 1M context). ``H16of64`` means 16 real heads
padded to 64 with NaN in the padded heads of q (their outputs are not compared, but no NaN may
reach a real head). ``L`` bounds the per-row ``seq_len`` (row 0 gets exactly L, the others random
below it), which sets ``topk_length = min(L, 128)`` and the extra lengths (``L//4`` capped at the
width for c4, ``L//128`` for c128; both clamped to >= 1). ``holes`` punches -1 holes inside the
lengths, ``empty`` makes the last row's only index -1 in every scope, ``views`` passes the caches
as fp8 views and the lengths and the sink as strided views (as SGLang may). ``T > 64`` exercises
the documented delegation to the float32 reference.

Rows per case: the kernel vs the float32 reference (bar ``KERNEL_REL_BAR``; ``pattern_ok`` = no NaN
in a real head and exact zeros for rows with no valid entry), the SIMT baseline vs the reference
(informational), each SGLang 0.5.23 implementation that loads here (FlashMLA, FlashInfer, its
Triton sm_120 kernel, its torch path: ``dsv4kit.validation.implementations``; informational). On CUDA: a
CUDA-graph capture + replay with new q, indices and lengths, and a determinism check.
"""

from __future__ import annotations

import math
import re
import time
import zlib
from dataclasses import dataclass
from typing import Iterator, Optional

from dsv4kit.validation.rows import CheckRow, RunOptions, skipped_row

NAME = "attention"
KERNEL_REL_BAR = 1e-2
GRAPH_REPLAY_ROUNDS = 3
DETERMINISM_CALLS = 10
_EXTRA_WIDTH = {"swa": 0, "c4": 512, "c128": 8256}

_GPU_CASES = [
    "swa-T8-H64-ps256-holes",
    "swa-T8-H16of64-ps64-holes-empty",
    "swa-T4-H32of64-ps256-L60",
    "c4-T16-H64-ps256-holes-empty",
    "c4-T64-H64-ps64-L4096-views",
    "c4-T3-H16of64-ps256-L300",
    "c4-T5-H24-ps64-L1500-holes",
    "c128-T8-H64-ps256-L131072",
    "c128-T16-H32of64-ps64-L4096-holes-empty",
    "c128-T1-H64-ps256-L1048576",
    "c128-T64-H64-ps64-L131072",
    "c4-T80-H64-ps256-L2048",
]
# Speculative verify steps (docs/sglang-contract.md, "Speculative shapes"): T = requests x (draft
# tokens + 1) rows, each a token with its own SWA window and top-k. 16 requests x 4 (DSPARK gamma 3)
# is the last T the kernel serves; 64 x 4 goes past SGLang's 64-token decode limit with the real
# heads only (16 at attention TP 4); 8 x 4 on a c128 layer at TP 4 (heads padded to 64); 10 x 6
# (gamma 5, the 0731 checkpoint's block) with the real heads at TP 4.
_VERIFY_GPU_CASES = [
    "c4-T64-H64-ps256-L131072-holes",
    "c4-T60-H16-ps256-L131072",
    "c4-T256-H16-ps256-L131072",
    "c128-T32-H16of64-ps256-L131072",
]
_CPU_CASES = [
    "swa-T2-H16of32-ps256-holes-empty",
    "c4-T3-H16-ps64-x64-L300-holes-empty-views",
    "c128-T2-H24-ps64-x128-L9000-holes",
]


@dataclass(frozen=True)
class AttentionCase:
    spec: str
    kind: str
    T: int
    heads: int
    padded_heads: int
    swa_page_size: int = 256
    extra_width: int = 0
    max_len: Optional[int] = None
    holes: bool = False
    empty: bool = False
    views: bool = False
    seed: int = 0

    @property
    def label(self) -> str:
        text = f"{self.kind} T={self.T} H={self.heads}"
        if self.padded_heads != self.heads:
            text += f"/{self.padded_heads}"
        text += f" ps={self.swa_page_size}"
        if self.kind != "swa":
            text += f" x={self.extra_width}"
        if self.max_len is not None:
            text += f" L<={self.max_len}"
        flags = (("holes", self.holes), ("empty", self.empty), ("views", self.views))
        return text + "".join(f" {f}" for f, on in flags if on)

    def inputs(self, device: str, seed_offset: int = 0):
        from dsv4kit.kernels.sparse_mla_reference import as_sglang_views, make_inputs
        import torch

        seed = self.seed or zlib.crc32(self.spec.encode())
        seq_lens = None
        if self.max_len is not None:
            gen = torch.Generator().manual_seed(seed + seed_offset)
            seq_lens = torch.randint(1, self.max_len + 1, (self.T,), generator=gen).tolist()
            seq_lens[0] = self.max_len
        inputs = make_inputs(T=self.T, heads=self.heads, padded_heads=self.padded_heads,
                             swa_page_size=self.swa_page_size,
                             extra=None if self.kind == "swa" else self.kind,
                             extra_width=self.extra_width, seq_lens=seq_lens, holes=self.holes,
                             empty_rows=1 if self.empty else 0, seed=seed + seed_offset, device=device)
        if self.views:
            inputs.kwargs = as_sglang_views(inputs.kwargs)
        return inputs


def default_cases(profile: str) -> list[str]:
    if profile not in ("gpu", "cpu"):
        raise ValueError(f"unknown profile {profile!r}; expected 'gpu' or 'cpu'")
    return list(_GPU_CASES + _VERIFY_GPU_CASES if profile == "gpu" else _CPU_CASES)


def parse_case(spec: str) -> AttentionCase:
    tokens = spec.strip().lower().split("-")
    kind = tokens[0]
    if kind not in _EXTRA_WIDTH:
        raise ValueError(f"attention case {spec!r}: kind must be swa, c4 or c128, got {kind!r}")
    fields: dict = {"kind": kind, "extra_width": _EXTRA_WIDTH[kind]}
    for tok in tokens[1:]:
        if m := re.fullmatch(r"t(\d+)", tok):
            fields["T"] = int(m.group(1))
        elif m := re.fullmatch(r"h(\d+)(?:of(\d+))?", tok):
            fields["heads"] = int(m.group(1))
            fields["padded_heads"] = int(m.group(2) or m.group(1))
        elif m := re.fullmatch(r"ps(\d+)", tok):
            fields["swa_page_size"] = int(m.group(1))
        elif m := re.fullmatch(r"x(\d+)", tok):
            fields["extra_width"] = int(m.group(1))
        elif m := re.fullmatch(r"l(\d+)", tok):
            fields["max_len"] = int(m.group(1))
        elif m := re.fullmatch(r"seed(\d+)", tok):
            fields["seed"] = int(m.group(1))
        elif tok in ("holes", "empty", "views"):
            fields[tok] = True
        else:
            raise ValueError(f"attention case {spec!r}: unknown part {tok!r} (expected T<n>, H<n>[of<n>], "
                             "ps<n>, x<n>, L<n>, holes, empty, views, seed<n>)")
    for required in ("T", "heads"):
        if required not in fields:
            raise ValueError(f"attention case {spec!r}: missing {'T<n>' if required == 'T' else 'H<n>'}")
    if fields["T"] < 1:
        raise ValueError(f"attention case {spec!r}: T must be >= 1")
    if not 1 <= fields["heads"] <= fields["padded_heads"] <= 64:
        raise ValueError(f"attention case {spec!r}: need 1 <= H <= padded H <= 64")
    if fields.get("swa_page_size", 256) not in (64, 256):
        raise ValueError(f"attention case {spec!r}: the SWA page size must be 256 or 64")
    if kind != "swa" and fields["extra_width"] < 1:
        raise ValueError(f"attention case {spec!r}: the extra width must be >= 1")
    if kind == "swa" and "extra_width" in fields and fields["extra_width"]:
        raise ValueError(f"attention case {spec!r}: x<n> needs a c4 or c128 kind")
    if fields.get("max_len") is not None and fields["max_len"] < 1:
        raise ValueError(f"attention case {spec!r}: L must be >= 1")
    return AttentionCase(spec=spec, **fields)


def _row(impl: str, case: AttentionCase, stats: dict, bar, note: str = "", **extra) -> CheckRow:
    rel = stats["rel"]
    rel_ok = bar is None or (not math.isnan(rel) and rel <= bar)
    pattern_ok = stats["nan_free"] and stats.get("empty_ok", True)
    return CheckRow(suite=NAME, case=case.label, impl=impl, passed=bool(rel_ok and pattern_ok),
                    max_abs=stats["max_abs"], rel=rel, pattern_ok=pattern_ok, bar=bar, note=note,
                    extra={"spec": case.spec, **extra})


def _stats(out, ref_out, inputs) -> dict:
    import torch

    from dsv4kit.kernels.sparse_mla_reference import compare

    stats = compare(out, ref_out, inputs.real_heads)
    # Rows with no valid entry must be exactly 0 (the reference is 0 there by construction).
    empty_rows = (ref_out[:, 0, : inputs.real_heads] == 0).all(dim=-1)
    got = out[:, 0, : inputs.real_heads].float()
    stats["empty_ok"] = bool(torch.where(empty_rows.unsqueeze(-1), got, torch.zeros_like(got)).eq(0).all())
    return stats


def run(specs: list[str], options: RunOptions) -> Iterator[CheckRow]:
    import torch

    # Imported here, after the harness has decided TRITON_INTERPRET.
    from dsv4kit.kernels.sparse_mla_decode import SM120_DECODE_MAX_TOKENS, flash_mla_with_kvcache_sm120
    from dsv4kit.kernels.sparse_mla_reference import sparse_mla_reference
    from dsv4kit.kernels.sparse_mla_simt import simt_sparse_mla_decode

    cases = [parse_case(s) for s in specs]
    progress = options.progress or (lambda _msg: None)
    stock, missing = _stock_implementations(options)
    for name, why in missing.items():
        yield skipped_row(NAME, "-", name, f"{why}: its rows are skipped")

    for case in cases:
        progress(f"attention: {case.label}")
        inputs = case.inputs(options.device)
        ref_out, _ = sparse_mla_reference(**inputs.kwargs)
        started = time.perf_counter()
        out, lse = flash_mla_with_kvcache_sm120(**inputs.kwargs)
        if options.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        stats = _stats(out, ref_out, inputs)
        shape_ok = (tuple(out.shape) == (case.T, 1, case.padded_heads, 512) and out.dtype == torch.bfloat16
                    and tuple(lse.shape) == (case.T, case.padded_heads, 1))
        if not shape_ok:
            stats["nan_free"] = False
        delegated = case.T > SM120_DECODE_MAX_TOKENS
        note = "T > 64: delegated to the float32 reference" if delegated else ""
        if not shape_ok:
            note = f"bad output {tuple(out.shape)} {out.dtype} lse {tuple(lse.shape)}"
        yield _row("kernel", case, stats, KERNEL_REL_BAR, note, seconds=round(seconds, 4),
                   delegated=delegated)
        del out, lse

        # The SIMT baseline runs one interpreted program per (token, head): keep it to tiny cases there.
        if options.device == "cuda" or case.T * case.padded_heads <= 64:
            simt_out, _ = simt_sparse_mla_decode(**inputs.kwargs)
            yield _row("simt", case, _stats(simt_out, ref_out, inputs), None,
                       "SIMT baseline (the 'before' design), bf16 scope merge")
            del simt_out
        for impl in stock:
            try:
                theirs, _ = impl.fn(**inputs.kwargs)
                yield _row(impl.name, case, _stats(theirs, ref_out, inputs), None,
                           f"SGLang 0.5.23 stock ({impl.origin.split(':')[0]})")
                del theirs
            except Exception as exc:  # noqa: BLE001 - a stock failure is reported, not fatal
                yield skipped_row(NAME, case.label, impl.name, f"raised {type(exc).__name__}: {str(exc)[:80]}")
        del inputs, ref_out

    decode_cases = [c for c in cases if c.T <= SM120_DECODE_MAX_TOKENS]
    if options.device == "cuda" and decode_cases:
        for case in _graph_cases(decode_cases):
            yield _graph_replay_row(case, flash_mla_with_kvcache_sm120, sparse_mla_reference, progress)
        yield _determinism_row(max(decode_cases, key=lambda c: c.T), flash_mla_with_kvcache_sm120, progress)
    elif decode_cases:
        for impl in ("graph-replay", "determinism"):
            yield skipped_row(NAME, "-", impl,
                              "needs CUDA; skipped on the interpreter")


def _stock_implementations(options: RunOptions):
    """SGLang's own implementations that load here, and ``{name: why not}`` for the others."""
    from dsv4kit.validation.implementations import implementations

    if not options.compare_sglang:
        return [], {"sglang": "SGLang's implementations disabled (--no-sglang)"}
    loaded, missing = implementations(NAME, options.device)
    return [i for i in loaded if i.name != "dsv4kit"], missing


def _graph_cases(cases: list[AttentionCase]) -> list[AttentionCase]:
    """Per layer kind (c4, c128) the largest-T case and, if different, the smallest-T one (small
    calls take other tiles and launch with programmatic dependent launch); else the largest."""
    picked = []
    for kind in ("c4", "c128"):
        of_kind = [c for c in cases if c.kind == kind]
        if of_kind:
            largest = max(of_kind, key=lambda c: (c.T, c.heads))
            smallest = min(of_kind, key=lambda c: (c.T, -c.heads))
            picked.extend([largest] if smallest == largest else [largest, smallest])
    return picked or [max(cases, key=lambda c: c.T)]


def _graph_replay_row(case: AttentionCase, fn, reference, progress) -> CheckRow:
    """Capture once (after two warm-up calls, as SGLang does); replay with new q, indices, lengths."""
    import torch

    progress(f"attention: CUDA-graph replay on {case.label}")
    static = case.inputs("cuda")
    kw = static.kwargs
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(**kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):  # capture on the warm-up stream, as SGLang does
        captured_out, _ = fn(**kw)

    gen = torch.Generator().manual_seed(1234)
    worst = {"max_abs": 0.0, "rel": 0.0, "nan_free": True, "empty_ok": True}
    for round_no in range(GRAPH_REPLAY_ROUNDS + 1):
        if round_no:
            # New values in the captured tensors: shuffled index rows (holes move), new lengths
            # anywhere in [0, width], fresh q (real heads) - the caches stay, as in SGLang.
            for key, len_key in (("indices", "topk_length"),
                                 ("extra_indices_in_kvcache", "extra_topk_length")):
                if key not in kw:
                    continue
                width = kw[key].shape[-1]
                perm = torch.randperm(width, generator=gen).to("cuda")
                kw[key].copy_(kw[key][:, :, perm].clone())
                kw[len_key].copy_(torch.randint(0, width + 1, kw[len_key].shape, generator=gen)
                                  .to(torch.int32).to("cuda"))
            fresh_q = torch.randn(kw["q"][:, :, : static.real_heads].shape, generator=gen)
            kw["q"][:, :, : static.real_heads].copy_(fresh_q.to(torch.bfloat16).to("cuda"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, _ = reference(**kw)
        stats = _stats(captured_out, ref_out, static)
        worst = {"max_abs": max(worst["max_abs"], stats["max_abs"]),
                 "rel": max(worst["rel"], stats["rel"]) if not math.isnan(stats["rel"]) else math.nan,
                 "nan_free": worst["nan_free"] and stats["nan_free"],
                 "empty_ok": worst["empty_ok"] and stats["empty_ok"]}
    del graph
    return _row("graph-replay", case, worst, KERNEL_REL_BAR,
                f"captured once, replayed with {GRAPH_REPLAY_ROUNDS} new q/indices/lengths")


def _determinism_row(case: AttentionCase, fn, progress) -> CheckRow:
    import torch

    progress(f"attention: determinism ({DETERMINISM_CALLS} calls) on {case.label}")
    kw = case.inputs("cuda").kwargs
    first, _ = fn(**kw)
    identical = all(torch.equal(first, fn(**kw)[0]) for _ in range(DETERMINISM_CALLS - 1))
    return CheckRow(suite=NAME, case=case.label, impl="determinism", passed=identical,
                    pattern_ok=identical, bar=0.0,
                    note=f"{DETERMINISM_CALLS} calls bitwise identical" if identical
                    else f"{DETERMINISM_CALLS} calls NOT bitwise identical",
                    extra={"spec": case.spec, "calls": DETERMINISM_CALLS})
