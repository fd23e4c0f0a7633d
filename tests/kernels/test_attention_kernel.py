"""Sparse-MLA decode kernel on Triton's CPU interpreter (float32 / fp16 dots) vs the float32 reference.

The interpreter runs in a subprocess (tests/attention_worker.py): TRITON_INTERPRET is read when
the kernel is decorated. The interpreter truncates fp32 -> bf16 stores, so the bf16 outputs sit
about 2x the round-to-nearest error from the reference; the bar is the GPU's, 1e-2.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REL_BAR = 1e-2


@pytest.fixture(scope="module")
def interp_results():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "tests.attention_worker", "interp"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CASES = ["swa_ps256_split", "swa_ps256_nosplit", "c4_ps64_split", "c4_ps64_nosplit", "c4_sm90_tiles",
         "c4_bn32_tiles", "c4_no_prefetch", "c4_wide_prefetch", "c4_wide", "c4_wide_idx_ahead", "c4_H64_default_tiles", "c4_H64_sm90_default", "c128_ps2_H24",
         "c128_ps2_H24_fp16dot", "sink_extremes", "no_sink", "bad_slots_lengths_strided_indices",
         "fp8_views_strided_lengths_and_sink", "c4_T1_small_call_tiles", "c4_T1_small_call_tiles_9_splits"]


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_reference(interp_results, name):
    r = interp_results[name]
    assert r["nan_free"], f"{name}: NaN leaked into a real head"
    assert r["rel"] <= REL_BAR, f"{name}: rel {r['rel']:.3e} > {REL_BAR}"
    assert r["empty_zero"], f"{name}: a row with no valid entry is not exactly 0"
    assert r["lse_ok"], f"{name}: lse differs from the reference"


def test_padded_nan_heads_and_empty_rows_are_covered(interp_results):
    # NaN padded heads: the SWA case has 16 real heads of 32; empty rows: one per holed case.
    assert interp_results["swa_ps256_split"]["shape"][0] == [3, 1, 32, 512]
    assert interp_results["swa_ps256_split"]["empty_rows"] == 1
    assert interp_results["c4_ps64_split"]["empty_rows"] == 1
    assert interp_results["c128_ps2_H24"]["shape"][2] == [2, 24, 1]


def test_harness_runs_the_attention_suite_on_the_interpreter(tmp_path):
    report = tmp_path / "v.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "dsv4kit.validation.harness", "--interpret", "--cases",
                           "attention:c4-T2-H16of32-ps64-x64-L300-holes-empty", "--json", str(report)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(report.read_text())["suites"]["attention"]["rows"]
    kernel = [r for r in rows if r["impl"] == "kernel"]
    assert len(kernel) == 1 and kernel[0]["passed"] and kernel[0]["rel"] <= REL_BAR and kernel[0]["pattern_ok"]
    assert any(r["impl"] == "simt" for r in rows)
