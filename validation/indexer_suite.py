"""Validation suite for the indexer kernel (``dsv4kit.kernels.indexer``); protocol in harness.py.

A case spec is ``BxPxN`` or ``BxPxNxH``: batch B, page-table width P (``max_seq_len = P*64``),
lengths up to N compressed positions, H index heads (default 64). A ``vK`` suffix (``16x513x32832v4``)
is a speculative verify step as SGLang 0.5.23 builds it (docs/sglang-contract.md, "Speculative
shapes"): B requests of K query tokens each (K = draft tokens + 1), so B*K rows; a request's rows
share its page-table row and hold its causal c4 lengths, ``(t - K + 1 + j) // 4`` for row j of a
request at token length t. Every case includes lengths 0,
1, 63/64/65, exact page multiples and N (``indexer_reference.edge_lengths``), shuffled page tables
and random stale entries past each length; odd-numbered cases pass ``seq_lens`` as ``[B, 1]``.

Rows per case: the kernel vs float64 (held to ``KERNEL_REL_BAR`` and an exact -inf pattern), the
kernel as the SGLang plugin calls it ("dsv4kit": skip tail policy, the same bar, -inf up to the end
of L's page), the bf16 torch fallback vs float64 (informational), and each of SGLang 0.5.23's own
implementations that loads here (``dsv4kit.validation.implementations``: TileLang, torch fallback;
informational, their error in the table). On CUDA: a CUDA-graph replay check and a determinism
check.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass
from typing import Iterator

from dsv4kit.validation.rows import CheckRow, RunOptions, skipped_row

NAME = "indexer"
KERNEL_REL_BAR = 5e-4
DETERMINISM_CALLS = 20
GRAPH_REPLAY_ROUNDS = 3

# The five configurations of the original validation, then B=64, edges and real context widths.
_GPU_CASES = [
    "1x8x512", "16x32x2048", "32x16x1024", "4x64x4096", "8x4x256",
    "64x32x2048", "64x64x4096", "3x1x64", "12x5x300", "64x513x32832", "2x4097x262208",
    # Speculative verify steps at the 128K context: P = 514 (SGLang's speculative headroom of 263 or
    # more tokens per request row): DSPARK gamma 3 at C=16 and C=64 (64 and 256 rows), gamma 5 (the
    # 0731 checkpoint's block) at C=16 (96 rows), gamma 7 at C=8, EAGLE 3 steps at C=32.
    "16x514x32832v4", "64x514x32832v4", "16x514x32832v6", "8x514x32832v8", "32x514x32832v4",
]
_CPU_CASES = ["1x8x512", "8x4x256", "3x1x64", "12x5x300", "16x32x2048", "64x2x128", "3x2x128v4"]


@dataclass(frozen=True)
class IndexerCase:
    spec: str
    batch: int
    pages: int
    max_len: int
    heads: int = 64
    verify: int = 1  # query tokens per request (K); rows = batch * verify

    @property
    def label(self) -> str:
        if self.verify > 1:
            return (f"B={self.batch * self.verify} ({self.batch} requests x {self.verify} verify tokens) "
                    f"H={self.heads} pages={self.pages} seqlen<={self.max_len}")
        return f"B={self.batch} H={self.heads} pages={self.pages} seqlen<={self.max_len}"

    @property
    def rows(self) -> int:
        return self.batch * self.verify


def default_cases(profile: str) -> list[str]:
    if profile not in ("gpu", "cpu"):
        raise ValueError(f"unknown profile {profile!r}; expected 'gpu' or 'cpu'")
    return list(_GPU_CASES if profile == "gpu" else _CPU_CASES)


def parse_case(spec: str) -> IndexerCase:
    body, _, verify_text = spec.strip().lower().partition("v")
    parts = body.split("x")
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts) or (verify_text and not verify_text.isdigit()):
        raise ValueError(f"indexer case {spec!r} must be BxPxN or BxPxNxH, optionally vK (e.g. 16x32x2048, 16x33x2112v4)")
    verify = int(verify_text) if verify_text else 1
    if verify < 1:
        raise ValueError(f"indexer case {spec!r}: K (verify tokens per request) must be >= 1")
    batch, pages, max_len = (int(p) for p in parts[:3])
    heads = int(parts[3]) if len(parts) == 4 else 64
    if batch < 1 or pages < 1:
        raise ValueError(f"indexer case {spec!r}: B and P must be >= 1")
    if max_len > pages * 64:
        raise ValueError(f"indexer case {spec!r}: N={max_len} exceeds P*64={pages * 64}")
    if heads not in (16, 32, 64, 128):
        raise ValueError(f"indexer case {spec!r}: H must be 16, 32, 64 or 128")
    return IndexerCase(spec, batch, pages, max_len, heads, verify)


def verify_lengths(case: IndexerCase, seed: int) -> list[int]:
    """Each request's rows: the causal c4 lengths of its K verify tokens (the longest at N, one at 0)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    k, most = case.verify, case.max_len * 4 + 3
    tokens = torch.randint(k, most + 1, (case.batch,), generator=gen).tolist()
    tokens[0] = most
    tokens[-1] = min(k, most) if case.batch > 1 else most  # a short request: its first rows have length 0
    return [min((t - k + 1 + j) // 4, case.max_len) for t in tokens for j in range(k)]


def share_request_pages(inputs, verify: int) -> None:
    """A request's rows read its one page-table row (its longest row's), as SGLang repeats it."""
    if verify > 1:
        table = inputs.page_table.view(-1, verify, inputs.page_table.shape[1])
        table.copy_(table[:, -1:, :].expand_as(table).clone())


def _seed(spec: str) -> int:
    return zlib.crc32(spec.encode())


def _row(impl: str, case: IndexerCase, stats: dict, bar, note: str = "", **extra) -> CheckRow:
    rel = stats["rel"]
    rel_ok = bar is None or (not math.isnan(rel) and rel <= bar)
    return CheckRow(suite=NAME, case=case.label, impl=impl, passed=bool(rel_ok and stats["pattern_ok"]),
                    max_abs=stats["max_abs"], rel=rel, pattern_ok=stats["pattern_ok"], bar=bar,
                    note=note, extra={"spec": case.spec, "compared": stats["compared"], **extra})


def run(specs: list[str], options: RunOptions) -> Iterator[CheckRow]:
    import torch

    # Imported here, after the harness has decided TRITON_INTERPRET.
    from dsv4kit.kernels import indexer_reference as ref
    from dsv4kit.kernels.indexer import fp8_paged_mqa_logits

    cases = [parse_case(s) for s in specs]
    ours, stock = _implementations(options)
    for name, why in stock.items():
        if isinstance(why, str):
            yield skipped_row(NAME, "-", name, f"{why}: its rows are skipped")
    stock = {name: impl for name, impl in stock.items() if not isinstance(impl, str)}
    progress = options.progress or (lambda _msg: None)

    for index, case in enumerate(cases):
        progress(f"indexer: {case.label}")
        two_d = index % 2 == 1
        inputs = ref.make_indexer_inputs(case.rows, case.heads, case.pages, case.max_len,
                                         seed=_seed(case.spec), device=options.device, seq_lens_2d=two_d,
                                         lengths=verify_lengths(case, _seed(case.spec)) if case.verify > 1 else None)
        share_request_pages(inputs, case.verify)
        exact = ref.exact_logits_f64(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                                     inputs.page_table, inputs.max_seq_len)
        rank_note = "seq_lens [B,1]" if two_d else ""
        started = time.perf_counter()
        out = fp8_paged_mqa_logits(*inputs.args())
        if options.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        shape_ok = tuple(out.shape) == (case.rows, inputs.max_seq_len) and out.dtype == torch.float32
        stats = ref.compare(out, exact, inputs.seq_lens)
        if not shape_ok:
            stats["pattern_ok"] = False
        yield _row("kernel", case, stats, KERNEL_REL_BAR,
                   rank_note if shape_ok else f"bad output {tuple(out.shape)} {out.dtype}",
                   seconds=round(seconds, 4), seq_lens_rank=2 if two_d else 1)
        del out

        skipped = ours.fn(*inputs.args())
        yield _row(ours.name, case, ref.compare(skipped, exact, inputs.seq_lens, tail=ours.tail),
                   KERNEL_REL_BAR, "as the SGLang plugin calls it (tail not written)")
        del skipped

        fallback = ref.fallback_logits(*inputs.args())
        yield _row("fallback", case, ref.compare(fallback, exact, inputs.seq_lens), None,
                   "bf16 scores, O(max_seq_len)")
        del fallback
        # SGLang passes seq_lens 1-D on the TileLang and torch routes.
        stock_args = list(inputs.args())
        stock_args[3] = stock_args[3].reshape(-1)
        for name, impl in stock.items():
            try:
                theirs = impl.fn(*stock_args)
                yield _row(name, case, ref.compare(theirs, exact, inputs.seq_lens, tail=impl.tail),
                           None, f"SGLang 0.5.23, {impl.origin.split(':')[0]}")
                del theirs
            except Exception as exc:  # noqa: BLE001 - a stock failure is reported, not fatal
                yield skipped_row(NAME, case.label, name, f"raised {type(exc).__name__}: {str(exc)[:80]}")
        del inputs, exact

    if options.device == "cuda" and cases:
        # The widest batch (then the widest table) exercises the most programs and lengths.
        largest = max(cases, key=lambda c: (c.rows, c.pages))
        yield _graph_replay_row(largest, fp8_paged_mqa_logits, ref, progress)
        yield _determinism_row(largest, fp8_paged_mqa_logits, ref, progress)
    elif cases:
        for impl in ("graph-replay", "determinism"):
            yield skipped_row(NAME, "-", impl,
                              "needs CUDA; skipped on the interpreter")


def _implementations(options: RunOptions):
    """Ours as the plugin calls it, and ``{name: Implementation or why it is not compared}``."""
    from dsv4kit.validation.implementations import implementations

    loaded, missing = implementations(NAME, options.device)
    ours = next(i for i in loaded if i.name == "dsv4kit")
    if not options.compare_sglang:
        return ours, {"sglang": "SGLang's implementations disabled (--no-sglang)"}
    stock = {i.name: i for i in loaded if i.name != "dsv4kit"}
    stock.update(missing)
    return ours, stock


def _random_lengths(case: IndexerCase, seed: int) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, case.max_len + 1, (case.rows,), generator=gen).tolist()
    lengths[seed % case.rows] = 0
    lengths[(seed + 1) % case.rows] = case.max_len
    return lengths


def _graph_replay_row(case: IndexerCase, fn, ref, progress) -> CheckRow:
    """Capture once; replay with new q, weights, seq_lens, page tables and cache contents."""
    import torch

    progress(f"indexer: CUDA-graph replay on {case.label}")
    num_pages = case.rows * case.pages + 3
    static = ref.make_indexer_inputs(case.rows, case.heads, case.pages, case.max_len,
                                     num_pages=num_pages, seed=7, device="cuda",
                                     lengths=_random_lengths(case, 7))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # SGLang warms up twice before capture
            fn(*static.args())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_out = fn(*static.args())

    worst = {"max_abs": 0.0, "rel": 0.0, "pattern_ok": True, "compared": 0}
    for round_seed in range(GRAPH_REPLAY_ROUNDS + 1):
        fresh = static if round_seed == 0 else ref.make_indexer_inputs(
            case.rows, case.heads, case.pages, case.max_len, num_pages=num_pages,
            seed=100 + round_seed, device="cuda", lengths=_random_lengths(case, 100 + round_seed))
        for name in ("q_fp8", "kvcache", "weight", "seq_lens", "page_table"):
            getattr(static, name).copy_(getattr(fresh, name))
        graph.replay()
        torch.cuda.synchronize()
        exact = ref.exact_logits_f64(fresh.q_fp8, fresh.kvcache, fresh.weight, fresh.seq_lens,
                                     fresh.page_table, fresh.max_seq_len)
        stats = ref.compare(captured_out, exact, fresh.seq_lens)
        worst = {"max_abs": max(worst["max_abs"], stats["max_abs"]),
                 "rel": max(worst["rel"], stats["rel"]),
                 "pattern_ok": worst["pattern_ok"] and stats["pattern_ok"],
                 "compared": worst["compared"] + stats["compared"]}
    del graph
    return _row("graph-replay", case, worst, KERNEL_REL_BAR,
                f"captured once, replayed with {GRAPH_REPLAY_ROUNDS} new seq_lens/page tables")


def _determinism_row(case: IndexerCase, fn, ref, progress) -> CheckRow:
    import torch

    progress(f"indexer: determinism ({DETERMINISM_CALLS} calls) on {case.label}")
    inputs = ref.make_indexer_inputs(case.rows, case.heads, case.pages, case.max_len,
                                     seed=_seed(case.spec), device="cuda")
    first = fn(*inputs.args())
    identical = all(torch.equal(first, fn(*inputs.args())) for _ in range(DETERMINISM_CALLS - 1))
    return CheckRow(suite=NAME, case=case.label, impl="determinism", passed=identical,
                    pattern_ok=identical, bar=0.0,
                    note=f"{DETERMINISM_CALLS} calls bitwise identical" if identical
                    else f"{DETERMINISM_CALLS} calls NOT bitwise identical",
                    extra={"spec": case.spec, "calls": DETERMINISM_CALLS})


def report_lines(payload: dict) -> str:
    """The indexer rows of a saved harness report, as the harness printed them (docs quote this)."""
    from dsv4kit.validation.rows import row_from_json, worst_line

    suite = payload["suites"][NAME]
    lines = [row_from_json(row).line() for row in suite["rows"]]
    worst = suite.get("worst")
    if worst:
        lines.append(worst_line(NAME, row_from_json(worst)))
    lines.append(f"{NAME}: {'PASS' if suite['passed'] else 'FAIL'}")
    return "\n".join(lines)
