"""Ahead-of-time builds of the fused decode kernel for sm_120 and sm_90 (no GPU needed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SM120_SHARED_LIMIT = 101376


@pytest.fixture(scope="module")
def aot_results():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.attention_worker", "aot"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["sm120_c4_split_H64", "sm120_c128_nosplit_H16", "sm120_c4_small_call_H64"])
def test_sm120_build_uses_mma_and_fits_shared_memory(aot_results, name):
    r = aot_results[name]
    assert r["mma_sync"], f"{name}: no mma.sync in the PTX"
    assert any("bf16" in kind for kind in r["mma_kinds"]), r["mma_kinds"]
    assert r["shared_bytes"] <= SM120_SHARED_LIMIT, f"{name}: {r['shared_bytes']} B of shared memory"


@pytest.mark.parametrize("name", ["sm90_c4_split_H64", "sm90_c4_nosplit_H32", "sm90_c4_small_call_H64"])
def test_sm90_build(aot_results, name):
    r = aot_results[name]
    assert r["mma_sync"] or r["wgmma"]
    assert r["shared_bytes"] <= 232448


@pytest.mark.parametrize("name", ["sm120_combine", "sm120_combine_32_splits"])
def test_sm120_combine_build(aot_results, name):
    r = aot_results[name]
    assert r["ptx"] and r["shared_bytes"] <= SM120_SHARED_LIMIT


def test_every_mma_sync_sweep_variant_builds_for_sm120(aot_results):
    """``bench_attention --sweep --mma-sync`` stands in for the RTX PRO 6000: each shape it times must
    be one sm_120 can run (mma.sync, within the shared-memory budget)."""
    from dsv4kit.validation.bench_attention import sm120_variants

    names = [f"sm120_sweep_{name}" for name, cfg, _ in sm120_variants()[1:] if f"sm120_sweep_{name}" in aot_results]
    assert len(names) >= 5
    for name in names:
        r = aot_results[name]
        assert r["mma_sync"] and not r["wgmma"], name
        assert r["shared_bytes"] <= SM120_SHARED_LIMIT, f"{name}: {r['shared_bytes']} B of shared memory"
