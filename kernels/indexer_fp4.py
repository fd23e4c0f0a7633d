"""Capture-safe, O(actual length) indexer logits from SGLang 0.5.23's FP4 index-K cache.

Drop-in for DeepGEMM's ``fp8_fp4_paged_mqa_logits``, which is what SGLang 0.5.23 calls with
``--enable-deepseek-v4-fp4-indexer`` (docs/sglang-contract.md §2.10): the same eight positional
arguments, the same fp32 ``[B, max_seq_len]`` result.

Layout (docs/sglang-contract.md §2.10)
--------------------------------------
``q`` is a pair ``(q_fp4 [B, 1, H, 64] int8, q_sf [B, 1, H] int32)``: per head 128 e2m1 values
packed two a byte (element ``2i`` in the low nibble of byte ``i``) and four ue8m0 exponents, one
per 32 values, byte ``i`` of the int32 for block ``i``. ``kv_cache`` is the layer's uint8 pool
``[num_pages, 64, 1, 68]`` (or flat ``[num_pages, 4352]``); the 4-D view is not token-major::

    page p, slot o in [0, 64):
      bytes p*4352 +        o*64 + [0, 64)   128 packed e2m1 values, as q
      bytes p*4352 + 4096 + o*4  + [0, 4)    four ue8m0 exponents, one per 32 values

An e2m1 code ``s eem`` is ``(-1)^s * {0, .5, 1, 1.5, 2, 3, 4, 6}[eem]``; exponent ``e`` scales
its block by ``2^(e-127)``. Compressed position ``t`` of row ``b`` is page
``block_table[b, t >> 6]``, slot ``t & 63``. Byte offsets are int64.

Maths
-----
For ``t < L = context_lens[b]`` (clamped to ``[0, max_seq_len]``), with ``q~`` and ``k~`` the
dequantised vectors::

    logit[b, t] = sum_h weights[b, h] * relu( sum_d q~[b, h, d] * k~[pg, o, d] )

``weights`` is already ``w_proj(x) * 128^-1/2 * 64^-1/2``; unlike the FP8 path there is no
per-position scale outside the dot, both block scales live inside it. Per page the inner sums are
one block-scaled ``tl.dot_scaled`` of ``[64 positions x 128] @ [128 x H]`` (e2m1 x e2m1, ue8m0
scales, fp32 accumulation): on sm_120 a native ``mma.sync ... kind::mxf4nvf4.block_scale``, on
sm_90 Triton's exact upcast to bf16 then wgmma. Products of e2m1 values times powers of two are
exact, so the result differs from float64 only by fp32 summation while every block scale stays in
bf16's range (ue8m0 exponents below 253 with the largest codes; SGLang's writers produce
112..253).

Tail policies, grid, capture safety: as ``dsv4kit.kernels.indexer`` (the FP8 kernel), whose
``programs_per_row`` this module uses. ``"exact"``: every ``t >= L`` is ``-inf``; ``"skip"`` (the
SGLang plugin): ``[L, ceil(L/64)*64)`` is ``-inf`` and nothing at or past ``ceil(L/64)*64`` is
written, as DeepGEMM, whose output is ``torch.empty`` too. Program ``(b, j)`` of the fixed grid
``(B, R)`` scores pages ``j, j+R, ... < ceil(L/64)`` only; ``L`` is read on the device. A page id
outside ``[0, num_pages)`` read for a position ``< L`` is never dereferenced; its positions score
``-inf``. All arguments are checked on the host before the launch; the only allocation is the
output.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from dsv4kit.kernels import indexer as _fp8_entry
from dsv4kit.kernels import indexer_tiles as _tiles
from dsv4kit.kernels.errors import KernelArgumentError
from dsv4kit.kernels.indexer_rows import (fill_tail, page_id, row_scalars, tile_scalars,
                                          tile_shares_pages)
from dsv4kit.kernels.indexer import (
    _INTERPRET,
    FILL_BLOCK,
    TAIL_EXACT,
    TAIL_POLICIES,
    TAIL_SKIP,
    check_rows_and_table,
    programs_per_row,
)

PAGE_SIZE = 64
HEAD_DIM = 128
PACKED_BYTES = HEAD_DIM // 2  # 64
SCALE_BYTES = HEAD_DIM // 32  # 4
SLOT_BYTES = PACKED_BYTES + SCALE_BYTES  # 68
PAGE_BYTES = PAGE_SIZE * SLOT_BYTES  # 4352
SCALE_OFFSET = PAGE_SIZE * PACKED_BYTES  # 4096
HEADS = (16, 32, 64, 128)

NUM_WARPS = 4
NUM_STAGES = 3
DIRECT = True  # a program with a single page skips the pipelined loop
TILE_NUM_STAGES = 2  # the row-tile kernel (H100 run: a few % faster than 3 at prefill shapes)

# q_fp4 may arrive as int8 (SGLang), uint8 or torch's packed fp4 dtype: all are the same bytes.
_Q_DTYPES = tuple(d for d in (torch.int8, torch.uint8, getattr(torch, "float4_e2m1fn_x2", None))
                  if d is not None)


@triton.jit
def _fp4_logits_kernel(
    q_ptr,  # [B, 1, H, 64] packed e2m1 bytes, contiguous
    qs_ptr,  # [B, 1, H] int32 (four ue8m0 bytes each), contiguous
    kv_ptr,  # uint8 [num_pages, 4352]
    w_ptr,  # fp32 [B, H], contiguous
    seq_lens_ptr,  # int32 [B] with stride seq_lens_stride
    page_table_ptr,  # int32 [B, P], row stride pt_stride, unit column stride
    out_ptr,  # fp32 [B, max_seq_len], contiguous
    seq_lens_stride,
    pt_stride,
    num_pages,
    max_seq_len,
    progs_per_row,
    H: tl.constexpr,
    PAGE: tl.constexpr,
    PACKED: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    FILL: tl.constexpr,
    EXACT_TAIL: tl.constexpr,
    DIRECT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)

    seq_len = tl.load(seq_lens_ptr + b * seq_lens_stride)
    seq_len = tl.minimum(tl.maximum(seq_len, 0), max_seq_len)
    n_pages = (seq_len + PAGE - 1) // PAGE
    out_row = out_ptr + b * max_seq_len
    pt_row = page_table_ptr + b * pt_stride
    # Read beside seq_len: j < R <= P keeps it inside the row; used only if j < n_pages.
    page_first = tl.load(pt_row + j).to(tl.int64)
    if EXACT_TAIL:
        fill_tail(out_row, n_pages * PAGE, max_seq_len, j, progs_per_row, FILL, PAGE)

    if j < n_pages:
        store_end = tl.minimum(n_pages * PAGE, max_seq_len)
        offs_t = tl.arange(0, PAGE)
        offs_i = tl.arange(0, PACKED)
        offs_h = tl.arange(0, H)
        offs_s = tl.arange(0, 4)
        q, q_scale, w = _row_operands(q_ptr, qs_ptr, w_ptr, b, H, PACKED)
        ok = (page_first >= 0) & (page_first < num_pages)
        page = tl.where(ok, page_first, 0)  # never dereference an id outside the pool
        if DIRECT and n_pages - j <= progs_per_row:
            _score_page(kv_ptr, page, ok, q, q_scale, w, seq_len, j, out_row, store_end,
                        offs_t, offs_i, offs_s, PAGE, PACKED, PAGE_BYTES, SCALE_OFFSET)
        else:
            for p in range(j, n_pages, progs_per_row):
                _score_page(kv_ptr, page, ok, q, q_scale, w, seq_len, p, out_row, store_end,
                            offs_t, offs_i, offs_s, PAGE, PACKED, PAGE_BYTES, SCALE_OFFSET)
                # The next page's id, read one step ahead.
                page, ok = page_id(pt_row, p + progs_per_row, n_pages, num_pages)


@triton.jit
def _row_operands(q_ptr, qs_ptr, w_ptr, row, H: tl.constexpr, PACKED: tl.constexpr):
    """One row's q as the dot's right operand ``[64 packed bytes (K), H]``, its exponents
    ``[H, 4]`` and its weights ``[H]``."""
    offs_h = tl.arange(0, H)
    offs_i = tl.arange(0, PACKED)
    offs_s = tl.arange(0, 4)
    q_u8 = q_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    qs_u8 = qs_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    q = tl.load(q_u8 + (row * H + offs_h[None, :]) * PACKED + offs_i[:, None])
    q_scale = tl.load(qs_u8 + (row * H + offs_h[:, None]) * 4 + offs_s[None, :])
    w = tl.load(w_ptr + row * H + offs_h)
    return q, q_scale, w


@triton.jit
def _score_page(kv_ptr, page, page_ok, q, q_scale, w, seq_len, p, out_row, store_end,
                offs_t, offs_i, offs_s, PAGE: tl.constexpr, PACKED: tl.constexpr,
                PAGE_BYTES: tl.constexpr, SCALE_OFFSET: tl.constexpr):
    """Score page ``p`` of a row (pool page ``page``); store its logits below ``store_end``."""
    base = kv_ptr + page * PAGE_BYTES
    k = tl.load(base + offs_t[:, None] * PACKED + offs_i[None, :])  # [64, 64] packed bytes
    k_scale = tl.load(base + SCALE_OFFSET + offs_t[:, None] * 4 + offs_s[None, :])  # [64, 4]
    scores = tl.dot_scaled(k, k_scale, "e2m1", q, q_scale, "e2m1")  # [64, H] fp32
    scores = tl.maximum(scores, 0.0)
    logit = tl.sum(scores * w[None, :], axis=1)
    t = p * PAGE + offs_t
    scored_until = tl.where(page_ok, seq_len, 0)  # a bad id's positions score -inf
    logit = tl.where(t < scored_until, logit, float("-inf"))
    tl.store(out_row + t, logit, mask=t < store_end)


@triton.jit
def _fp4_shared_rows_kernel(
    q_ptr,  # [B, 1, H, 64] packed e2m1 bytes, contiguous
    qs_ptr,  # [B, 1, H] int32 (four ue8m0 bytes each), contiguous
    kv_ptr,  # uint8 [num_pages, 4352]
    w_ptr,  # fp32 [B, H], contiguous
    seq_lens_ptr,  # int32 [B] with stride seq_lens_stride
    page_table_ptr,  # int32 [B, P], row stride pt_stride, unit column stride
    out_ptr,  # fp32 [B, max_seq_len], contiguous
    seq_lens_stride,
    pt_stride,
    num_pages,
    max_seq_len,
    batch,
    progs,
    ROWS: tl.constexpr,
    H: tl.constexpr,
    PAGE: tl.constexpr,
    PACKED: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    FILL: tl.constexpr,
    EXACT_TAIL: tl.constexpr,
    CHECK: tl.constexpr,
):
    """The row-tile scheme of ``indexer_tiles`` on the FP4 cache: a tile whose rows agree on
    every page scores each page with one block-scaled product ``[64 x 128] @ [128 x ROWS*H]``
    (the rows' q and their ue8m0 exponents stacked); otherwise each row on its own."""
    tile = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    offs_t = tl.arange(0, PAGE)
    offs_i = tl.arange(0, PACKED)
    offs_s = tl.arange(0, 4)
    seq_len, n_pages, pt_rows, out_rows, store_end = tile_scalars(
        seq_lens_ptr, seq_lens_stride, page_table_ptr, pt_stride, out_ptr, tile, batch,
        max_seq_len, j, progs, ROWS, PAGE, FILL, EXACT_TAIL)
    q_u8 = q_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    qs_u8 = qs_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    n_max = tl.max(n_pages, axis=0)
    if tile_shares_pages(pt_rows, n_pages, n_max, 0, 1, CHECK):
        offs_m = tl.arange(0, ROWS * H)
        m_live = (tile * ROWS + offs_m // H) < batch
        m = tile * (ROWS * H) + offs_m
        q = tl.load(q_u8 + m[None, :] * PACKED + offs_i[:, None], mask=m_live[None, :], other=0)
        q_scale = tl.load(qs_u8 + m[:, None] * 4 + offs_s[None, :], mask=m_live[:, None], other=0)
        w = tl.load(w_ptr + m, mask=m_live, other=0.0)
        ids_next = tl.load(pt_rows + j, mask=j < n_pages, other=-1)
        for p in range(j, n_max, progs):
            lead = tl.max(ids_next, axis=0)
            ids_next = tl.load(pt_rows + (p + progs), mask=(p + progs) < n_pages, other=-1)
            ok = (lead >= 0) & (lead < num_pages)
            base = kv_ptr + tl.where(ok, lead, 0).to(tl.int64) * PAGE_BYTES
            k = tl.load(base + offs_t[:, None] * PACKED + offs_i[None, :])
            k_scale = tl.load(base + SCALE_OFFSET + offs_t[:, None] * 4 + offs_s[None, :])
            scores = tl.dot_scaled(k, k_scale, "e2m1", q, q_scale, "e2m1")  # [PAGE, ROWS*H]
            scores = tl.maximum(scores, 0.0) * w[None, :]
            logit = tl.trans(tl.sum(tl.reshape(scores, (PAGE, ROWS, H)), axis=2))  # [ROWS, PAGE]
            t = p * PAGE + offs_t
            scored_until = tl.where(ok, seq_len, 0)
            logit = tl.where(t[None, :] < scored_until[:, None], logit, float("-inf"))
            tl.store(out_rows[:, None] + t[None, :], logit, mask=t[None, :] < store_end[:, None])
    else:
        for r in tl.static_range(ROWS):
            row = tile * ROWS + r
            L_r, n_r, pt_r, o_r, e_r = row_scalars(seq_lens_ptr, seq_lens_stride,
                                                           page_table_ptr, pt_stride, out_ptr, row,
                                                           batch, max_seq_len, PAGE)
            q_r, qs_r, w_r = _row_operands(q_ptr, qs_ptr, w_ptr, tl.where(row < batch, row, 0),
                                           H, PACKED)
            for p in range(j, n_r, progs):
                page, ok = page_id(pt_r, p, n_r, num_pages)
                _score_page(kv_ptr, page, ok, q_r, qs_r, w_r, L_r, p, o_r, e_r,
                            offs_t, offs_i, offs_s, PAGE, PACKED, PAGE_BYTES, SCALE_OFFSET)


def _fail(message: str) -> None:
    raise KernelArgumentError(f"fp8_fp4_paged_mqa_logits: {message}")


def _check_q(q):
    if not isinstance(q, (tuple, list)) or len(q) != 2:
        _fail(f"q must be the pair (q_fp4, q_sf), got {type(q).__name__}")
    q_fp4, q_sf = q
    for name, value in (("q_fp4", q_fp4), ("q_sf", q_sf)):
        if not isinstance(value, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if q_fp4.dtype not in _Q_DTYPES:
        _fail(f"q_fp4 must be packed e2m1 bytes (int8), got {q_fp4.dtype}")
    if q_fp4.dim() != 4 or q_fp4.shape[1] != 1:
        _fail(f"q_fp4 must be [B, 1, H, 64] (next_n == 1), got shape {tuple(q_fp4.shape)}")
    batch, _, heads, packed = q_fp4.shape
    if packed != PACKED_BYTES:
        _fail(f"q_fp4 must hold 64 packed bytes a head (head_dim 128), got shape "
              f"{tuple(q_fp4.shape)}")
    if heads not in HEADS:
        _fail(f"number of index heads must be 16, 32, 64 or 128, got {heads}")
    if not q_fp4.is_contiguous():
        _fail("q_fp4 must be contiguous")
    if q_sf.dtype != torch.int32:
        _fail(f"q_sf must be int32 (four ue8m0 exponents), got {q_sf.dtype}")
    if tuple(q_sf.shape) != (batch, 1, heads):
        _fail(f"q_sf must be [B, 1, H] = {(batch, 1, heads)}, got {tuple(q_sf.shape)}")
    if not q_sf.is_contiguous():
        _fail("q_sf must be contiguous")
    if q_sf.device != q_fp4.device:
        _fail(f"q_sf is on {q_sf.device} but q_fp4 is on {q_fp4.device}")
    return q_fp4, q_sf, batch, heads


def _check_kv(kv_cache) -> torch.Tensor:
    if not isinstance(kv_cache, torch.Tensor):
        _fail(f"kv_cache must be a torch.Tensor, got {type(kv_cache).__name__}")
    if kv_cache.dtype != torch.uint8:
        _fail(f"kv_cache must be the uint8 index-K pool, got {kv_cache.dtype}")
    if kv_cache.dim() == 4:
        if kv_cache.shape[1] != PAGE_SIZE:
            _fail(f"page size must be {PAGE_SIZE}, got kv_cache shape {tuple(kv_cache.shape)}")
        if tuple(kv_cache.shape[2:]) != (1, SLOT_BYTES):
            _fail(f"kv_cache must be [num_pages, 64, 1, 68] (the FP4 layout), got "
                  f"{tuple(kv_cache.shape)}")
    elif kv_cache.dim() == 2:
        if kv_cache.shape[1] != PAGE_BYTES:
            _fail(f"flat kv_cache pages must be {PAGE_BYTES} bytes, got shape "
                  f"{tuple(kv_cache.shape)}")
    else:
        _fail(f"kv_cache must be [num_pages, 64, 1, 68] or [num_pages, {PAGE_BYTES}], got shape "
              f"{tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        _fail("kv_cache must be contiguous")
    if kv_cache.shape[0] < 1:
        _fail("kv_cache holds no pages")
    return kv_cache.view(kv_cache.shape[0], PAGE_BYTES)


def check_args(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits,
               tail=TAIL_EXACT, logits_dtype=torch.float32, indices=None):
    """Validate every argument on the host (shapes, dtypes, strides, devices; never values).

    Returns ``(q_fp4, q_sf, B, H, P, num_pages, lens_1d, kv_2d, max_context_len)``.
    """
    q_fp4, q_sf, batch, heads = _check_q(q)
    kv = _check_kv(kv_cache)
    for name, value in (("weights", weights), ("context_lens", context_lens),
                        ("block_table", block_table)):
        if not isinstance(value, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if clean_logits:
        _fail("clean_logits=True is not supported (DeepGEMM's paged logits refuse it too)")
    if tail not in TAIL_POLICIES:
        _fail(f"tail must be one of {TAIL_POLICIES}, got {tail!r}")
    if logits_dtype != torch.float32:
        _fail(f"logits_dtype must be torch.float32, got {logits_dtype}")
    if indices is not None:
        _fail("indices (DeepGEMM's varlen rows) is not supported; SGLang 0.5.23 never passes it")
    if weights.dtype != torch.float32:
        _fail(f"weights must be float32, got {weights.dtype}")
    if tuple(weights.shape) != (batch, heads):
        _fail(f"weights must be [B, H] = {(batch, heads)}, got {tuple(weights.shape)}")
    if not weights.is_contiguous():
        _fail("weights must be contiguous")
    lens, table_pages, max_context_len = check_rows_and_table(
        context_lens, block_table, max_context_len, batch, _fail,
        names=("context_lens", "block_table", "max_context_len"))
    device = q_fp4.device
    for name, value in (("kv_cache", kv_cache), ("weights", weights),
                        ("context_lens", context_lens), ("block_table", block_table)):
        if value.device != device:
            _fail(f"{name} is on {value.device} but q_fp4 is on {device}")
    if device.type != "cuda" and not _INTERPRET:
        _fail(f"tensors must be on a CUDA device, got {device} "
              "(set TRITON_INTERPRET=1 before importing to run on the CPU interpreter)")
    return q_fp4, q_sf, batch, heads, table_pages, kv.shape[0], lens, kv, max_context_len


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len, clean_logits=False, logits_dtype=torch.float32,
                             indices=None, *, tail: str = TAIL_EXACT) -> torch.Tensor:
    """fp32 ``[B, max_context_len]`` logits from the FP4 cache; ``-inf`` past ``L`` as ``tail`` says.

    DeepGEMM's argument order as SGLang 0.5.23 calls it (docs/sglang-contract.md §2.10):
    ``q = (q_fp4 [B,1,H,64] int8, q_sf [B,1,H] int32)``, ``kv_cache`` uint8 ``[pages,64,1,68]``,
    ``weights`` fp32 ``[B,H]``, ``context_lens`` int32 ``[B]`` or ``[B,1]`` (may be 0),
    ``block_table`` int32 ``[B,P]`` (entries past a row's length are never read),
    ``schedule_meta`` (DeepGEMM's schedule; ignored), ``max_context_len`` (``P*64`` in decode),
    ``clean_logits`` (must be False); ``logits_dtype`` float32 and ``indices`` None only.
    """
    del schedule_meta  # the grid is fixed by B and P; no schedule is needed
    q_fp4, q_sf, batch, heads, table_pages, num_pages, lens, kv, msl = check_args(
        q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, tail,
        logits_dtype, indices)
    out = torch.empty((batch, msl), dtype=torch.float32, device=q_fp4.device)
    if batch == 0:
        return out
    if _fp8_entry.uses_row_tiles(batch, msl):
        tiles = -(-batch // _tiles.ROWS)
        launch_tiles(q_fp4, q_sf, kv, weights, lens, block_table, out, num_pages, msl,
                     _tiles.programs_per_tile(programs_per_row(
                         tiles, table_pages, q_fp4.device,
                         programs_per_sm=_fp8_entry.SHARED_ROWS_PROGRAMS_PER_SM, tail=tail)),
                     tail=tail)
        return out
    launch(q_fp4, q_sf, kv, weights, lens, block_table, out, num_pages, msl,
           programs_per_row(batch, table_pages, q_fp4.device, tail=tail), tail=tail)
    return out


def fp8_fp4_paged_mqa_logits_for_sglang(q, kv_cache, weights, context_lens, block_table,
                                        schedule_meta, max_context_len, clean_logits=False,
                                        logits_dtype=torch.float32, indices=None):
    """What the SGLang plugin installs: DeepGEMM's arguments, the ``"skip"`` tail policy.

    SGLang's top-k paths bound every row by its length (docs/sglang-contract.md §2.7), and
    DeepGEMM, the stock implementation here, leaves the tail unwritten too.
    """
    return fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
                                    schedule_meta, max_context_len, clean_logits, logits_dtype,
                                    indices, tail=TAIL_SKIP)


def launch(q_fp4, q_sf, kv_pages, weights, lens_1d, block_table, out, num_pages, max_seq_len,
           progs_per_row, num_warps=NUM_WARPS, num_stages=NUM_STAGES, tail=TAIL_EXACT,
           direct=DIRECT):
    """Launch on already-checked arguments (the benchmark uses this to sweep configurations)."""
    batch, _, heads, _ = q_fp4.shape
    _fp4_logits_kernel[(batch, progs_per_row)](
        q_fp4, q_sf, kv_pages, weights, lens_1d, block_table, out,
        lens_1d.stride(0), block_table.stride(0), num_pages, max_seq_len, progs_per_row,
        H=heads, PAGE=PAGE_SIZE, PACKED=PACKED_BYTES, PAGE_BYTES=PAGE_BYTES,
        SCALE_OFFSET=SCALE_OFFSET, FILL=FILL_BLOCK, EXACT_TAIL=tail == TAIL_EXACT, DIRECT=direct,
        num_warps=num_warps, num_stages=num_stages,
    )


def launch_tiles(q_fp4, q_sf, kv_pages, weights, lens_1d, block_table, out, num_pages,
                 max_seq_len, progs, num_warps=NUM_WARPS, num_stages=TILE_NUM_STAGES,
                 tail=TAIL_EXACT, rows=_tiles.ROWS, check=_tiles.CHECK):
    """The row-tile kernel on already-checked arguments; ``progs`` is ``R`` for the
    ``(ceil(B/rows), R)`` grid (``indexer_tiles.programs_per_tile``)."""
    batch, _, heads, _ = q_fp4.shape
    _fp4_shared_rows_kernel[(-(-batch // rows), progs)](
        q_fp4, q_sf, kv_pages, weights, lens_1d, block_table, out,
        lens_1d.stride(0), block_table.stride(0), num_pages, max_seq_len, batch, progs,
        ROWS=rows, H=heads, PAGE=PAGE_SIZE, PACKED=PACKED_BYTES, PAGE_BYTES=PAGE_BYTES,
        SCALE_OFFSET=SCALE_OFFSET, FILL=FILL_BLOCK, EXACT_TAIL=tail == TAIL_EXACT, CHECK=check,
        num_warps=num_warps, num_stages=num_stages,
    )
