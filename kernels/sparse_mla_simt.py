"""The "before" design: a SIMT sparse-MLA decode, as SGLang 0.5.23's sm_120 Triton path works.

This is the baseline the benchmark compares the tensor-core kernel against (docs/sglang-contract.md §4.5); it is our
own code reproducing that design, not SGLang's kernel:

* grid ``(T, H)``: one program per (token, head), so every head re-reads the same KV;
* the dot products are CUDA-core multiply-adds, ``tl.sum(q * kv)``, no ``tl.dot``;
* the scale of each of the 512 dims is gathered per element (512 byte loads per token);
* the loop runs over the whole index width whatever ``topk_length`` is (entries past the length
  are masked, not skipped);
* the SWA and extra scopes are separate launches, each writing a bf16 output and an fp32 LSE;
  torch then merges the two through those bf16 intermediates and applies the sink.

Layout and maths as in :mod:`dsv4kit.kernels.sparse_mla_reference`.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from dsv4kit.kernels.sparse_mla_reference import HEAD_DIM, as_bytes


@triton.jit
def _simt_scope_kernel(
    q_ptr, stride_qt, stride_qh, stride_qd,
    cache_ptr, page_stride, num_slots, idx_ptr, stride_it, stride_ij, len_ptr, width,
    out_ptr, lse_ptr, H, sm_scale,
    PS: tl.constexpr, BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    cols = tl.arange(0, 512)
    is_nope = cols < 448
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + h * stride_qh + cols * stride_qd).to(tl.float32)
    length = tl.load(len_ptr + t)
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([512], dtype=tl.float32)
    for start in range(0, width, BLOCK_T):  # full width, like the original
        j = start + tl.arange(0, BLOCK_T)
        in_row = j < width
        idx = tl.load(idx_ptr + t.to(tl.int64) * stride_it + j * stride_ij, mask=in_row, other=-1)
        valid = in_row & (j < length) & (idx >= 0) & (idx < num_slots)
        slot = tl.where(valid, idx, 0).to(tl.int64)
        page = slot // PS
        off = slot - page * PS
        base = page * page_stride
        data = base + off * 576
        m2 = valid[:, None] & is_nope[None, :]
        nope = tl.load(cache_ptr + data[:, None] + cols[None, :], mask=m2, other=0)
        # One scale byte load per element, as the original does.
        sc = tl.load(cache_ptr + (base + PS * 576 + off * 8)[:, None] + cols[None, :] // 64, mask=m2, other=0)
        nope = nope.to(tl.float8e4nv, bitcast=True).to(tl.float32) * tl.exp2(sc.to(tl.float32) - 127.0)
        rope_ptr = (cache_ptr + data[:, None] + 448).to(tl.pointer_type(tl.bfloat16), bitcast=True)
        rope = tl.load(rope_ptr + (cols[None, :] - 448), mask=valid[:, None] & (cols[None, :] >= 448), other=0.0)
        kv = tl.where(is_nope[None, :], nope, rope.to(tl.float32))
        s = tl.sum(q[None, :] * kv, 1) * sm_scale
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * kv, 0)
        m_i = m_new
    o = tl.where(l_i > 0, acc / tl.where(l_i > 0, l_i, 1.0), 0.0)
    tl.store(out_ptr + (t * H + h).to(tl.int64) * 512 + cols, o.to(tl.bfloat16))
    tl.store(lse_ptr + t * H + h, tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf")))


def _run_scope(q, cache, indices, length, softmax_scale, block_t):
    T, _, H, _ = q.shape
    cache = as_bytes(cache)  # an fp8 view is the same bytes; the kernel reads them as uint8
    length = length.contiguous()  # indexed with unit stride
    out = torch.empty(T, H, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    _simt_scope_kernel[(T, H)](
        q, q.stride(0), q.stride(2), q.stride(3),
        cache, cache.stride(0), cache.shape[0] * cache.shape[1],
        indices, indices.stride(0), indices.stride(2), length, indices.shape[2],
        out, lse, H, float(softmax_scale), PS=cache.shape[1], BLOCK_T=block_t, num_warps=4,
    )
    return out, lse


def simt_sparse_mla_decode(
    *, q: torch.Tensor, k_cache: torch.Tensor, head_dim_v: int, softmax_scale: float,
    indices: torch.Tensor, topk_length: torch.Tensor, attn_sink: Optional[torch.Tensor],
    extra_k_cache: Optional[torch.Tensor] = None, extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None, block_t: int = 16, **unused,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(out [T,1,H,512] bf16, lse [T,H] with sink)``. Same kwargs as the MMA kernel."""
    out, lse = _run_scope(q, k_cache, indices, topk_length, softmax_scale, block_t)
    parts = [(out, lse)]
    if extra_k_cache is not None:
        parts.append(_run_scope(q, extra_k_cache, extra_indices_in_kvcache, extra_topk_length,
                                softmax_scale, block_t))
    # Merge in torch through the bf16 intermediates, then the sink (the original's extra launches).
    lses = torch.stack([p[1] for p in parts])  # [S, T, H]
    if attn_sink is not None:
        sink = attn_sink.float().view(1, 1, -1).expand(1, *lses.shape[1:])
        total = torch.logsumexp(torch.cat([lses, sink]), dim=0)
    else:
        total = torch.logsumexp(lses, dim=0)
    safe_total = torch.where(torch.isneginf(total), torch.zeros_like(total), total)
    merged = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    for o, l in parts:
        merged += o.float() * torch.exp(l - safe_total).unsqueeze(-1)
    return merged.to(torch.bfloat16).unsqueeze(1), total
