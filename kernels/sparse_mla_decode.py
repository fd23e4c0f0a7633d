"""Tensor-core sparse-MLA decode for DeepSeek-V4 on sm_120 (and sm_90): one fused Triton launch.

Drop-in for SGLang 0.5.23's ``flash_mla_with_kvcache_sm120`` (keyword arguments only, spec 4.2)::

    out, lse = flash_mla_with_kvcache_sm120(q=, k_cache=, head_dim_v=512, softmax_scale=,
                                            indices=, topk_length=, attn_sink=,
                                            extra_k_cache=, extra_indices_in_kvcache=,
                                            extra_topk_length=)

Maths (spec 4.4), per token ``t`` and head ``h``, over the valid SWA entries then the valid extra
(c4 / c128) entries, V = K over all 512 dims::

    s_j = softmax_scale * <q[t,h], kv_j>;  out = sum_j e^(s_j-m) kv_j / (sum_j e^(s_j-m) + e^(sink_h-m))

An entry ``j`` is valid when ``j < length`` (read in the kernel from ``topk_length`` /
``extra_topk_length``), ``idx >= 0`` and ``idx < num_pages * page_size`` (a bad slot id is
skipped, never read). A row with no valid entry gives 0. ``lse`` is ``[T, H, 1]`` float32, the
natural-log sum-exp *without* the sink (``-inf`` for empty rows); SGLang does not consume it.

Design
------
* Grid ``(T, ceil(H / BLOCK_H), NUM_SPLITS)``. The ``BLOCK_H`` heads of one token share every KV
  tile: a tile of ``BLOCK_N`` KV tokens is gathered and dequantised once (fp8 * 2^(e-127) for
  dims [0,448), bf16 rope for [448,512), exact in bf16) and used for ``S = Q Kᵀ`` and
  ``O += P V`` through ``tl.dot`` (``mma.sync`` on sm_120, wgmma for 64-row tiles on sm_90;
  fp32 accumulation).
* Both scopes form one virtual sequence ``[valid SWA | valid extra]`` whose length is read on the
  device. Split ``s`` takes the ``s``-th BLOCK_N-aligned chunk of it, so work follows the valid
  lengths, not the index widths (a c128 row of width 8256 with 1024 valid slots costs 1024).
* ``NUM_SPLITS`` and the grid depend only on (T, H, widths, SM count): graph-safe. With one
  split the sink is applied in the epilogue; otherwise each split writes ``(o/l, log2 l + m)``
  to scratch and a combine launch merges the splits and applies the sink.
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

from dsv4kit.kernels.sparse_mla_reference import HEAD_DIM, TOKEN_BYTES, sparse_mla_reference

logger = logging.getLogger(__name__)

SM120_DECODE_MAX_TOKENS = 64
MAX_HEADS = 64
MAX_SPLITS = 32
COMBINE_BLOCK_H = 16
LOG2E = 1.4426950408889634

_DOT_DTYPES = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}


@dataclass(frozen=True)
class DecodeConfig:
    block_h: int = 32
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 1


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------

@triton.jit
def _attend_range(
    acc, m_i, l_i, q, row_idx_ptr, stride_idx, lo, hi, cache_ptr, page_stride, num_slots,
    qk_scale_log2,
    PS: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """Online softmax (base 2) over entries ``[lo, hi)`` of one scope's index row."""
    tiles = tl.arange(0, 8)  # 7 fp8 tiles of 64 dims, then the bf16 rope as tile 7
    c64 = tl.arange(0, 64)
    nope_tile = tiles < 7
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        in_range = j < hi
        idx = tl.load(row_idx_ptr + j * stride_idx, mask=in_range, other=-1)
        valid = in_range & (idx >= 0) & (idx < num_slots)
        slot = tl.where(valid, idx, 0).to(tl.int64)
        page = slot // PS
        off = slot - page * PS
        base = page * page_stride  # int64 byte offset of the page
        data = base + off * 576  # [BLOCK_N]
        # V4 bytes (spec 4.3): fp8 nope [0,448) + bf16 rope [448,576) per token, then the
        # ue8m0 scale bytes of the whole page at ps*576 + off*8. The three loads are tight
        # (no masked-off columns), so the pipeliner's shared-memory stages stay small. Invalid
        # rows load zeros, so a NaN-encoded fp8 byte in an unused slot never reaches P·V.
        nope_mask = valid[:, None, None] & nope_tile[None, :, None]
        nope_u8 = tl.load(cache_ptr + data[:, None, None] + (tiles * 64)[None, :, None] + c64[None, None, :],
                          mask=nope_mask, other=0)  # [BLOCK_N, 8, 64]
        scale_u8 = tl.load(cache_ptr + (base + PS * 576 + off * 8)[:, None] + tiles[None, :],
                           mask=valid[:, None] & nope_tile[None, :], other=0)  # [BLOCK_N, 8]
        rope_ptr = (cache_ptr + data + 448).to(tl.pointer_type(tl.bfloat16), bitcast=True)
        rope = tl.load(rope_ptr[:, None] + c64[None, :], mask=valid[:, None], other=0.0)  # [BLOCK_N, 64]
        # fp8 * 2^(e-127) is exact in bf16 (8 exponent bits): dequantise in the dot dtype.
        scale = tl.exp2(scale_u8.to(tl.float32) - 127.0).to(DOT_DTYPE)
        nope = nope_u8.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE) * scale[:, :, None]
        kv3 = tl.where(nope_tile[None, :, None], nope, rope.to(DOT_DTYPE)[:, None, :])
        kv = tl.reshape(kv3, [BLOCK_N, 512])  # dim = tile * 64 + c

        s = tl.dot(q, tl.trans(kv)) * qk_scale_log2  # [BLOCK_H, BLOCK_N], log2 domain
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(DOT_DTYPE), kv, acc)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _sparse_mla_decode_kernel(
    q_ptr, stride_qt, stride_qh, stride_qd,
    kv_ptr, kv_page_stride, kv_num_slots,
    idx_ptr, stride_it, stride_ij, len_ptr, width,
    ex_kv_ptr, ex_page_stride, ex_num_slots,
    ex_idx_ptr, stride_et, stride_ej, ex_len_ptr, ex_width,
    sink_ptr, out_ptr, stride_ot, stride_oh, lse_ptr,
    part_o_ptr, part_lse_ptr,
    H, num_splits, qk_scale_log2,
    PS: tl.constexpr, EX_PS: tl.constexpr, HAS_EXTRA: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    t = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    cols = tl.arange(0, 512)

    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + cols[None, :] * stride_qd,
                mask=head_ok[:, None], other=0.0).to(DOT_DTYPE)

    # Lengths are device values (graph-safe); clamp them to the index widths.
    n_swa = tl.minimum(tl.maximum(tl.load(len_ptr + t), 0), width)
    n_ex = 0
    if HAS_EXTRA:
        n_ex = tl.minimum(tl.maximum(tl.load(ex_len_ptr + t), 0), ex_width)
    total = n_swa + n_ex
    chunk = tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N
    v_lo = tl.minimum(sp * chunk, total)
    v_hi = tl.minimum(v_lo + chunk, total)

    acc = tl.zeros([BLOCK_H, 512], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc, m_i, l_i = _attend_range(
        acc, m_i, l_i, q, idx_ptr + t.to(tl.int64) * stride_it, stride_ij,
        tl.minimum(v_lo, n_swa), tl.minimum(v_hi, n_swa), kv_ptr, kv_page_stride, kv_num_slots,
        qk_scale_log2, PS, BLOCK_N, DOT_DTYPE)
    if HAS_EXTRA:
        acc, m_i, l_i = _attend_range(
            acc, m_i, l_i, q, ex_idx_ptr + t.to(tl.int64) * stride_et, stride_ej,
            tl.maximum(v_lo, n_swa) - n_swa, tl.maximum(v_hi, n_swa) - n_swa,
            ex_kv_ptr, ex_page_stride, ex_num_slots, qk_scale_log2, EX_PS, BLOCK_N, DOT_DTYPE)

    has_any = l_i > 0.0
    if SPLIT:
        # Partial state of this split: normalised o and its base-2 log-sum-exp.
        o = tl.where(has_any[:, None], acc / tl.where(has_any, l_i, 1.0)[:, None], 0.0)
        lse2 = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
        row = (t * num_splits + sp).to(tl.int64) * H + heads
        tl.store(part_o_ptr + row[:, None] * 512 + cols[None, :], o, mask=head_ok[:, None])
        tl.store(part_lse_ptr + row, lse2, mask=head_ok)
    else:
        sink2 = tl.load(sink_ptr + heads, mask=head_ok, other=0.0) * 1.4426950408889634
        m_safe = tl.where(has_any, m_i, 0.0)
        denom = l_i + tl.exp2(sink2 - m_safe)
        o = tl.where(has_any[:, None], acc / tl.where(has_any, denom, 1.0)[:, None], 0.0)
        tl.store(out_ptr + t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + cols[None, :],
                 o.to(tl.bfloat16), mask=head_ok[:, None])
        lse = tl.where(has_any, (m_i + tl.log2(tl.where(has_any, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        tl.store(lse_ptr + t * H + heads, lse, mask=head_ok)


@triton.jit
def _combine_splits_kernel(
    part_o_ptr, part_lse_ptr, sink_ptr, out_ptr, stride_ot, stride_oh, lse_ptr,
    len_ptr, width, ex_len_ptr, ex_width, H, num_splits,
    HAS_EXTRA: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Merge the split partials of one (token, head block) and apply the sink."""
    t = tl.program_id(0)
    hb = tl.program_id(1)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    cols = tl.arange(0, 512)
    # Only the splits that received work (same chunking as the main kernel) are read.
    n_swa = tl.minimum(tl.maximum(tl.load(len_ptr + t), 0), width)
    n_ex = 0
    if HAS_EXTRA:
        n_ex = tl.minimum(tl.maximum(tl.load(ex_len_ptr + t), 0), ex_width)
    total = n_swa + n_ex
    chunk = tl.maximum(tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N, 1)
    active = tl.minimum(tl.cdiv(total, chunk), num_splits)

    big = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for s in range(0, active):
        row = (t * num_splits + s).to(tl.int64) * H + heads
        big = tl.maximum(big, tl.load(part_lse_ptr + row, mask=head_ok, other=float("-inf")))
    has_any = big > float("-inf")
    big_safe = tl.where(has_any, big, 0.0)
    acc = tl.zeros([BLOCK_H, 512], dtype=tl.float32)
    wsum = tl.zeros([BLOCK_H], dtype=tl.float32)
    for s in range(0, active):
        row = (t * num_splits + s).to(tl.int64) * H + heads
        lse2 = tl.load(part_lse_ptr + row, mask=head_ok, other=float("-inf"))
        w = tl.exp2(lse2 - big_safe)
        o = tl.load(part_o_ptr + row[:, None] * 512 + cols[None, :], mask=head_ok[:, None], other=0.0)
        acc += w[:, None] * o
        wsum += w
    sink2 = tl.load(sink_ptr + heads, mask=head_ok, other=0.0) * 1.4426950408889634
    denom = wsum + tl.exp2(sink2 - big_safe)
    o = tl.where(has_any[:, None], acc / tl.where(has_any, denom, 1.0)[:, None], 0.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + cols[None, :],
             o.to(tl.bfloat16), mask=head_ok[:, None])
    lse = tl.where(has_any, (big_safe + tl.log2(tl.where(has_any, wsum, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    tl.store(lse_ptr + t * H + heads, lse, mask=head_ok)


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


def default_config(num_heads: int, capability: tuple[int, int]) -> DecodeConfig:
    """Tile sizes per architecture (checked by the AOT tests and the benchmark's config sweep).

    sm_120 (about 99 KB of shared memory a block, no wgmma): ``BLOCK_H = 16`` heads,
    ``BLOCK_N = 16`` KV tokens a tile, 4 warps, 2 pipeline stages: about 59 KB of shared memory
    and no register spills (ptxas, sm_120a). Of the tiles that fit sm_120, it was the fastest
    in the H200 sweep at c4 T=64 (docs/results/bench_attention_h200.json, ``config_sweep``): the
    loop is latency-bound, and more, smaller programs beat sharing one KV tile among 32 heads.
    Each KV tile is still gathered and dequantised once per 16 heads.

    sm_90 (227 KB, wgmma): ``BLOCK_H = 64`` so all 64 heads of a token share one gathered,
    dequantised KV tile, ``BLOCK_N = 16``, 8 warps, 3 stages (about 131 KB). This is the tile
    the committed H200 numbers were measured with.
    """
    if capability[0] == 12 or capability < (9, 0):
        return DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=2)
    block_h = 16 if num_heads <= 16 else (32 if num_heads <= 32 else 64)
    return DecodeConfig(block_h=block_h, block_n=16, num_warps=8, num_stages=3)


def choose_num_splits(T: int, head_blocks: int, width_total: int, block_n: int, sm_count: int) -> int:
    """Splits per (token, head block), from shapes only (graph-safe).

    Only when the (token, head block) programs fill less than a quarter of the SMs: each split
    costs a [BLOCK_H, 512] fp32 partial written and read back (as much traffic as the KV of a
    c4 row at T=64), which near a full wave costs more than the idle SMs would have given.
    """
    programs = max(1, T * head_blocks)
    if 4 * programs > sm_count:
        return 1
    max_useful = max(1, -(-width_total // block_n))
    return max(1, min(-(-sm_count // programs), max_useful, MAX_SPLITS))


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
    num_splits: Optional[int] = None, dot_dtype: Optional[str] = None, **unused,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-MLA decode; returns ``(out [T,1,H,512] bf16, lse [T,H,1] float32, no sink)``.

    ``config``, ``num_splits`` and ``dot_dtype`` ("bf16", "fp16", "fp32") are tuning/testing
    overrides; SGLang never passes them. Calls with ``T > SM120_DECODE_MAX_TOKENS`` go to the float32
    torch reference (logged once).
    """
    check_arguments(q, k_cache, head_dim_v, softmax_scale, indices, topk_length, attn_sink,
                    extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
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

    if attn_sink is None:
        attn_sink = torch.full((H,), float("-inf"), dtype=torch.float32, device=device)  # e^-inf = 0
    cfg = config or default_config(H, device_capability(device))
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
        part_o = torch.empty(T * num_splits * H * HEAD_DIM, dtype=torch.float32, device=device)
        part_lse = torch.empty(T * num_splits * H, dtype=torch.float32, device=device)
    else:
        part_o = part_lse = lse  # unused placeholders

    ex_cache = extra_k_cache if has_extra else k_cache
    ex_idx = extra_indices_in_kvcache if has_extra else indices
    ex_len = extra_topk_length if has_extra else topk_length
    grid = (T, head_blocks, num_splits)
    _sparse_mla_decode_kernel[grid](
        q, q.stride(0), q.stride(2), q.stride(3),
        k_cache, k_cache.stride(0), k_cache.shape[0] * k_cache.shape[1],
        indices, indices.stride(0), indices.stride(2), topk_length, width,
        ex_cache, ex_cache.stride(0), ex_cache.shape[0] * ex_cache.shape[1],
        ex_idx, ex_idx.stride(0), ex_idx.stride(2), ex_len, ex_width,
        attn_sink, out, out.stride(0), out.stride(2), lse,
        part_o, part_lse,
        H, num_splits, float(softmax_scale) * LOG2E,
        PS=k_cache.shape[1], EX_PS=ex_cache.shape[1], HAS_EXTRA=has_extra, SPLIT=split,
        BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DOT_DTYPE=_DOT_DTYPES[dot_dtype],
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split:
        # 16 heads a combine program: a [16, 512] fp32 accumulator fits 4 warps' registers
        # (64 heads spilled 5.5 KB a thread on sm_90). BLOCK_N must match the main launch,
        # which it uses to find the splits that received work.
        combine_h = min(cfg.block_h, COMBINE_BLOCK_H)
        _combine_splits_kernel[(T, -(-H // combine_h))](
            part_o, part_lse, attn_sink, out, out.stride(0), out.stride(2), lse,
            topk_length, width, ex_len, ex_width, H, num_splits,
            HAS_EXTRA=has_extra, BLOCK_H=combine_h, BLOCK_N=cfg.block_n, num_warps=4,
        )
    return out, lse
