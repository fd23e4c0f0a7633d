"""Capture-safe, O(actual length) FP8 paged MQA logits for the DeepSeek-V4 C4 indexer.

Drop-in for SGLang 0.5.23's ``fp8_paged_mqa_logits_torch_sm120`` (and the TileLang indexer):
the same eight positional arguments, the same fp32 ``[B, max_seq_len]`` result.

Byte layout of the index-K cache (docs/sglang-contract.md §2.3)
---------------------------------------------------
``kvcache`` is the layer's uint8 pool, ``[num_pages, 64, 1, 132]`` (or flat ``[num_pages, 8448]``).
The 4-D view is *not* token-major; a page is 8448 contiguous bytes::

    page p, slot o in [0, 64):
      bytes p*8448 +        o*128 + [0, 128)   K values, fp8 e4m3fn (OCP, max 448), token-major
      bytes p*8448 + 8192 + o*4   + [0, 4)     s_k, a plain fp32 scale (not ue8m0)

Compressed position ``t`` of row ``b`` lives in page ``page_table[b, t >> 6]``, slot ``t & 63``.
The kernel receives the uint8 pointer and reinterprets it in-kernel as fp8 (values) and as fp32
(scales: float offset ``p*2112 + 2048 + o``). All byte offsets are int64: ``num_pages*8448`` and
``B*max_seq_len`` can pass 2**31.

Maths (docs/sglang-contract.md §2.5)
------------------------
With ``L = seq_lens[b]`` (clamped to ``[0, max_seq_len]``), for ``t < L``::

    logit[b, t] = s_k[pg, o] * sum_h weight[b, h] * relu( sum_d q8[b, h, d] * k8[pg, o, d] )

q carries no scale of its own: the q scale, 1/sqrt(128) and 1/sqrt(64) are folded into ``weight``.
Per page the inner sums are one fp8 x fp8 ``tl.dot`` of ``[64 positions x 128] @ [128 x H heads]``
with fp32 accumulation (tensor cores on sm_90 and sm_120), then relu, the weighted head sum and the
scale in fp32.

Tail policy (``tail=``)
-----------------------
* ``"exact"`` (default; the torch fallback's contract, used by validation): every ``t >= L`` is
  exactly ``-inf``, the whole row ``[0, max_seq_len)`` is written.
* ``"skip"`` (what the SGLang plugin uses): positions ``[L, ceil(L/64)*64)`` are ``-inf``, nothing
  at or past ``ceil(L/64)*64`` is written (the output is ``torch.empty``), as SGLang's TileLang
  indexer. Every top-k consumer on SGLang 0.5.23's route masks by the lengths itself
  (docs/indexer.md), and at 1M context the exact tail is a 1 MiB write per row.

Work and grid
-------------
The grid is ``(B, R)`` with ``R = clamp(ceil(target_programs / B), 1, P)`` (enough programs to
fill the GPU); the exact tail policy also bounds each program's tail share to 4096 floats
(``R >= ceil(P*64 / 4096)``). ``R`` depends only on ``B``, ``P``, the policy and the device's SM
count, never on ``seq_lens`` values. Program ``(b, j)`` loads ``L`` on the device and

* scores pages ``j, j+R, j+2R, ... < ceil(L/64)``: work follows the actual length, and a page at
  or past ``ceil(L/64)`` is never loaded (only column ``j < R <= P`` of the table is read
  before ``L`` is known, alongside it, and used only if ``j < ceil(L/64)``);
* (exact policy only) fills its ``1/R`` share of the tail ``[ceil(L/64)*64, max_seq_len)`` with
  ``-inf`` using wide vector stores; ``[L, ceil(L/64)*64)`` is masked to ``-inf`` by the page that
  scores it (both policies).

A program whose ``j >= ceil(L/64)`` (most of them for short rows at a large ``max_seq_len`` with
the skip policy) loads ``L`` and that one table entry, and exits before any other load or the
pipelined loop. A program with exactly one page takes a straight-line path (no pipeline
prologue); one with more streams its pages through the software-pipelined loop, the next page's
id and scales prefetched one step ahead.

Capture safety (docs/sglang-contract.md §5): no ``.item()``, no host sync, no allocation other than the output
(``torch.empty``, which a CUDA graph serves from its private pool), static launch configuration
(no autotuning). All arguments are checked on the host before the launch.

A page id read for a position ``< L`` that lies outside ``[0, num_pages)`` is never dereferenced
(the address is clamped) and its 64 positions score ``-inf``: a corrupt table cannot make the
kernel read out of bounds.
"""

from __future__ import annotations

import functools
import operator
import os
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.kernels.errors import KernelArgumentError
from dsv4kit.kernels.indexer_rows import fill_tail, page_id

PAGE_SIZE = 64  # compressed positions per index-K page
HEAD_DIM = 128  # index head dim
PAGE_BYTES = PAGE_SIZE * (HEAD_DIM + 4)  # 8448: 64*128 fp8 values then 64 fp32 scales
SCALE_OFFSET = PAGE_SIZE * HEAD_DIM  # 8192: byte offset of the scales within a page

# Launch configuration. Static on purpose: autotuning would sync the device inside capture.
# Programs per row R = clamp(max(ceil(PROGRAMS_PER_SM * num_SMs / B), ceil(P*64 / TAIL_PER_PROGRAM)), 1, P).
PROGRAMS_PER_SM = 4
# At most this many -inf floats of a row's tail per program: at 1M context (262,208 columns) a
# large batch otherwise leaves each program a 100+ KiB serial fill (H200 sweep, B=64 at 1M).
TAIL_PER_PROGRAM = 4096
NUM_WARPS = 4
NUM_STAGES = 3
FILL_BLOCK = 2048  # fp32 elements per -inf store (8 KiB)
PREFETCH = True  # prefetch the next page's id and scales one iteration ahead (one page a step)
DIRECT = True  # a program with a single page skips the pipelined loop

# Calls of at least SHARED_ROWS_MIN_BATCH rows whose max_seq_len is at least SHARED_ROWS_MIN_LEN
# (prefill chunks over a context of 8K tokens or more: one row per extend token) go to the row-tile
# kernel (dsv4kit.kernels.indexer_tiles), which reads a key page once for the rows of a tile that
# share it. Decode and verify batches, and short prefills, stay on the per-row kernel below, which
# is faster where rows do not share keys or have few pages (H100 run in
# docs/results/bench_indexer_prefill_h100.json). A shape-only choice: capture-safe.
SHARED_ROWS_MIN_BATCH = 1024
SHARED_ROWS_MIN_LEN = 2048
# The row-tile grid's R comes from programs_per_row for ceil(B/4) rows at this many programs an SM.
# At one, a chunk of 1K-8K rows gets R = 1 (one program a tile, all its pages): 1K-row chunks ran
# 8-10% faster than at two (R = 4, four times the programs, each with its own prologue) and larger
# chunks the same (H100, docs/indexer.md).
SHARED_ROWS_PROGRAMS_PER_SM = 1

TAIL_EXACT = "exact"  # every t >= L is -inf (the torch fallback's contract)
TAIL_SKIP = "skip"  # nothing at or past ceil(L/64)*64 is written (TileLang's behaviour)
TAIL_POLICIES = (TAIL_EXACT, TAIL_SKIP)

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
PIN_FIRST = True  # the early exit reads the first table entry too (keeps its load beside seq_len)


@triton.jit
def _indexer_logits_kernel(
    q_ptr,  # fp8 e4m3 [B, 1, H, D], contiguous
    kv_ptr,  # uint8 [num_pages, 8448]
    w_ptr,  # fp32 [B, H], contiguous
    seq_lens_ptr,  # int32 [B] with stride seq_lens_stride
    page_table_ptr,  # int32 [B, P] with row stride pt_stride, unit column stride
    out_ptr,  # fp32 [B, max_seq_len], contiguous
    seq_lens_stride,
    pt_stride,
    num_pages,
    max_seq_len,
    progs_per_row,
    H: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    FILL: tl.constexpr,
    PREFETCH: tl.constexpr,
    EXACT_TAIL: tl.constexpr,
    DIRECT: tl.constexpr,
    PIN_FIRST: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)

    seq_len = tl.load(seq_lens_ptr + b * seq_lens_stride)
    seq_len = tl.minimum(tl.maximum(seq_len, 0), max_seq_len)
    n_pages = (seq_len + PAGE - 1) // PAGE
    out_row = out_ptr + b * max_seq_len
    offs_t = tl.arange(0, PAGE)

    pt_row = page_table_ptr + b * pt_stride
    # The first page id is read alongside seq_len, before n_pages is known: j < R <= P keeps the
    # read inside the table row, and the id is only used if j < n_pages.
    page_first = tl.load(pt_row + j)
    scoring = j < n_pages
    if PIN_FIRST:
        # The early exit below also reads the entry, so ptxas cannot issue its load after the
        # exit (where it would wait for seq_len instead of travelling with it). An entry equal
        # to INT32_MIN (never a page id) sends a program with no page on: its loads are clamped
        # and its stores masked by n_pages, so it writes nothing.
        scoring = scoring | (page_first == -2147483648)
    page_first = page_first.to(tl.int64)
    if EXACT_TAIL:  # this program's share of the -inf tail [n_pages*PAGE, max_seq_len)
        fill_tail(out_row, n_pages * PAGE, max_seq_len, j, progs_per_row, FILL, PAGE)

    # ---- scored pages: j, j+R, ... < n_pages ----
    store_end = tl.minimum(n_pages * PAGE, max_seq_len)
    # A program with no page (most of them for short rows at a large max_seq_len) stops here:
    # it loads nothing else and never enters the pipelined loop's prologue.
    offs_h = tl.arange(0, H)
    offs_d = tl.arange(0, D)
    q_ptrs = q_ptr + b * (H * D) + offs_h[:, None] * D + offs_d[None, :]
    if scoring:
        kv_fp8 = kv_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
        kv_f32 = kv_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
        ok_next = (page_first >= 0) & (page_first < num_pages)
        page_next = tl.where(ok_next, page_first, 0)  # never dereference an id outside the pool
        if DIRECT and n_pages - j <= progs_per_row:
            # Exactly one page here: a straight line, no pipeline prologue/epilogue. Every load
            # is issued before the first one is waited on (the stores to shared memory wait).
            w = tl.load(w_ptr + b * H + offs_h)
            s_k = tl.load(kv_f32 + page_next * (PAGE_BYTES // 4) + SCALE_OFFSET // 4 + offs_t)
            k = tl.load(kv_fp8 + page_next * PAGE_BYTES + offs_t[:, None] * D + offs_d[None, :])
            q = tl.load(q_ptrs)
            _score_tile(k, tl.trans(q), w, ok_next, s_k, seq_len, j, out_row, store_end, offs_t, PAGE)
        else:
            w = tl.load(w_ptr + b * H + offs_h)
            # Transposed outside the loop, so the MMA's shared-memory copy of q is made once.
            q_t = tl.trans(tl.load(q_ptrs))
            # Software prefetch: the next page's id and scales one iteration ahead (the
            # pipeliner only prefetches the dot operand).
            s_next = tl.load(kv_f32 + page_next * (PAGE_BYTES // 4) + SCALE_OFFSET // 4 + offs_t)
            for p in range(j, n_pages, progs_per_row):
                if PREFETCH:
                    page = page_next
                    page_ok = ok_next
                    s_k = s_next
                    p_next = p + progs_per_row
                    page_next, ok_next = page_id(pt_row, p_next, n_pages, num_pages)
                    s_next = tl.load(kv_f32 + page_next * (PAGE_BYTES // 4) + SCALE_OFFSET // 4
                                     + offs_t, mask=(offs_t * 0 + p_next) < n_pages, other=0.0)
                else:
                    page = tl.load(pt_row + p).to(tl.int64)
                    page_ok = (page >= 0) & (page < num_pages)
                    page = tl.where(page_ok, page, 0)
                    s_k = tl.load(kv_f32 + page * (PAGE_BYTES // 4) + SCALE_OFFSET // 4 + offs_t)
                k = tl.load(kv_fp8 + page * PAGE_BYTES + offs_t[:, None] * D + offs_d[None, :])
                _score_tile(k, q_t, w, page_ok, s_k, seq_len, p, out_row, store_end, offs_t, PAGE)


@triton.jit
def _score_tile(k, q_t, w, page_ok, s_k, seq_len, p, out_row, store_end, offs_t,
                PAGE: tl.constexpr):
    """Score page ``p`` of a row from its loaded K tile and scales; store its logits below
    ``store_end`` (``min(ceil(L/64)*64, max_seq_len)``); ``q_t`` is the row's q as ``[D, H]``."""
    scored_until = tl.where(page_ok, seq_len, 0)  # a bad id's positions score -inf
    scores = tl.dot(k, q_t)  # [PAGE, H] fp32 accumulation
    scores = tl.maximum(scores, 0.0)
    logit = tl.sum(scores * w[None, :], axis=1) * s_k
    t = p * PAGE + offs_t
    logit = tl.where(t < scored_until, logit, float("-inf"))
    tl.store(out_row + t, logit, mask=t < store_end)



@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    if _INTERPRET or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def uses_row_tiles(batch: int, max_seq_len: int) -> bool:
    """Whether the entries send a call of ``batch`` rows and ``max_seq_len`` to the row-tile kernel
    (prefill-sized); otherwise they launch the per-row kernel."""
    return batch >= SHARED_ROWS_MIN_BATCH and max_seq_len >= SHARED_ROWS_MIN_LEN


def programs_per_row(batch: int, num_table_pages: int, device: torch.device,
                     programs_per_sm: int = PROGRAMS_PER_SM, tail: str = TAIL_EXACT) -> int:
    """R for the grid ``(B, R)``: a function of B, P, the tail policy and the device only
    (capture-safe)."""
    index = device.index if device.index is not None else (
        torch.cuda.current_device() if device.type == "cuda" else 0)
    target = programs_per_sm * _sm_count(index)
    wanted = -(-target // max(batch, 1))
    if tail == TAIL_EXACT:
        wanted = max(wanted, -(-num_table_pages * PAGE_SIZE // TAIL_PER_PROGRAM))
    return max(1, min(num_table_pages, wanted))


def _fail(message: str) -> None:
    raise KernelArgumentError(f"fp8_paged_mqa_logits: {message}")


def check_rows_and_table(lens, table, max_len, batch: int, fail, *, names: tuple[str, str, str]):
    """The lengths ``[B]`` or ``[B, 1]`` int32, the page table ``[B, P]`` int32 with contiguous rows,
    and ``1 <= max_len <= P*64``, named as the caller's API names them; calls ``fail`` otherwise.
    Returns ``(lens as [B], P, max_len as int)``. Shared by the FP8 and FP4 entries."""
    lens_name, table_name, max_name = names
    if lens.dtype != torch.int32:
        fail(f"{lens_name} must be int32, got {lens.dtype}")
    flat = lens[:, 0] if lens.dim() == 2 and lens.shape[1] == 1 else lens
    if flat.dim() != 1 or flat.shape[0] != batch:
        fail(f"{lens_name} must be [B] or [B, 1] with B = {batch}, got {tuple(lens.shape)}")
    if table.dtype != torch.int32:
        fail(f"{table_name} must be int32, got {table.dtype}")
    if table.dim() != 2 or table.shape[0] != batch:
        fail(f"{table_name} must be [B, P] with B = {batch}, got {tuple(table.shape)}")
    if table.shape[1] < 1:
        fail(f"{table_name} has no columns (P == 0)")
    if table.stride(1) != 1:
        fail(f"{table_name} rows must be contiguous (column stride 1)")
    table_pages = table.shape[1]
    if isinstance(max_len, bool):
        fail(f"{max_name} must be an int, got bool")
    try:
        max_len = operator.index(max_len)
    except TypeError:
        fail(f"{max_name} must be an int, got {type(max_len).__name__}")
    # Decode passes exactly P*64; SGLang's prefill path passes max(lens) <= P*64.
    if not 1 <= max_len <= table_pages * PAGE_SIZE:
        fail(f"{max_name} must be in [1, P*64] = [1, {table_pages * PAGE_SIZE}] "
             f"for {table_name} with P = {table_pages}, got {max_len}")
    return flat, table_pages, max_len


def check_args(q_fp8, kvcache, weight, seq_lens, page_table, max_seq_len, clean_logits,
               tail=TAIL_EXACT):
    """Validate every argument on the host; return ``(B, H, P, num_pages, seq_lens_1d, kv_2d, msl)``.

    Runs before any launch (and so never inside a captured region): only shapes, dtypes, strides
    and devices are inspected, never tensor values.
    """
    for name, value in (("q_fp8", q_fp8), ("kvcache", kvcache), ("weight", weight),
                        ("seq_lens", seq_lens), ("page_table", page_table)):
        if not isinstance(value, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if clean_logits:
        _fail("clean_logits=True is not supported (every SGLang 0.5.23 caller passes False)")
    if tail not in TAIL_POLICIES:
        _fail(f"tail must be one of {TAIL_POLICIES}, got {tail!r}")

    if q_fp8.dtype != torch.float8_e4m3fn:
        _fail(f"q_fp8 must be torch.float8_e4m3fn, got {q_fp8.dtype}")
    if q_fp8.dim() != 4 or q_fp8.shape[1] != 1:
        _fail(f"q_fp8 must be [B, 1, H, 128] (next_n == 1), got shape {tuple(q_fp8.shape)}")
    batch, _, heads, head_dim = q_fp8.shape
    if head_dim != HEAD_DIM:
        _fail(f"head_dim must be {HEAD_DIM}, got {head_dim} (q_fp8 shape {tuple(q_fp8.shape)})")
    if heads not in (16, 32, 64, 128):
        _fail(f"number of index heads must be 16, 32, 64 or 128, got {heads}")
    if not q_fp8.is_contiguous():
        _fail("q_fp8 must be contiguous")

    if kvcache.dtype != torch.uint8:
        _fail(f"kvcache must be the uint8 index-K pool, got {kvcache.dtype}")
    if kvcache.dim() == 4:
        if kvcache.shape[1] != PAGE_SIZE:
            _fail(f"page size must be {PAGE_SIZE}, got kvcache shape {tuple(kvcache.shape)}")
        if tuple(kvcache.shape[2:]) != (1, HEAD_DIM + 4):
            _fail(f"kvcache must be [num_pages, 64, 1, 132], got {tuple(kvcache.shape)}")
    elif kvcache.dim() == 2:
        if kvcache.shape[1] != PAGE_BYTES:
            _fail(f"flat kvcache pages must be {PAGE_BYTES} bytes (page size {PAGE_SIZE}), "
                  f"got shape {tuple(kvcache.shape)}")
    else:
        _fail(f"kvcache must be [num_pages, 64, 1, 132] or [num_pages, {PAGE_BYTES}], "
              f"got shape {tuple(kvcache.shape)}")
    if not kvcache.is_contiguous():
        _fail("kvcache must be contiguous")
    if kvcache.data_ptr() % 4:
        # Each page's 64 fp32 scales are read as 4-byte words.
        _fail(f"kvcache must start 4-byte aligned (its fp32 scales are read as words), "
              f"data_ptr % 4 = {kvcache.data_ptr() % 4}")
    num_pages = kvcache.shape[0]
    if num_pages < 1:
        _fail("kvcache holds no pages")

    if weight.dtype != torch.float32:
        _fail(f"weight must be float32, got {weight.dtype}")
    if tuple(weight.shape) != (batch, heads):
        _fail(f"weight must be [B, H] = {(batch, heads)}, got {tuple(weight.shape)}")
    if not weight.is_contiguous():
        _fail("weight must be contiguous")

    seq_lens, table_pages, max_seq_len = check_rows_and_table(
        seq_lens, page_table, max_seq_len, batch, _fail, names=("seq_lens", "page_table", "max_seq_len"))

    device = q_fp8.device
    for name, value in (("kvcache", kvcache), ("weight", weight), ("seq_lens", seq_lens),
                        ("page_table", page_table)):
        if value.device != device:
            _fail(f"{name} is on {value.device} but q_fp8 is on {device}")
    if device.type != "cuda" and not _INTERPRET:
        _fail(f"tensors must be on a CUDA device, got {device} "
              "(set TRITON_INTERPRET=1 before importing to run on the CPU interpreter)")
    return batch, heads, table_pages, num_pages, seq_lens, kvcache.view(num_pages, PAGE_BYTES), max_seq_len


def fp8_paged_mqa_logits(
    q_fp8: torch.Tensor,
    kvcache: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    deep_gemm_metadata: Any,
    max_seq_len: int,
    clean_logits: bool = False,
    *,
    tail: str = TAIL_EXACT,
) -> torch.Tensor:
    """fp32 ``[B, max_seq_len]`` indexer logits; ``-inf`` at ``t >= seq_lens[b]`` as ``tail`` says.

    Arguments as SGLang 0.5.23 passes them (docs/sglang-contract.md §2.2): ``q_fp8`` fp8 ``[B, 1, H, 128]``,
    ``kvcache`` uint8 ``[num_pages, 64, 1, 132]``, ``weight`` fp32 ``[B, H]``, ``seq_lens`` int32
    ``[B]`` or ``[B, 1]`` (compressed lengths, may be 0), ``page_table`` int32 ``[B, P]`` (entries
    past a row's length may be stale and are never read), ``deep_gemm_metadata`` (ignored),
    ``max_seq_len`` (``P * 64`` in decode), ``clean_logits`` (must be False); keyword ``tail``:
    ``"exact"`` (every ``t >= L`` is ``-inf``) or ``"skip"`` (nothing at or past
    ``ceil(L/64)*64`` is written). Layout and maths: see the module docstring.
    """
    del deep_gemm_metadata  # None on sm_120; rows are never chunked on this route
    batch, heads, table_pages, num_pages, seq_lens_1d, kv_pages, max_seq_len = check_args(
        q_fp8, kvcache, weight, seq_lens, page_table, max_seq_len, clean_logits, tail)
    out = torch.empty((batch, max_seq_len), dtype=torch.float32, device=q_fp8.device)
    if batch == 0:
        return out
    if uses_row_tiles(batch, max_seq_len):
        from dsv4kit.kernels import indexer_tiles

        tiles = -(-batch // indexer_tiles.ROWS)
        indexer_tiles.launch(q_fp8, kv_pages, weight, seq_lens_1d, page_table, out, num_pages,
                             max_seq_len, indexer_tiles.programs_per_tile(programs_per_row(
                                 tiles, table_pages, q_fp8.device,
                                 programs_per_sm=SHARED_ROWS_PROGRAMS_PER_SM, tail=tail)),
                             tail, FILL_BLOCK)
        return out
    launch(q_fp8, kv_pages, weight, seq_lens_1d, page_table, out, num_pages, max_seq_len,
           programs_per_row(batch, table_pages, q_fp8.device, tail=tail), tail=tail)
    return out


def fp8_paged_mqa_logits_for_sglang(q_fp8, kvcache, weight, seq_lens, page_table,
                                    deep_gemm_metadata, max_seq_len, clean_logits=False):
    """What the SGLang plugin installs: SGLang's eight arguments, the ``"skip"`` tail policy.

    SGLang 0.5.23's top-k paths mask every row by its length themselves (docs/indexer.md), so
    the tail is a write nobody reads; TileLang, the sm_120 default, does not write it either.
    """
    return fp8_paged_mqa_logits(q_fp8, kvcache, weight, seq_lens, page_table, deep_gemm_metadata,
                                max_seq_len, clean_logits, tail=TAIL_SKIP)


def launch(q_fp8, kv_pages, weight, seq_lens_1d, page_table, out, num_pages, max_seq_len,
           progs_per_row, num_warps=NUM_WARPS, num_stages=NUM_STAGES, fill_block=FILL_BLOCK,
           prefetch=PREFETCH, tail=TAIL_EXACT, direct=DIRECT, pin_first=PIN_FIRST):
    """Launch on already-checked arguments (the benchmark uses this to sweep configurations)."""
    batch, _, heads, head_dim = q_fp8.shape
    grid = (batch, progs_per_row)
    _indexer_logits_kernel[grid](
        q_fp8, kv_pages, weight, seq_lens_1d, page_table, out,
        seq_lens_1d.stride(0), page_table.stride(0), num_pages, max_seq_len, progs_per_row,
        H=heads, D=head_dim, PAGE=PAGE_SIZE, PAGE_BYTES=PAGE_BYTES, SCALE_OFFSET=SCALE_OFFSET,
        FILL=fill_block, PREFETCH=prefetch, EXACT_TAIL=tail == TAIL_EXACT, DIRECT=direct,
        PIN_FIRST=pin_first,
        num_warps=num_warps, num_stages=num_stages,
    )
