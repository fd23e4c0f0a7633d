"""Ahead-of-time builds of the FP4-cache indexer kernel for sm_120 (RTX PRO 6000) and sm_90
(H200), no GPU: sm_120 gets the native block-scaled e2m1 MMA within its shared-memory limit.

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
from dsv4kit.kernels import indexer_fp4 as ix

arch, warp, tail, kernel = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
signature = {"q_ptr": "*i8", "qs_ptr": "*i32", "kv_ptr": "*u8", "w_ptr": "*fp32",
             "seq_lens_ptr": "*i32", "page_table_ptr": "*i32", "out_ptr": "*fp32",
             "seq_lens_stride": "i32", "pt_stride": "i32", "num_pages": "i32",
             "max_seq_len": "i32", "progs_per_row": "i32", "H": "constexpr", "PAGE": "constexpr",
             "PACKED": "constexpr", "PAGE_BYTES": "constexpr", "SCALE_OFFSET": "constexpr",
             "FILL": "constexpr", "EXACT_TAIL": "constexpr", "DIRECT": "constexpr"}
constexprs = {"H": 64, "PAGE": ix.PAGE_SIZE, "PACKED": ix.PACKED_BYTES, "PAGE_BYTES": ix.PAGE_BYTES,
              "SCALE_OFFSET": ix.SCALE_OFFSET, "FILL": ix.FILL_BLOCK,
              "EXACT_TAIL": tail == "exact", "DIRECT": ix.DIRECT}
# What the launcher specialises at run time: 16-byte aligned pointers, max_seq_len % 16 == 0.
attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 10)}
stages = ix.NUM_STAGES
fn = ix._fp4_logits_kernel
if kernel == "tiles":  # the row-tile kernel: batch and progs instead of progs_per_row
    del signature["progs_per_row"], signature["DIRECT"], constexprs["DIRECT"]
    signature.update({"batch": "i32", "progs": "i32", "ROWS": "constexpr", "CHECK": "constexpr"})
    constexprs.update({"ROWS": ix._tiles.ROWS, "CHECK": ix._tiles.CHECK})
    signature = {k: signature[k] for k in ix._fp4_shared_rows_kernel.arg_names}
    fn, stages = ix._fp4_shared_rows_kernel, ix.TILE_NUM_STAGES
src = ASTSource(fn, signature, constexprs, attrs=attrs)
compiled = triton.compile(src, target=GPUTarget("cuda", arch, warp),
                          options={"num_warps": ix.NUM_WARPS, "num_stages": stages})
ptx = compiled.asm["ptx"]
print(json.dumps({
    "shared": compiled.metadata.shared,
    "mma": sorted(set(re.findall(r"\b(?:wgmma\.mma_async|mma\.sync)[\w.:]*", ptx))),
    "target": re.search(r"\.target\s+(\S+)", ptx).group(1),
    "ttgir": compiled.asm["ttgir"],
}))
"""


def _build(arch: int, warp: int, tail: str, kernel: str = "rows") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    out = subprocess.run([sys.executable, "-c", BUILD, str(arch), str(warp), tail, kernel],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kernel,tail", [("rows", "skip"), ("rows", "exact"), ("tiles", "skip")])
def test_sm120_uses_the_native_block_scaled_e2m1_mma_within_the_limit(kernel, tail):
    built = _build(120, 32, tail, kernel)
    assert built["target"].startswith("sm_120")
    assert any(m.startswith("mma.sync") and "block_scale" in m and "e2m1.e2m1" in m
               and "ue8m0" in m for m in built["mma"]), built["mma"]
    assert 0 < built["shared"] <= SM120_SHARED_LIMIT
    assert copies_in_loops(built["ttgir"]) == 0  # q reaches shared memory once, not every page


def test_sm90_builds_with_a_tensor_core_mma():
    built = _build(90, 128, "skip")
    assert built["target"].startswith("sm_90")
    assert any(m.startswith("wgmma") for m in built["mma"]), built["mma"]
