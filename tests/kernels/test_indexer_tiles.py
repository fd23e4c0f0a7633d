"""The row-tile indexer kernel (rows that share keys) against the float64 reference through
Triton's CPU interpreter, and its sm_120 build (no GPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.aot_support import copies_in_loops

WORKER = Path(__file__).resolve().parents[1] / "indexer_tiles_interp_worker.py"
REL_BAR = 5e-4
SM120_SHARED_LIMIT = 101376


@pytest.fixture(scope="module")
def interp():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)
    return {(r["name"], r.get("tail")): r for r in rows}


CASES = ["two requests in one tile", "shared prefix page", "chunk starts mid-page",
         "zero-length row inside a chunk", "rows not a multiple of the tile", "32 heads",
         "verify: 6 rows a request"]


@pytest.mark.parametrize("tail", ["exact", "skip"])
@pytest.mark.parametrize("name", CASES)
def test_tiles_match_float64(interp, name, tail):
    r = interp[(name, tail)]
    assert r["pattern_ok"], f"{name} ({tail}): -inf pattern differs"
    assert r["rel"] <= REL_BAR and r["compared"] > 0
    if tail == "skip":  # nothing at or past the page holding L is written
        assert r["past_page_untouched"]


def test_the_page_layout_is_the_per_row_kernels():
    from dsv4kit.kernels import indexer, indexer_tiles

    assert (indexer_tiles.PAGE_SIZE, indexer_tiles.HEAD_DIM, indexer_tiles.PAGE_BYTES,
            indexer_tiles.SCALE_OFFSET) == (indexer.PAGE_SIZE, indexer.HEAD_DIM, indexer.PAGE_BYTES,
                                            indexer.SCALE_OFFSET)
    assert indexer.TAIL_EXACT == "exact"


def test_cases_reach_the_tails_they_claim(interp):
    assert interp[("zero-length row inside a chunk", "skip")]["past_page_cells"] > 0
    assert not interp[("zero-length row inside a chunk", "exact")]["past_page_untouched"]


def test_corrupt_ids_are_never_read_shared_or_per_row(interp):
    r = interp[("corrupt page ids", None)]
    assert r["corrupt_inf"] and r["others_finite"]


def test_the_entry_sends_prefill_sized_batches_to_the_tiles(interp):
    r = interp[("entry at the row-tile batch", "skip")]
    assert r["used_tiles"] and r["pattern_ok"] and r["rel"] <= REL_BAR
    assert interp[("entry below the row-tile thresholds", None)]["per_row"] == [True, True]


BUILD = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from dsv4kit.kernels import indexer as ix, indexer_tiles as it


sig = {"q_ptr": "*fp8e4nv", "kv_ptr": "*u8", "w_ptr": "*fp32", "seq_lens_ptr": "*i32",
       "page_table_ptr": "*i32", "out_ptr": "*fp32", "seq_lens_stride": "i32", "pt_stride": "i32",
       "num_pages": "i32", "max_seq_len": "i32", "batch": "i32", "progs": "i32",
       "H": "constexpr", "D": "constexpr", "PAGE": "constexpr", "PAGE_BYTES": "constexpr",
       "SCALE_OFFSET": "constexpr", "FILL": "constexpr", "EXACT_TAIL": "constexpr",
       "ROWS": "constexpr", "CHECK": "constexpr"}
out = {}
for tail, arch, warp in (("exact", 120, 32), ("skip", 120, 32), ("exact", 90, 128)):
    ce = {"H": 64, "D": 128, "PAGE": ix.PAGE_SIZE, "PAGE_BYTES": ix.PAGE_BYTES,
          "SCALE_OFFSET": ix.SCALE_OFFSET, "FILL": ix.FILL_BLOCK, "EXACT_TAIL": tail == "exact",
          "ROWS": it.ROWS, "CHECK": it.CHECK}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(6)}
    c = triton.compile(ASTSource(it._shared_rows_kernel, sig, ce, attrs=attrs),
                       target=GPUTarget("cuda", arch, warp),
                       options={"num_warps": it.NUM_WARPS, "num_stages": it.NUM_STAGES})
    ptx = c.asm["ptx"]
    out[f"{tail} sm_{arch}"] = {"shared": c.metadata.shared, "target": re.search(r"\.target\s+(\S+)", ptx).group(1),
                 "mma": sorted(set(re.findall(r"\bmma\.sync[\w.]*", ptx))),
                 "ttgir": c.asm["ttgir"]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    out = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sm120_build_uses_fp8_mma_sync_within_the_shared_memory_limit(builds):
    for name, b in builds.items():
        if "sm_120" not in name:
            continue
        assert b["target"].startswith("sm_120"), name
        assert any("e4m3.e4m3" in m for m in b["mma"]), (name, b["mma"])
        assert 0 < b["shared"] <= SM120_SHARED_LIMIT, (name, b["shared"])


def test_the_tiles_q_is_copied_into_shared_memory_once_not_every_page(builds):
    # The MMA reads the stacked q [ROWS*H, 128] from shared memory; transposed inside the page loop
    # it was copied there (32 KB and a fence) every page on sm_90, and q stayed live in registers.
    assert "exact sm_90" in builds
    for name, b in builds.items():
        assert copies_in_loops(b["ttgir"]) == 0, name
