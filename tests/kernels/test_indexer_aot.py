"""Ahead-of-time builds of the indexer kernel for sm_120 (RTX PRO 6000) and sm_90 (H200), no GPU.

Compiled in a subprocess without TRITON_INTERPRET (another test may have set it in this process).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.kernels.aot_support import copies_in_loops

SM120_SHARED_LIMIT = 101376  # bytes per block on sm_120

BUILD = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from dsv4kit.kernels import indexer as ix


arch, warp = int(sys.argv[1]), int(sys.argv[2])
signature = {"q_ptr": "*fp8e4nv", "kv_ptr": "*u8", "w_ptr": "*fp32", "seq_lens_ptr": "*i32",
             "page_table_ptr": "*i32", "out_ptr": "*fp32", "seq_lens_stride": "i32",
             "pt_stride": "i32", "num_pages": "i32", "max_seq_len": "i32", "progs_per_row": "i32",
             "H": "constexpr", "D": "constexpr", "PAGE": "constexpr", "PAGE_BYTES": "constexpr",
             "SCALE_OFFSET": "constexpr", "FILL": "constexpr", "PREFETCH": "constexpr",
             "EXACT_TAIL": "constexpr", "DIRECT": "constexpr", "PIN_FIRST": "constexpr"}
constexprs = {"H": 64, "D": 128, "PAGE": ix.PAGE_SIZE, "PAGE_BYTES": ix.PAGE_BYTES,
              "SCALE_OFFSET": ix.SCALE_OFFSET, "FILL": ix.FILL_BLOCK, "PREFETCH": ix.PREFETCH,
              "EXACT_TAIL": sys.argv[3] == "exact", "DIRECT": ix.DIRECT, "PIN_FIRST": ix.PIN_FIRST}
# What the launcher specialises at run time: 16-byte aligned pointers, max_seq_len % 16 == 0.
aligned = [["tt.divisibility", 16]]
attrs = {(i,): aligned for i in (0, 1, 2, 3, 4, 5, 9)}
src = ASTSource(ix._indexer_logits_kernel, signature, constexprs, attrs=attrs)
compiled = triton.compile(src, target=GPUTarget("cuda", arch, warp),
                          options={"num_warps": ix.NUM_WARPS, "num_stages": ix.NUM_STAGES})
ptx = compiled.asm["ptx"]
print(json.dumps({
    "shared": compiled.metadata.shared,
    "mma": sorted(set(re.findall(r"\b(?:wgmma\.mma_async|mma\.sync)[\w.]*", ptx))),
    "vector_stores": len(re.findall(r"st\.global(?:\.\w+)*\.v4\.(?:b32|f32)", ptx)),
    "target": re.search(r"\.target\s+(\S+)", ptx).group(1),
    "ttgir": compiled.asm["ttgir"],
}))
"""


def _build(arch: int, warp: int, tail: str = "exact") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    out = subprocess.run([sys.executable, "-c", BUILD, str(arch), str(warp), tail],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sm120():
    return _build(120, 32)


@pytest.fixture(scope="module")
def sm120_skip():
    """The build the SGLang plugin runs: skip tail policy."""
    return _build(120, 32, "skip")


@pytest.fixture(scope="module")
def sm90():
    return _build(90, 128)


def test_sm120_uses_fp8_mma_sync(sm120):
    assert sm120["target"].startswith("sm_120")
    assert any(m.startswith("mma.sync") and "e4m3.e4m3" in m for m in sm120["mma"]), sm120["mma"]


def test_sm120_fits_the_shared_memory_limit(sm120):
    assert 0 < sm120["shared"] <= SM120_SHARED_LIMIT


def test_sm90_uses_an_fp8_mma(sm90):
    assert sm90["target"].startswith("sm_90")
    assert any("e4m3.e4m3" in m for m in sm90["mma"]), sm90["mma"]


def test_tail_fill_uses_vector_stores(sm120, sm90):
    assert sm120["vector_stores"] > 0 and sm90["vector_stores"] > 0


def test_sm120_skip_tail_build_uses_mma_sync_within_the_limit(sm120_skip):
    assert sm120_skip["target"].startswith("sm_120")
    assert any(m.startswith("mma.sync") and "e4m3.e4m3" in m for m in sm120_skip["mma"])
    assert 0 < sm120_skip["shared"] <= SM120_SHARED_LIMIT


def test_q_is_copied_into_shared_memory_once_not_every_page(sm120, sm90):
    # The MMA reads q from shared memory: a transpose written inside the page loop put that copy in
    # every iteration on sm_90 (and a fence, with q live in registers besides).
    assert copies_in_loops(sm120["ttgir"]) == 0 and copies_in_loops(sm90["ttgir"]) == 0
