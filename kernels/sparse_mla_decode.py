"""Tensor-core sparse-MLA decode for DeepSeek-V4 on sm_120 (and sm_90): one fused Triton launch.

Drop-in for SGLang 0.5.23's ``flash_mla_with_kvcache_sm120`` (keyword arguments only, docs/sglang-contract.md §4.2)::

    out, lse = flash_mla_with_kvcache_sm120(q=, k_cache=, head_dim_v=512, softmax_scale=,
                                            indices=, topk_length=, attn_sink=,
                                            extra_k_cache=, extra_indices_in_kvcache=,
                                            extra_topk_length=)

Maths (docs/sglang-contract.md §4.4), per token ``t`` and head ``h``, over the valid SWA entries then the valid extra
(c4 / c128) entries, V = K over all 512 dims::

    s_j = softmax_scale * <q[t,h], kv_j>;  out = sum_j e^(s_j-m) kv_j / (sum_j e^(s_j-m) + e^(sink_h-m))

An entry ``j`` is valid when ``j < length`` (read in the kernel from ``topk_length`` /
``extra_topk_length``), ``idx >= 0`` and ``idx < num_pages * page_size`` (a bad slot id is
skipped, never read). A row with no valid entry gives 0. ``lse`` is ``[T, H, 1]`` float32, the
natural-log sum-exp *without* the sink (``-inf`` for empty rows); SGLang does not consume it.

Design
------
* Grid ``(T, ceil(H / BLOCK_H), NUM_SPLITS)``. The ``BLOCK_H`` heads of one token share every KV
  step: ``BLOCK_N`` KV rows are gathered and dequantised once (fp8 * 2^(e-127) for dims
  [0,448), bf16 rope for [448,512), exact in bf16) and used for ``S = Q Kᵀ`` and ``O += P V``
  through ``tl.dot`` (fp32 accumulation). Two kernels share the addressing helpers:

  - *tiled* (sm_120, H <= 32): the row is eight ``[BLOCK_N, 64]`` tiles (7 fp8 + rope), each a
    16-byte-vector gather; ``S = Σ_k Q_k K_kᵀ`` and eight ``[BLOCK_H, 64]`` accumulators, so
    nothing is reshaped. mma.sync. The next step's bytes and the step after's indices are
    loaded before the current step is computed (register double-buffering).
  - *wide* (sm_90, H > 32): one ``[BLOCK_N, 512]`` tile, so each step is two 64-row wgmma
    (eight chained 64-wide ones serialise on their waits). Indices one step ahead; the
    gathers go through Triton's cp.async pipeline.
* Both scopes form one virtual sequence ``[valid SWA | valid extra]`` whose length is read on the
  device; one loop walks it (a step may straddle the scopes: each row picks its cache through
  an int64 byte offset from ``kv_ptr``, so the 16-byte alignment the vector loads need is
  kept). Split ``s`` takes the ``s``-th BLOCK_N-aligned chunk, so work follows the valid
  lengths, not the index widths (a c128 row of width 8256 with 1024 valid slots costs 1024).
* ``NUM_SPLITS`` and the grid depend only on (T, H, widths, SM count): graph-safe. Splits fill
  one wave of programs; with one split the sink is applied in the epilogue, otherwise each
  split writes ``(o/l in bf16, log2 l + m)`` to scratch and a combine launch merges the splits
  and applies the sink (every split of 16 heads x BLOCK_D dims a program, the split loop
  unrolled so all loads are in flight at once). Calls of at most ``SMALL_CALL_TOKENS`` tokens
  use 16-head, 32-row programs (many one-step splits: latency, not throughput); calls of at most
  ``PDL_MAX_TOKENS`` launch both kernels with programmatic dependent launch (sm_90+), so the
  combine's launch overlaps the main kernel.
* Heads ``h >= H`` are masked (q loads 0, nothing stored); NaN garbage in a padded head stays in
  its own row of the MMAs and never reaches another head.
* ``T > SM120_DECODE_MAX_TOKENS`` (prefill-sized calls) is delegated to the float32 torch
  reference in :mod:`dsv4kit.kernels.sparse_mla_reference` (logged once): correct but slow.

The dot operand dtype is a constexpr: bf16 on the GPU; Triton's CPU interpreter computes bf16
``tl.dot`` wrongly, so under ``TRITON_INTERPRET=1`` the default is float32.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from dsv4kit.kernels.errors import KernelArgumentError
from dsv4kit.kernels.sparse_mla_reference import HEAD_DIM, TOKEN_BYTES, as_bytes, sparse_mla_reference

logger = logging.getLogger(__name__)

SM120_DECODE_MAX_TOKENS = 64
MAX_HEADS = 64
MAX_SPLITS = 32
COMBINE_BLOCK_H = 16
COMBINE_BLOCK_D = 128
SMALL_CALL_TOKENS = 2  # calls up to this many tokens get the small-program tiles (default_config)
PDL_MAX_TOKENS = 4  # calls up to this many tokens launch with programmatic dependent launch
LOG2E = 1.4426950408889634

_DOT_DTYPES = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}


@dataclass(frozen=True)
class DecodeConfig:
    block_h: int = 32
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 1
    # 1: issue step i+1's loads (registers) before computing step i; 2 (wide kernel): only the
    # indices one step ahead, gathers pipelined by Triton; 0: neither.
    prefetch: int = 1
    wide: bool = False  # one [BLOCK_N, 512] KV tile and two dots a step instead of 8 + 8 tiles
    # Programmatic dependent launch (sm_90+): None = on for CUDA devices of sm_90 and later
    # unless DSV4KIT_SPARSE_MLA_PDL=0; never in the interpreter.
    pdl: Optional[bool] = None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------

@triton.jit
def _load_idx(idx_row, stride_ij, ex_row, stride_ej, j, hi, n_swa, HAS_EXTRA: tl.constexpr):
    """Slot ids of virtual entries ``j`` (``[valid SWA | valid extra]``); -1 past ``hi``."""
    in_range = j < hi
    if HAS_EXTRA:
        is_swa = j < n_swa
        idx_s = tl.load(idx_row + j * stride_ij, mask=in_range & is_swa, other=-1)
        idx_e = tl.load(ex_row + (j - n_swa) * stride_ej, mask=in_range & (j >= n_swa), other=-1)
        idx = tl.where(is_swa, idx_s, idx_e)
    else:
        idx = tl.load(idx_row + j * stride_ij, mask=in_range, other=-1)
    return idx


@triton.jit
def _row_offsets(idx, j, n_swa, kv_num_slots, kv_page_stride, ex_delta, ex_num_slots, ex_page_stride,
                 PS: tl.constexpr, EX_PS: tl.constexpr, HAS_EXTRA: tl.constexpr):
    """(valid, byte offset of the row data, byte offset of its scale word), both from ``kv_ptr``.

    V4 bytes (docs/sglang-contract.md §4.3): the row at ``page*stride + off*576``, its 8 ue8m0 scale bytes at
    ``page*stride + ps*576 + off*8``. The extra cache is addressed from ``kv_ptr`` too, through
    ``ex_delta`` (its base minus ``kv_ptr``, a multiple of 16): a select between two int64
    offsets keeps the 16-byte alignment the vectorised loads need (a pointer select loses it).
    """
    if HAS_EXTRA:
        is_swa = j < n_swa
        valid = (idx >= 0) & (idx < tl.where(is_swa, kv_num_slots, ex_num_slots))
        slot = tl.where(valid, idx, 0).to(tl.int64)
        page_s = slot // PS
        off_s = slot - page_s * PS
        page_e = slot // EX_PS
        off_e = slot - page_e * EX_PS
        base = tl.where(is_swa, page_s * kv_page_stride, ex_delta + page_e * ex_page_stride)
        data = base + tl.where(is_swa, off_s * 576, off_e * 576)
        scale = base + tl.where(is_swa, PS * 576 + off_s * 8, EX_PS * 576 + off_e * 8)
    else:
        valid = (idx >= 0) & (idx < kv_num_slots)
        slot = tl.where(valid, idx, 0).to(tl.int64)
        page_s = slot // PS
        off_s = slot - page_s * PS
        base = page_s * kv_page_stride
        data = base + off_s * 576
        scale = base + PS * 576 + off_s * 8
    return valid, tl.multiple_of(data, 16), tl.multiple_of(scale, 8)


@triton.jit
def _load_rows(kv_ptr, valid, data, scale):
    """Raw bytes of the gathered rows: the scale word and the 7 fp8 tiles + the bf16 rope tile.

    Each tile is one contiguous 64-byte (nope) or 128-byte (rope) run per row: vectorised loads.
    Invalid rows load zeros, so a NaN fp8 byte in an unused slot never reaches P V.
    """
    c = tl.arange(0, 64)
    row = kv_ptr + data
    m = valid[:, None]
    sw = tl.load((kv_ptr + scale).to(tl.pointer_type(tl.int64), bitcast=True), mask=valid, other=0)
    r0 = tl.load(row[:, None] + c[None, :], mask=m, other=0)
    r1 = tl.load(row[:, None] + (64 + c)[None, :], mask=m, other=0)
    r2 = tl.load(row[:, None] + (128 + c)[None, :], mask=m, other=0)
    r3 = tl.load(row[:, None] + (192 + c)[None, :], mask=m, other=0)
    r4 = tl.load(row[:, None] + (256 + c)[None, :], mask=m, other=0)
    r5 = tl.load(row[:, None] + (320 + c)[None, :], mask=m, other=0)
    r6 = tl.load(row[:, None] + (384 + c)[None, :], mask=m, other=0)
    rope_ptr = (row + 448).to(tl.pointer_type(tl.bfloat16), bitcast=True)
    rp = tl.load(rope_ptr[:, None] + c[None, :], mask=m, other=0.0)
    return sw, r0, r1, r2, r3, r4, r5, r6, rp


@triton.jit
def _dequant(raw, scale_word, TILE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """fp8 tile * 2^(e-127), exact in bf16 (8 exponent bits)."""
    e = ((scale_word >> (8 * TILE)) & 0xFF).to(tl.float32)
    scale = tl.exp2(e - 127.0).to(DOT_DTYPE)
    return raw.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE) * scale[:, None]


@triton.jit
def _q_tile(q_row_ptr, stride_qd, head_ok, TILE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    c = tl.arange(0, 64)
    return tl.load(q_row_ptr[:, None] + (TILE * 64 + c)[None, :] * stride_qd, mask=head_ok[:, None],
                   other=0.0).to(DOT_DTYPE)


@triton.jit
def _store_tile(out_row_ptr, head_ok, val, TILE: tl.constexpr):
    c = tl.arange(0, 64)
    tl.store(out_row_ptr[:, None] + (TILE * 64 + c)[None, :], val.to(out_row_ptr.dtype.element_ty),
             mask=head_ok[:, None])


@triton.jit
def _valid_lengths(len_ptr, width, ex_len_ptr, ex_width, t, HAS_EXTRA: tl.constexpr):
    """(valid SWA entries, valid SWA + extra entries) of token ``t``: device values (graph-safe),
    clamped to the index widths."""
    n_swa = tl.minimum(tl.maximum(tl.load(len_ptr + t), 0), width)
    n_ex = 0
    if HAS_EXTRA:
        n_ex = tl.minimum(tl.maximum(tl.load(ex_len_ptr + t), 0), ex_width)
    return n_swa, n_swa + n_ex


@triton.jit
def _split_chunk(total, num_splits, BLOCK_N: tl.constexpr):
    """Virtual entries per split (a multiple of BLOCK_N): split ``s`` takes ``[s*chunk, (s+1)*chunk)``.
    The main kernels and the combine (which reads only the splits that got work) must agree."""
    return tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N


@triton.jit
def _epilogue(l_i, m_i, t, sp, heads, head_ok, H, num_splits, sink_ptr, out_ptr, stride_ot, stride_oh, lse_ptr,
              part_o_ptr, part_lse_ptr, SPLIT: tl.constexpr):
    """``(inv, o_row)``: the factor that normalises each head's accumulator and the pointers to the
    start of each head's 512-dim output row. With ``SPLIT``: this split's partial, ``o / l`` (the
    combine applies the sink), and its base-2 log-sum-exp is stored; otherwise the sink enters the
    denominator, ``o / (l + e^(sink - m))``, and the natural-log lse without the sink is stored."""
    has_any = l_i > 0.0
    l_safe = tl.where(has_any, l_i, 1.0)
    if SPLIT:
        row = (t * num_splits + sp).to(tl.int64) * H + heads
        tl.store(part_lse_ptr + row, tl.where(has_any, m_i + tl.log2(l_safe), float("-inf")), mask=head_ok)
        inv = tl.where(has_any, 1.0 / l_safe, 0.0)
        o_row = part_o_ptr + row * 512
    else:
        sink2 = tl.load(sink_ptr + heads, mask=head_ok, other=0.0) * 1.4426950408889634
        m_safe = tl.where(has_any, m_i, 0.0)
        denom = l_i + tl.exp2(sink2 - m_safe)
        inv = tl.where(has_any, 1.0 / tl.where(has_any, denom, 1.0), 0.0)
        lse = tl.where(has_any, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + t * H + heads, lse, mask=head_ok)
        o_row = out_ptr + t.to(tl.int64) * stride_ot + heads * stride_oh
    return inv, o_row


@triton.jit
def _sparse_mla_decode_kernel(
    q_ptr, stride_qt, stride_qh, stride_qd,
    kv_ptr, kv_page_stride, kv_num_slots,
    idx_ptr, stride_it, stride_ij, len_ptr, width,
    ex_delta, ex_page_stride, ex_num_slots,
    ex_idx_ptr, stride_et, stride_ej, ex_len_ptr, ex_width,
    sink_ptr, out_ptr, stride_ot, stride_oh, lse_ptr,
    part_o_ptr, part_lse_ptr,
    H, num_splits, qk_scale_log2,
    PS: tl.constexpr, EX_PS: tl.constexpr, HAS_EXTRA: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PREFETCH: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    if USE_PDL:
        # Programmatic dependent launch: this launch overlaps the previous kernel's tail;
        # nothing is read before its stores are visible. The combine may launch at once
        # (it waits for this grid to finish before reading the partials).
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H

    # q as 8 tiles of 64 dims (7 nope + rope): S = sum_k Q_k K_k^T, O_k += P V_k, so no
    # [BLOCK_N, 512] tensor is ever reshaped or re-laid out.
    q_row = q_ptr + t.to(tl.int64) * stride_qt + heads * stride_qh
    q0 = _q_tile(q_row, stride_qd, head_ok, 0, DOT_DTYPE)
    q1 = _q_tile(q_row, stride_qd, head_ok, 1, DOT_DTYPE)
    q2 = _q_tile(q_row, stride_qd, head_ok, 2, DOT_DTYPE)
    q3 = _q_tile(q_row, stride_qd, head_ok, 3, DOT_DTYPE)
    q4 = _q_tile(q_row, stride_qd, head_ok, 4, DOT_DTYPE)
    q5 = _q_tile(q_row, stride_qd, head_ok, 5, DOT_DTYPE)
    q6 = _q_tile(q_row, stride_qd, head_ok, 6, DOT_DTYPE)
    q7 = _q_tile(q_row, stride_qd, head_ok, 7, DOT_DTYPE)

    n_swa, total = _valid_lengths(len_ptr, width, ex_len_ptr, ex_width, t, HAS_EXTRA)
    chunk = _split_chunk(total, num_splits, BLOCK_N)
    v_lo = tl.minimum(sp * chunk, total)
    v_hi = tl.minimum(v_lo + chunk, total)

    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    ex_row = ex_idx_ptr + t.to(tl.int64) * stride_et
    a0 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a1 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a2 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a3 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a4 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a5 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a6 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a7 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    # One loop over this split's part of the virtual sequence [valid SWA | valid extra]; a tile
    # may straddle the two scopes (each row picks its cache, page size and index row).
    # PREFETCH: the loads of tile i+1 and the indices of tile i+2 are issued before tile i is
    # computed (register double-buffering), so the idx -> address -> gather chain overlaps
    # the MMAs instead of stalling every step.
    ar = tl.arange(0, BLOCK_N)
    if PREFETCH:
        idx_c = _load_idx(idx_row, stride_ij, ex_row, stride_ej, v_lo + ar, v_hi, n_swa, HAS_EXTRA)
        valid_c, data_c, scale_c = _row_offsets(idx_c, v_lo + ar, n_swa, kv_num_slots, kv_page_stride,
                                                ex_delta, ex_num_slots, ex_page_stride, PS, EX_PS, HAS_EXTRA)
        sw_c, r0, r1, r2, r3, r4, r5, r6, rp = _load_rows(kv_ptr, valid_c, data_c, scale_c)
        idx_n = _load_idx(idx_row, stride_ij, ex_row, stride_ej, v_lo + BLOCK_N + ar, v_hi, n_swa, HAS_EXTRA)
    for start in range(v_lo, v_hi, BLOCK_N):
        if PREFETCH:
            jn = start + BLOCK_N + ar
            valid_n, data_n, scale_n = _row_offsets(idx_n, jn, n_swa, kv_num_slots, kv_page_stride, ex_delta,
                                                    ex_num_slots, ex_page_stride, PS, EX_PS, HAS_EXTRA)
            sw_n, n0, n1, n2, n3, n4, n5, n6, np_ = _load_rows(kv_ptr, valid_n, data_n, scale_n)
            idx_n = _load_idx(idx_row, stride_ij, ex_row, stride_ej, jn + BLOCK_N, v_hi, n_swa, HAS_EXTRA)
        else:
            j = start + ar
            idx_c = _load_idx(idx_row, stride_ij, ex_row, stride_ej, j, v_hi, n_swa, HAS_EXTRA)
            valid_c, data_c, scale_c = _row_offsets(idx_c, j, n_swa, kv_num_slots, kv_page_stride, ex_delta,
                                                    ex_num_slots, ex_page_stride, PS, EX_PS, HAS_EXTRA)
            sw_c, r0, r1, r2, r3, r4, r5, r6, rp = _load_rows(kv_ptr, valid_c, data_c, scale_c)

        k0 = _dequant(r0, sw_c, 0, DOT_DTYPE)
        k1 = _dequant(r1, sw_c, 1, DOT_DTYPE)
        k2 = _dequant(r2, sw_c, 2, DOT_DTYPE)
        k3 = _dequant(r3, sw_c, 3, DOT_DTYPE)
        k4 = _dequant(r4, sw_c, 4, DOT_DTYPE)
        k5 = _dequant(r5, sw_c, 5, DOT_DTYPE)
        k6 = _dequant(r6, sw_c, 6, DOT_DTYPE)
        k7 = rp.to(DOT_DTYPE)

        s = tl.dot(q0, tl.trans(k0))
        s = tl.dot(q1, tl.trans(k1), s)
        s = tl.dot(q2, tl.trans(k2), s)
        s = tl.dot(q3, tl.trans(k3), s)
        s = tl.dot(q4, tl.trans(k4), s)
        s = tl.dot(q5, tl.trans(k5), s)
        s = tl.dot(q6, tl.trans(k6), s)
        s = tl.dot(q7, tl.trans(k7), s)
        s = tl.where(valid_c[None, :], s * qk_scale_log2, float("-inf"))  # log2 domain
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        pd = p.to(DOT_DTYPE)
        a0 = tl.dot(pd, k0, a0 * alpha[:, None])
        a1 = tl.dot(pd, k1, a1 * alpha[:, None])
        a2 = tl.dot(pd, k2, a2 * alpha[:, None])
        a3 = tl.dot(pd, k3, a3 * alpha[:, None])
        a4 = tl.dot(pd, k4, a4 * alpha[:, None])
        a5 = tl.dot(pd, k5, a5 * alpha[:, None])
        a6 = tl.dot(pd, k6, a6 * alpha[:, None])
        a7 = tl.dot(pd, k7, a7 * alpha[:, None])
        if PREFETCH:
            valid_c = valid_n
            sw_c = sw_n
            r0 = n0
            r1 = n1
            r2 = n2
            r3 = n3
            r4 = n4
            r5 = n5
            r6 = n6
            rp = np_

    inv, o_row = _epilogue(l_i, m_i, t, sp, heads, head_ok, H, num_splits, sink_ptr, out_ptr, stride_ot,
                           stride_oh, lse_ptr, part_o_ptr, part_lse_ptr, SPLIT)
    _store_tile(o_row, head_ok, a0 * inv[:, None], 0)
    _store_tile(o_row, head_ok, a1 * inv[:, None], 1)
    _store_tile(o_row, head_ok, a2 * inv[:, None], 2)
    _store_tile(o_row, head_ok, a3 * inv[:, None], 3)
    _store_tile(o_row, head_ok, a4 * inv[:, None], 4)
    _store_tile(o_row, head_ok, a5 * inv[:, None], 5)
    _store_tile(o_row, head_ok, a6 * inv[:, None], 6)
    _store_tile(o_row, head_ok, a7 * inv[:, None], 7)


@triton.jit
def _load_rows_wide(kv_ptr, valid, data, scale):
    """Raw bytes of the gathered rows as ``[BLOCK_N, 8, 64]`` fp8 (tile 7 not loaded), the bf16
    rope ``[BLOCK_N, 64]`` and the scale word ``[BLOCK_N]``."""
    tiles = tl.arange(0, 8)
    c = tl.arange(0, 64)
    row = kv_ptr + data
    sw = tl.load((kv_ptr + scale).to(tl.pointer_type(tl.int64), bitcast=True), mask=valid, other=0)
    nope = tl.load(row[:, None, None] + (tiles * 64)[None, :, None] + c[None, None, :],
                   mask=valid[:, None, None] & (tiles < 7)[None, :, None], other=0)
    rope_ptr = (row + 448).to(tl.pointer_type(tl.bfloat16), bitcast=True)
    rp = tl.load(rope_ptr[:, None] + c[None, :], mask=valid[:, None], other=0.0)
    return sw, nope, rp


@triton.jit
def _dequant_wide(sw, nope, rp, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """``[BLOCK_N, 512]`` KV (dim = tile * 64 + c): fp8 * 2^(e-127) for tiles 0..6, rope as tile 7."""
    tiles = tl.arange(0, 8)
    e = ((sw[:, None] >> (8 * tiles)[None, :].to(tl.int64)) & 0xFF).to(tl.float32)
    scale = tl.exp2(e - 127.0).to(DOT_DTYPE)  # [BLOCK_N, 8]
    deq = nope.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE) * scale[:, :, None]
    kv3 = tl.where((tiles < 7)[None, :, None], deq, rp.to(DOT_DTYPE)[:, None, :])
    return tl.reshape(kv3, [BLOCK_N, 512])


@triton.jit
def _sparse_mla_decode_wide_kernel(
    q_ptr, stride_qt, stride_qh, stride_qd,
    kv_ptr, kv_page_stride, kv_num_slots,
    idx_ptr, stride_it, stride_ij, len_ptr, width,
    ex_delta, ex_page_stride, ex_num_slots,
    ex_idx_ptr, stride_et, stride_ej, ex_len_ptr, ex_width,
    sink_ptr, out_ptr, stride_ot, stride_oh, lse_ptr,
    part_o_ptr, part_lse_ptr,
    H, num_splits, qk_scale_log2,
    PS: tl.constexpr, EX_PS: tl.constexpr, HAS_EXTRA: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PREFETCH: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """The same maths with one ``[BLOCK_N, 512]`` KV tile: one QK^T and one PV dot a step (for
    sm_90's wgmma, where eight chained 64-wide dots serialise on their waits)."""
    if USE_PDL:
        # Programmatic dependent launch: this launch overlaps the previous kernel's tail;
        # nothing is read before its stores are visible. The combine may launch at once
        # (it waits for this grid to finish before reading the partials).
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    cols = tl.arange(0, 512)
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + cols[None, :] * stride_qd,
                mask=head_ok[:, None], other=0.0).to(DOT_DTYPE)

    n_swa, total = _valid_lengths(len_ptr, width, ex_len_ptr, ex_width, t, HAS_EXTRA)
    chunk = _split_chunk(total, num_splits, BLOCK_N)
    v_lo = tl.minimum(sp * chunk, total)
    v_hi = tl.minimum(v_lo + chunk, total)

    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    ex_row = ex_idx_ptr + t.to(tl.int64) * stride_et
    acc = tl.zeros([BLOCK_H, 512], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    ar = tl.arange(0, BLOCK_N)
    if PREFETCH == 1:
        idx_c = _load_idx(idx_row, stride_ij, ex_row, stride_ej, v_lo + ar, v_hi, n_swa, HAS_EXTRA)
        valid_c, data_c, scale_c = _row_offsets(idx_c, v_lo + ar, n_swa, kv_num_slots, kv_page_stride,
                                                ex_delta, ex_num_slots, ex_page_stride, PS, EX_PS, HAS_EXTRA)
        sw_c, nope_c, rp_c = _load_rows_wide(kv_ptr, valid_c, data_c, scale_c)
        idx_n = _load_idx(idx_row, stride_ij, ex_row, stride_ej, v_lo + BLOCK_N + ar, v_hi, n_swa, HAS_EXTRA)
    elif PREFETCH == 2:
        idx_c = _load_idx(idx_row, stride_ij, ex_row, stride_ej, v_lo + ar, v_hi, n_swa, HAS_EXTRA)
    for start in range(v_lo, v_hi, BLOCK_N):
        if PREFETCH == 2:
            # Indices one step ahead; the gathers of this step are left to Triton's cp.async
            # pipeline, which can then issue them a whole step early.
            j = start + ar
            idx_n = _load_idx(idx_row, stride_ij, ex_row, stride_ej, j + BLOCK_N, v_hi, n_swa, HAS_EXTRA)
            valid_c, data_c, scale_c = _row_offsets(idx_c, j, n_swa, kv_num_slots, kv_page_stride, ex_delta,
                                                    ex_num_slots, ex_page_stride, PS, EX_PS, HAS_EXTRA)
            sw_c, nope_c, rp_c = _load_rows_wide(kv_ptr, valid_c, data_c, scale_c)
            idx_c = idx_n
        elif PREFETCH == 1:
            jn = start + BLOCK_N + ar
            valid_n, data_n, scale_n = _row_offsets(idx_n, jn, n_swa, kv_num_slots, kv_page_stride, ex_delta,
                                                    ex_num_slots, ex_page_stride, PS, EX_PS, HAS_EXTRA)
            sw_n, nope_n, rp_n = _load_rows_wide(kv_ptr, valid_n, data_n, scale_n)
            idx_n = _load_idx(idx_row, stride_ij, ex_row, stride_ej, jn + BLOCK_N, v_hi, n_swa, HAS_EXTRA)
        else:
            j = start + ar
            idx_c = _load_idx(idx_row, stride_ij, ex_row, stride_ej, j, v_hi, n_swa, HAS_EXTRA)
            valid_c, data_c, scale_c = _row_offsets(idx_c, j, n_swa, kv_num_slots, kv_page_stride, ex_delta,
                                                    ex_num_slots, ex_page_stride, PS, EX_PS, HAS_EXTRA)
            sw_c, nope_c, rp_c = _load_rows_wide(kv_ptr, valid_c, data_c, scale_c)
        kv = _dequant_wide(sw_c, nope_c, rp_c, BLOCK_N, DOT_DTYPE)
        s = tl.dot(q, tl.trans(kv))
        s = tl.where(valid_c[None, :], s * qk_scale_log2, float("-inf"))  # log2 domain
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        acc = tl.dot(p.to(DOT_DTYPE), kv, acc * alpha[:, None])
        if PREFETCH == 1:
            valid_c = valid_n
            sw_c = sw_n
            nope_c = nope_n
            rp_c = rp_n

    inv, o_row = _epilogue(l_i, m_i, t, sp, heads, head_ok, H, num_splits, sink_ptr, out_ptr, stride_ot,
                           stride_oh, lse_ptr, part_o_ptr, part_lse_ptr, SPLIT)
    tl.store(o_row[:, None] + cols[None, :], (acc * inv[:, None]).to(o_row.dtype.element_ty), mask=head_ok[:, None])


@triton.jit
def _combine_splits_kernel(
    part_o_ptr, part_lse_ptr, sink_ptr, out_ptr, stride_ot, stride_oh, lse_ptr,
    len_ptr, width, ex_len_ptr, ex_width, H, num_splits,
    HAS_EXTRA: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLITS_P2: tl.constexpr = 32, USE_PDL: tl.constexpr = False,
):
    """Merge the split partials of one (token, head block, BLOCK_D dims) and apply the sink.

    The loop over the ``SPLITS_P2`` split slots is unrolled at compile time and masked by the
    number of splits that received work, so every split's loads are independent and in flight
    together (a loop with a device bound waits for each split's loads in turn); the tiles keep
    one layout, so nothing goes through shared memory. With ``USE_PDL`` the launch overlaps the
    main kernel (programmatic dependent launch); ``gdc_wait`` returns once the main kernel has
    finished and its stores are visible.
    """
    t = tl.program_id(0)
    hb = tl.program_id(1)
    db = tl.program_id(2)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    cols = db * BLOCK_D + tl.arange(0, BLOCK_D)
    # Only the splits that received work (same chunking as the main kernel) are read.
    _, total = _valid_lengths(len_ptr, width, ex_len_ptr, ex_width, t, HAS_EXTRA)
    chunk = tl.maximum(_split_chunk(total, num_splits, BLOCK_N), 1)
    active = tl.minimum(tl.cdiv(total, chunk), num_splits)

    base = (t * num_splits).to(tl.int64) * H + heads
    zero = tl.zeros([BLOCK_H], dtype=tl.int32)
    big = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for s in tl.static_range(SPLITS_P2):
        big = tl.maximum(big, tl.load(part_lse_ptr + base + s * H, mask=head_ok & (zero + s < active),
                                      other=float("-inf")))
    has_any = big > float("-inf")
    big_safe = tl.where(has_any, big, 0.0)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    wsum = tl.zeros([BLOCK_H], dtype=tl.float32)
    for s in tl.static_range(SPLITS_P2):
        ok = head_ok & (zero + s < active)
        w = tl.exp2(tl.load(part_lse_ptr + base + s * H, mask=ok, other=float("-inf")) - big_safe)
        o = tl.load(part_o_ptr + (base + s * H)[:, None] * 512 + cols[None, :], mask=ok[:, None], other=0.0)
        acc += w[:, None] * o.to(tl.float32)
        wsum += w
    sink2 = tl.load(sink_ptr + heads, mask=head_ok, other=0.0) * 1.4426950408889634
    denom = wsum + tl.exp2(sink2 - big_safe)
    res = tl.where(has_any[:, None], acc / tl.where(has_any, denom, 1.0)[:, None], 0.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + cols[None, :],
             res.to(tl.bfloat16), mask=head_ok[:, None])
    if db == 0:
        lse = tl.where(has_any, (big_safe + tl.log2(tl.where(has_any, wsum, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        tl.store(lse_ptr + t * H + heads, lse, mask=head_ok)


#: The decode kernels (narrow and wide), for tools that read what Triton compiled of them.
DECODE_KERNELS = (_sparse_mla_decode_kernel, _sparse_mla_decode_wide_kernel)


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------

_SM_COUNT: dict = {}
_LOGGED_DELEGATION = False


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: small, so that the split path is exercised
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SM_COUNT:
        _SM_COUNT[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SM_COUNT[key]


def device_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of the device; the interpreter (CPU) uses sm_120's tile shapes."""
    if device.type != "cuda":
        return (12, 0)
    return torch.cuda.get_device_capability(device)


TILES_ENV = "DSV4KIT_SPARSE_MLA_TILES"
PDL_ENV = "DSV4KIT_SPARSE_MLA_PDL"


def use_pdl(config: "DecodeConfig", device: torch.device, tokens: int) -> bool:
    """Launch with programmatic dependent launch: CUDA sm_90+ only (``griddepcontrol``), never
    under the interpreter; ``config.pdl`` forces it, ``DSV4KIT_SPARSE_MLA_PDL=0`` turns it off.
    By default only calls of at most ``PDL_MAX_TOKENS`` tokens use it: there the launch gap is a
    visible part of the call (H200), while at T = 16 it measured slower (docs/attention.md)."""
    if device.type != "cuda" or interpreting() or device_capability(device) < (9, 0):
        return False
    if config.pdl is not None:
        return bool(config.pdl)
    if os.environ.get(PDL_ENV, "1").strip() == "0":
        return False
    return tokens <= PDL_MAX_TOKENS


def combine_tiles(num_splits: int, block_h: int) -> tuple[int, int, int]:
    """(SPLITS_P2, heads, dims) of a combine program: all splits' partials in one tile of about
    8K elements (64 a thread at 4 warps), so small T gets many programs reading in parallel."""
    splits_p2 = triton.next_power_of_2(max(1, num_splits))
    heads = min(block_h, COMBINE_BLOCK_H)
    dims = max(16, min(COMBINE_BLOCK_D, 8192 // (splits_p2 * heads)))
    return splits_p2, heads, dims


def _config_from_env() -> Optional[DecodeConfig]:
    """``DSV4KIT_SPARSE_MLA_TILES="BLOCK_H,BLOCK_N,WARPS,STAGES,PREFETCH,WIDE"`` (e.g. ``64,64,8,2,0,1``)
    overrides the per-architecture tiles, for tuning on a box without code edits."""
    text = os.environ.get(TILES_ENV, "").strip()
    if not text:
        return None
    try:
        bh, bn, warps, stages, prefetch, wide = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{TILES_ENV}={text!r}: expected six integers "
                         "BLOCK_H,BLOCK_N,WARPS,STAGES,PREFETCH,WIDE") from None
    if (bh not in (16, 32, 64) or bn not in (16, 32, 64) or warps not in (4, 8, 16) or not 1 <= stages <= 4
            or prefetch not in (0, 1, 2) or wide not in (0, 1) or (prefetch == 2 and not wide)):
        raise ValueError(f"{TILES_ENV}={text!r}: BLOCK_H and BLOCK_N must be 16/32/64, WARPS 4/8/16, "
                         "STAGES 1..4, PREFETCH 0/1/2 (2 only with WIDE), WIDE 0/1")
    return DecodeConfig(bh, bn, warps, stages, prefetch, bool(wide))


def default_config(num_heads: int, capability: tuple[int, int], tokens: Optional[int] = None) -> DecodeConfig:
    """Tile sizes per architecture and call size (AOT-checked by the tests; timed by
    ``bench_attention --sweep``).

    Calls of at most ``SMALL_CALL_TOKENS`` tokens (``tokens``; ``None`` means a large call), on
    any architecture: 16-head programs, ``BLOCK_N = 32``, 4 warps, register prefetch. A token's
    KV is then cut into many one-step splits over many small programs, so the call's latency is
    one short step plus the combine, not one 64-head, 64-row step (H200: see docs/attention.md).

    sm_120 (about 99 KB of shared memory a block, mma.sync only) and sm_90 with H <= 32:
    ``BLOCK_H = 32`` heads (16 for H <= 16), ``BLOCK_N = 32`` KV tokens a step as eight
    ``[32, 64]`` tiles, 8 warps, register prefetch of the next step's bytes and indices: about
    200 registers a thread, no spills, about 67 KB of shared memory (ptxas, sm_120a).

    sm_90 with H > 32 (227 KB, wgmma): ``BLOCK_H = 64`` so all heads of a token share one
    gathered, dequantised KV tile, one ``[64, 512]`` KV tile a step ("wide": two 64-row wgmma a
    step; eight chained 64-wide ones serialise on their waits), 8 warps, indices one step ahead
    and the gathers in Triton's 2-stage cp.async pipeline: 255 registers, no spills, about
    173 KB of shared memory (Triton 3.6). Fastest of the H200 sweep at T = 1, 16 and 64
    (docs/results/bench_attention_sweep_h200.json).
    ``DSV4KIT_SPARSE_MLA_TILES`` overrides both (see :func:`_config_from_env`).
    """
    env = _config_from_env()
    if env is not None:
        return env
    if tokens is not None and tokens <= SMALL_CALL_TOKENS:
        return DecodeConfig(block_h=16, block_n=32, num_warps=4, num_stages=1, prefetch=1)
    block_h = 16 if num_heads <= 16 else 32
    if capability[0] == 12 or capability < (9, 0) or num_heads <= 32:
        return DecodeConfig(block_h=block_h, block_n=32, num_warps=8 if block_h == 32 else 4, num_stages=1,
                            prefetch=1)
    return DecodeConfig(block_h=64, block_n=64, num_warps=8, num_stages=2, prefetch=2, wide=True)


def choose_num_splits(T: int, head_blocks: int, width_total: int, block_n: int, sm_count: int) -> int:
    """Splits per (token, head block), from shapes only (graph-safe).

    As many splits as fit whole in one wave (``sm_count // programs``): the measured kernel is
    latency-bound per program, so an idle SM costs more than the partials' traffic (a bf16
    ``[BLOCK_H, 512]`` partial per split, written once and read once by the combine launch).
    No split once the (token, head block) programs alone fill the SMs, and never more splits
    than ``BLOCK_N`` tiles in the index width.
    """
    programs = max(1, T * head_blocks)
    if programs >= sm_count:
        return 1
    max_useful = max(1, -(-width_total // block_n))
    return max(1, min(sm_count // programs, max_useful, MAX_SPLITS))


def _check_cache(name: str, cache: torch.Tensor, device: torch.device) -> int:
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(cache).__name__}")
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != TOKEN_BYTES:
        raise ValueError(f"{name} must be [num_pages, page_size, 1, {TOKEN_BYTES}] (V4 layout), "
                         f"got {tuple(cache.shape)}")
    if cache.element_size() != 1:
        raise ValueError(f"{name} must have a 1-byte dtype (uint8 or fp8 view), got {cache.dtype}")
    if cache.device != device:
        raise ValueError(f"{name} is on {cache.device}, q is on {device}")
    ps = cache.shape[1]
    if cache.stride(3) != 1:
        raise ValueError(f"{name} must have stride(3) == 1, got {cache.stride()}")
    if cache.stride(0) < ps * TOKEN_BYTES:
        raise ValueError(f"{name}.stride(0) = {cache.stride(0)} is smaller than a V4 page of "
                         f"{ps} tokens ({ps * TOKEN_BYTES} bytes)")
    # The kernel reads each token's 8 scale bytes as one int64 word and its rows as 16-byte
    # vectors: pages must start 16-byte aligned (SGLang's page sizes are multiples of 576).
    if cache.stride(0) % 16 or cache.data_ptr() % 16:
        raise ValueError(f"{name} pages must be 16-byte aligned: stride(0) = {cache.stride(0)}, "
                         f"data_ptr % 16 = {cache.data_ptr() % 16}")
    needed = cache.storage_offset() + (cache.shape[0] - 1) * cache.stride(0) + ps * TOKEN_BYTES
    have = cache.untyped_storage().nbytes()
    if cache.shape[0] > 0 and needed > have:
        raise ValueError(f"{name}: its {cache.shape[0]} pages need {needed} bytes of storage, "
                         f"the tensor's storage has {have}")
    return ps


def _check_index(name: str, idx: torch.Tensor, T: int, device: torch.device) -> None:
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(idx).__name__}")
    if idx.dim() != 3 or idx.shape[0] != T or idx.shape[1] != 1 or idx.shape[2] < 1:
        raise ValueError(f"{name} must be [T={T}, 1, width >= 1], got {tuple(idx.shape)}")
    if idx.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {idx.dtype}")
    if idx.device != device:
        raise ValueError(f"{name} is on {idx.device}, q is on {device}")


def _check_length(name: str, length: torch.Tensor, T: int, device: torch.device) -> None:
    if not isinstance(length, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(length).__name__}")
    if length.dim() != 1 or length.shape[0] != T or length.dtype != torch.int32:
        raise ValueError(f"{name} must be int32 [T={T}], got {length.dtype} {tuple(length.shape)}")
    if length.device != device:
        raise ValueError(f"{name} is on {length.device}, q is on {device}")


def check_arguments(q, k_cache, head_dim_v, softmax_scale, indices, topk_length, attn_sink,
                    extra_k_cache, extra_indices_in_kvcache, extra_topk_length) -> None:
    """Eager checks of shapes, dtypes, strides and devices (no device synchronisation)."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a tensor, got {type(q).__name__}")
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[3] != HEAD_DIM:
        raise ValueError(f"q must be [T, 1, H, {HEAD_DIM}], got {tuple(q.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"q must be bf16 (fp16/fp32 also accepted), got {q.dtype}")
    T, _, H, _ = q.shape
    if not 1 <= H <= MAX_HEADS:
        raise ValueError(f"q has {H} heads; this kernel supports 1..{MAX_HEADS}")
    if head_dim_v != HEAD_DIM:
        raise ValueError(f"head_dim_v must be {HEAD_DIM} (V = K), got {head_dim_v}")
    if isinstance(softmax_scale, torch.Tensor) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a Python float, got {type(softmax_scale).__name__}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    device = q.device
    _check_cache("k_cache", k_cache, device)
    _check_index("indices", indices, T, device)
    if topk_length is None:
        raise ValueError("topk_length is required (SGLang always passes it)")
    _check_length("topk_length", topk_length, T, device)
    if attn_sink is None:
        pass  # no sink (SGLang always passes one; its reference also accepts None)
    elif not isinstance(attn_sink, torch.Tensor) or attn_sink.dim() != 1 or attn_sink.shape[0] != H:
        raise ValueError(f"attn_sink must be a float32 tensor [H={H}], got "
                         f"{getattr(attn_sink, 'shape', type(attn_sink).__name__)}")
    if attn_sink is not None and (attn_sink.dtype != torch.float32 or attn_sink.device != device):
        raise ValueError(f"attn_sink must be float32 on {device}, got {attn_sink.dtype} on {attn_sink.device}")
    extras = (extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    if any(e is not None for e in extras):
        if any(e is None for e in extras):
            raise ValueError("extra_k_cache, extra_indices_in_kvcache and extra_topk_length must be "
                             "given together")
        _check_cache("extra_k_cache", extra_k_cache, device)
        _check_index("extra_indices_in_kvcache", extra_indices_in_kvcache, T, device)
        _check_length("extra_topk_length", extra_topk_length, T, device)


def flash_mla_with_kvcache_sm120(
    *, q: torch.Tensor, k_cache: torch.Tensor, head_dim_v: int, softmax_scale: float,
    indices: torch.Tensor, topk_length: torch.Tensor, attn_sink: Optional[torch.Tensor],
    extra_k_cache: Optional[torch.Tensor] = None, extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None, config: Optional[DecodeConfig] = None,
    num_splits: Optional[int] = None, dot_dtype: Optional[str] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-MLA decode; returns ``(out [T,1,H,512] bf16, lse [T,H,1] float32, no sink)``.

    ``config``, ``num_splits`` and ``dot_dtype`` ("bf16", "fp16", "fp32") are tuning/testing
    overrides; SGLang never passes them. Calls with ``T > SM120_DECODE_MAX_TOKENS`` go to the float32
    torch reference (logged once).
    """
    try:
        check_arguments(q, k_cache, head_dim_v, softmax_scale, indices, topk_length, attn_sink,
                        extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    except (ValueError, TypeError) as exc:
        raise KernelArgumentError(f"flash_mla_with_kvcache_sm120: {exc}") from None
    T, _, H, _ = q.shape
    device = q.device
    if T > SM120_DECODE_MAX_TOKENS:
        global _LOGGED_DELEGATION
        if not _LOGGED_DELEGATION:
            logger.warning("sparse-MLA decode: T=%d > %d rows; using the float32 torch reference "
                           "(prefill-sized calls are not handled by the MMA kernel)",
                           T, SM120_DECODE_MAX_TOKENS)
            _LOGGED_DELEGATION = True
        out, lse = sparse_mla_reference(
            q=q, k_cache=k_cache, indices=indices, topk_length=topk_length, attn_sink=attn_sink,
            softmax_scale=softmax_scale, extra_k_cache=extra_k_cache,
            extra_indices_in_kvcache=extra_indices_in_kvcache, extra_topk_length=extra_topk_length,
            head_dim_v=head_dim_v)
        return out.to(torch.bfloat16), lse

    out = torch.empty(T, 1, H, HEAD_DIM, dtype=torch.bfloat16, device=device)
    lse = torch.empty(T, H, 1, dtype=torch.float32, device=device)
    if T == 0:
        return out, lse

    # The kernels read the V4 bytes through a uint8 pointer (an fp8 view from SGLang's
    # get_key_buffer is the same bytes) and index the per-token lengths and the sink with
    # unit stride: strided or broadcast ones are compacted here ([T] and [H] elements, a
    # graph-capturable copy).
    k_cache = as_bytes(k_cache)
    if extra_k_cache is not None:
        extra_k_cache = as_bytes(extra_k_cache)
        extra_topk_length = extra_topk_length.contiguous()
    topk_length = topk_length.contiguous()
    if attn_sink is not None:
        attn_sink = attn_sink.contiguous()

    if device.type != "cuda" and not interpreting():
        raise KernelArgumentError(f"flash_mla_with_kvcache_sm120: q is on {device}: the kernel needs a CUDA "
                                  "device (or TRITON_INTERPRET=1 for Triton's CPU interpreter)")
    if attn_sink is None:
        attn_sink = torch.full((H,), float("-inf"), dtype=torch.float32, device=device)  # e^-inf = 0
    cfg = config or default_config(H, device_capability(device), T)
    if dot_dtype is None:
        dot_dtype = "fp32" if interpreting() else "bf16"
    if dot_dtype not in _DOT_DTYPES:
        raise ValueError(f"dot_dtype must be one of {sorted(_DOT_DTYPES)}, got {dot_dtype!r}")
    head_blocks = -(-H // cfg.block_h)
    has_extra = extra_k_cache is not None
    width = indices.shape[2]
    ex_width = extra_indices_in_kvcache.shape[2] if has_extra else 0
    if num_splits is None:
        num_splits = choose_num_splits(T, head_blocks, width + ex_width, cfg.block_n, _sm_count(device))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    split = num_splits > 1
    if split:
        # bf16 partials (normalised o of each split): half the traffic of fp32, error at the
        # level of the bf16 output rounding.
        part_o = torch.empty(T * num_splits * H * HEAD_DIM, dtype=torch.bfloat16, device=device)
        part_lse = torch.empty(T * num_splits * H, dtype=torch.float32, device=device)
    else:
        part_o = part_lse = lse  # unused placeholders

    ex_cache = extra_k_cache if has_extra else k_cache
    ex_idx = extra_indices_in_kvcache if has_extra else indices
    ex_len = extra_topk_length if has_extra else topk_length
    grid = (T, head_blocks, num_splits)
    pdl = use_pdl(cfg, device, T)
    launch = {"launch_pdl": True} if pdl else {}
    kernel = _sparse_mla_decode_wide_kernel if cfg.wide else _sparse_mla_decode_kernel
    kernel[grid](
        q, q.stride(0), q.stride(2), q.stride(3),
        k_cache, k_cache.stride(0), k_cache.shape[0] * k_cache.shape[1],
        indices, indices.stride(0), indices.stride(2), topk_length, width,
        ex_cache.data_ptr() - k_cache.data_ptr(), ex_cache.stride(0), ex_cache.shape[0] * ex_cache.shape[1],
        ex_idx, ex_idx.stride(0), ex_idx.stride(2), ex_len, ex_width,
        attn_sink, out, out.stride(0), out.stride(2), lse,
        part_o, part_lse,
        H, num_splits, float(softmax_scale) * LOG2E,
        PS=k_cache.shape[1], EX_PS=ex_cache.shape[1], HAS_EXTRA=has_extra, SPLIT=split,
        BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DOT_DTYPE=_DOT_DTYPES[dot_dtype],
        PREFETCH=int(cfg.prefetch), USE_PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch,
    )
    if split:
        # All splits of 16 heads x BLOCK_D dims a combine program, read in one tile. BLOCK_N must
        # match the main launch, which it uses to find the splits that received work.
        splits_p2, combine_h, combine_d = combine_tiles(num_splits, cfg.block_h)
        _combine_splits_kernel[(T, -(-H // combine_h), HEAD_DIM // combine_d)](
            part_o, part_lse, attn_sink, out, out.stride(0), out.stride(2), lse,
            topk_length, width, ex_len, ex_width, H, num_splits,
            HAS_EXTRA=has_extra, BLOCK_H=combine_h, BLOCK_N=cfg.block_n, BLOCK_D=combine_d,
            SPLITS_P2=splits_p2, USE_PDL=pdl, num_warps=4, **launch,
        )
    return out, lse
