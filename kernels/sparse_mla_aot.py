"""Ahead-of-time builds of the sparse-MLA decode kernels for a GPU target, without a GPU.

Used by the tests (sm_120 / sm_90 build checks) and handy when tuning tile sizes::

    python -m dsv4kit.kernels.sparse_mla_aot 120 [BLOCK_H BLOCK_N NUM_WARPS NUM_STAGES]

Must run with ``TRITON_INTERPRET`` unset (the interpreter replaces the compiler).
"""

from __future__ import annotations

import re
import sys

from dsv4kit.kernels.sparse_mla_decode import DecodeConfig, default_config


def _decode_signature():
    sig = {}
    names = [
        ("q_ptr", "*bf16"), ("stride_qt", "i32"), ("stride_qh", "i32"), ("stride_qd", "i32"),
        ("kv_ptr", "*u8"), ("kv_page_stride", "i64"), ("kv_num_slots", "i64"),
        ("idx_ptr", "*i32"), ("stride_it", "i32"), ("stride_ij", "i32"), ("len_ptr", "*i32"), ("width", "i32"),
        ("ex_delta", "i64"), ("ex_page_stride", "i64"), ("ex_num_slots", "i64"),
        ("ex_idx_ptr", "*i32"), ("stride_et", "i32"), ("stride_ej", "i32"), ("ex_len_ptr", "*i32"),
        ("ex_width", "i32"),
        ("sink_ptr", "*fp32"), ("out_ptr", "*bf16"), ("stride_ot", "i32"), ("stride_oh", "i32"),
        ("lse_ptr", "*fp32"), ("part_o_ptr", "*bf16"), ("part_lse_ptr", "*fp32"),  # bf16 partials, as launched
        ("H", "i32"), ("num_splits", "i32"), ("qk_scale_log2", "fp32"),
    ]
    for name, ty in names:
        sig[name] = ty
    return sig


def compile_decode(capability: int, config: DecodeConfig | None = None, *, page_size: int = 256,
                   extra_page_size: int = 64, has_extra: bool = True, split: bool = True,
                   dot_dtype: str = "bf16", pdl: bool = True):
    """``triton.compile`` the fused decode kernel for ``sm_<capability>``; returns the compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dsv4kit.kernels import sparse_mla_decode as mod

    cfg = config or default_config(64, (capability // 10, capability % 10))
    sig = _decode_signature()
    for name, val in (("PS", page_size), ("EX_PS", extra_page_size), ("HAS_EXTRA", has_extra),
                      ("SPLIT", split), ("BLOCK_H", cfg.block_h), ("BLOCK_N", cfg.block_n),
                      ("DOT_DTYPE", mod._DOT_DTYPES[dot_dtype]), ("PREFETCH", int(cfg.prefetch)),
                      ("USE_PDL", pdl)):
        sig[name] = "constexpr"
    constexprs = {"PS": page_size, "EX_PS": extra_page_size, "HAS_EXTRA": has_extra, "SPLIT": split,
                  "BLOCK_H": cfg.block_h, "BLOCK_N": cfg.block_n,
                  "DOT_DTYPE": mod._DOT_DTYPES[dot_dtype], "PREFETCH": int(cfg.prefetch), "USE_PDL": pdl}
    # Mirror what the JIT specialises in a real call: unit strides become constants, pointers and
    # the page / row strides (multiples of 16 bytes in the V4 layout) carry divisibility 16.
    for name in ("stride_qd", "stride_ij", "stride_ej"):
        sig[name] = "constexpr"
        constexprs[name] = 1
    div16 = {"stride_qt", "stride_qh", "kv_page_stride", "stride_it", "width", "ex_delta", "ex_page_stride",
             "stride_et", "ex_width", "stride_ot", "stride_oh"}
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n in div16 or (sig[n].startswith("*"))}
    fn = mod._sparse_mla_decode_wide_kernel if cfg.wide else mod._sparse_mla_decode_kernel
    src = ASTSource(fn, sig, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def summary(compiled) -> dict:
    ptx = compiled.asm["ptx"]
    return {
        "shared_bytes": compiled.metadata.shared,
        "mma_sync": "mma.sync" in ptx,
        "wgmma": "wgmma" in ptx,
        "mma_kinds": sorted(set(re.findall(r"mma\.sync\.aligned\.[\w.]+", ptx)))[:4],
        "local_bytes": sum(int(x) for x in re.findall(r"\.local\s+\.align\s+\d+\s+\.b8\s+\w+\[(\d+)\]", ptx)),
    }


def compile_combine(capability: int, block_h: int = 16, block_n: int = 16, has_extra: bool = True,
                    block_d: int = 32, splits_p2: int = 16, pdl: bool = True):
    """``triton.compile`` the split-combine kernel for ``sm_<capability>``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dsv4kit.kernels import sparse_mla_decode as mod

    sig = {"part_o_ptr": "*bf16", "part_lse_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": "*bf16",
           "stride_ot": "i32", "stride_oh": "i32", "lse_ptr": "*fp32", "len_ptr": "*i32", "width": "i32",
           "ex_len_ptr": "*i32", "ex_width": "i32", "H": "i32", "num_splits": "i32",
           "HAS_EXTRA": "constexpr", "BLOCK_H": "constexpr", "BLOCK_N": "constexpr", "BLOCK_D": "constexpr",
           "SPLITS_P2": "constexpr", "USE_PDL": "constexpr"}
    constexprs = {"HAS_EXTRA": has_extra, "BLOCK_H": block_h, "BLOCK_N": block_n, "BLOCK_D": block_d,
                  "SPLITS_P2": splits_p2, "USE_PDL": pdl}
    src = ASTSource(mod._combine_splits_kernel, sig, constexprs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options={"num_warps": 4})


if __name__ == "__main__":
    cap = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    cfg = None
    if len(sys.argv) > 5:
        cfg = DecodeConfig(*(int(x) for x in sys.argv[2:6]))
    print(summary(compile_decode(cap, cfg)))
