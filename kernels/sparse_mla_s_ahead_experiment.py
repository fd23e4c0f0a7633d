"""Experiment (compile-only): the wide kernel with S = K q^T one KV step ahead, so its wgmma could
run during the previous step's softmax. Removed again in the next commit; see docs/attention.md."""

import triton
import triton.language as tl
from dsv4kit.kernels.sparse_mla_decode import (_load_idx, _row_offsets, _load_rows_wide, _dequant_wide,
    _valid_lengths, _split_chunk, _epilogue)


@triton.jit
def wide_st_kernel(
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
):
    t = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    cols = tl.arange(0, 512)
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + cols[None, :] * stride_qd,
                mask=head_ok[:, None], other=0.0).to(DOT_DTYPE)
    qT = tl.trans(q)
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
    j0 = v_lo + ar
    idx0 = _load_idx(idx_row, stride_ij, ex_row, stride_ej, j0, v_hi, n_swa, HAS_EXTRA)
    valid_c, data0, scale0 = _row_offsets(idx0, j0, n_swa, kv_num_slots, kv_page_stride, ex_delta, ex_num_slots,
                                          ex_page_stride, PS, EX_PS, HAS_EXTRA)
    sw0, nope0, rp0 = _load_rows_wide(kv_ptr, valid_c, data0, scale0)
    kv_c = _dequant_wide(sw0, nope0, rp0, BLOCK_N, DOT_DTYPE)
    st_c = tl.dot(kv_c, qT)
    idx_n = _load_idx(idx_row, stride_ij, ex_row, stride_ej, j0 + BLOCK_N, v_hi, n_swa, HAS_EXTRA)
    p_prev = tl.zeros([BLOCK_H, BLOCK_N], dtype=DOT_DTYPE)
    kv_prev = tl.zeros([BLOCK_N, 512], dtype=DOT_DTYPE)
    alpha_prev = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
    for start in range(v_lo, v_hi, BLOCK_N):
        # PV of the previous step first: its wait also completes this step's S (issued last
        # iteration), so the S dot below can stay in flight while this step's softmax runs.
        acc = tl.dot(p_prev, kv_prev, acc * alpha_prev[:, None])
        jn = start + BLOCK_N + ar
        valid_n, data_n, scale_n = _row_offsets(idx_n, jn, n_swa, kv_num_slots, kv_page_stride, ex_delta,
                                                ex_num_slots, ex_page_stride, PS, EX_PS, HAS_EXTRA)
        sw_n, nope_n, rp_n = _load_rows_wide(kv_ptr, valid_n, data_n, scale_n)
        idx_n = _load_idx(idx_row, stride_ij, ex_row, stride_ej, jn + BLOCK_N, v_hi, n_swa, HAS_EXTRA)
        kv_n = _dequant_wide(sw_n, nope_n, rp_n, BLOCK_N, DOT_DTYPE)
        st_n = tl.dot(kv_n, qT)
        s = tl.where(valid_c[:, None], st_c * qk_scale_log2, float("-inf"))  # [N, H], log2 domain
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
        p_prev = tl.trans(p.to(DOT_DTYPE))
        kv_prev = kv_c
        alpha_prev = alpha
        kv_c = kv_n
        st_c = st_n
        valid_c = valid_n
    acc = tl.dot(p_prev, kv_prev, acc * alpha_prev[:, None])
    inv, o_row = _epilogue(l_i, m_i, t, sp, heads, head_ok, H, num_splits, sink_ptr, out_ptr, stride_ot,
                           stride_oh, lse_ptr, part_o_ptr, part_lse_ptr, SPLIT)
    tl.store(o_row[:, None] + cols[None, :], (acc * inv[:, None]).to(o_row.dtype.element_ty), mask=head_ok[:, None])


if __name__ == "__main__":
    # python -m dsv4kit.kernels.sparse_mla_s_ahead_experiment  (Triton 3.6, no GPU needed)
    import os
    import subprocess

    from dsv4kit.kernels import sparse_mla_decode as mod
    from dsv4kit.kernels.sparse_mla_aot import compile_decode

    mod._sparse_mla_decode_wide_kernel = wide_st_kernel
    k = compile_decode(90, mod.DecodeConfig(64, 64, 8, 2, 2, True))
    path = "/tmp/s_ahead_sm90.cubin"
    with open(path, "wb") as fh:
        fh.write(k.asm["cubin"])
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    print(subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", path], capture_output=True,
                         text=True).stdout)
    sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", path], capture_output=True, text=True).stdout
    print("triton", triton.__version__, "shared", k.metadata.shared,
          "HGMMA", sass.count("HGMMA"), "WARPGROUP.DEPBAR", sass.count("WARPGROUP.DEPBAR"),
          "STL", sass.count("STL"), "LDL", sass.count("LDL"))
