"""The dsv4kit plugin under SGLang 0.5.23's real plugin loader and hook registry.

Each scenario is a fresh process (tests/rollout_scenario.py) in a venv without system
site-packages that sees: the real SGLang 0.5.23 wheel, unpacked, on PYTHONPATH (or a symlinked
copy of it with one file or its version changed); the test venv's torch 2.13 CPU, triton and
SGLang's import chain (the sglang-chain extra; tests/sglang_wheel.py); and the dsv4kit wheel of this
checkout, installed with ``pip install --no-deps`` (or installed and then uninstalled). SGLang's
``load_plugins()`` finds our entry point through ``importlib.metadata`` as on the box.

Stand-ins, for compiled packages only (see tests/rollout_scenario.py): ``torchvision`` (the PyPI
build needs CUDA torch) and, where a scenario says so, ``tilelang``.

The scenarios run concurrently in one session fixture (each spends ~15 s importing SGLang).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import sglang_wheel

SCENARIO = Path(__file__).resolve().parents[1] / "rollout_scenario.py"
INDEXER = "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120"
TILELANG = "sglang.kernels.ops.attention.dsa.tilelang_kernel.tilelang_fp8_paged_mqa_logits"
ATTENTION = "sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120"
FP4 = "deep_gemm.fp8_fp4_paged_mqa_logits"
# DeepGEMM (compiled, CUDA) is the stand-in package tests/deep_gemm_standin in every scenario.
FLAGS_ON = {"SGLANG_SM120_TRITON_INDEXER": "1", "SGLANG_SM120_MMA_ATTENTION": "1",
            "ROLLOUT_STANDIN_DEEPGEMM": "1"}
GOOD_CALLS = ["indexer_good", "indexer_good", "attention_prefill", "attention_good",
              "attention_good", "indexer_fp4_good", "indexer_fp4_good"]


def _drift_edits():
    """An SGLang whose torch indexer moved away and whose attention entry changed its signature."""
    def drop_indexer(text):
        old = "def fp8_paged_mqa_logits_torch_sm120("
        assert old in text
        return text.replace(old, "def fp8_paged_mqa_logits_torch_sm120_moved(")

    def change_attention(text):
        old = "def flash_mla_with_kvcache_sm120(**kwargs):"
        assert old in text
        return text.replace(old, "def flash_mla_with_kvcache_sm120(q, **kwargs):")

    return {"sglang/srt/layers/attention/dsv4/indexer.py": drop_indexer,
            "sglang/kernels/ops/attention/flash_mla_sm120.py": change_attention}


def _scenarios(base: Path) -> dict:
    stock = sglang_wheel.sglang_site()
    venv = sglang_wheel.session_venv(base, "sglang-venv")
    # Installed, then removed again with pip: the rollback path.
    removed = sglang_wheel.session_venv(base, "sglang-venv-removed")
    sglang_wheel.pip_into(removed, "uninstall", "-y", "-q", "dsv4kit")
    newer = sglang_wheel.sglang_variant(base / "sglang-0.5.24", version="0.5.24")
    drift = sglang_wheel.sglang_variant(base / "sglang-drift", edits=_drift_edits())
    return {
        "on": (venv, stock, dict(FLAGS_ON, ROLLOUT_STANDIN_TILELANG="1"), GOOD_CALLS),
        "bad_first_call": (venv, stock, dict(FLAGS_ON),
                           ["indexer_bad", "indexer_good", "attention_bad", "attention_good",
                            "indexer_fp4_bad", "indexer_fp4_good"]),
        "later_calls": (venv, stock, dict(FLAGS_ON), ["indexer_later_calls"]),
        "flags_unset": (venv, stock, {"ROLLOUT_STANDIN_TILELANG": "1", "ROLLOUT_STANDIN_DEEPGEMM": "1"},
                        ["indexer_good", "attention_good"]),
        "unsupported_version": (venv, newer, dict(FLAGS_ON, ROLLOUT_STANDIN_TILELANG="1"),
                                ["indexer_good"]),
        "drift": (venv, drift, dict(FLAGS_ON, ROLLOUT_STANDIN_TILELANG="1"), []),
        "uninstalled": (removed, stock, dict(FLAGS_ON, ROLLOUT_STANDIN_TILELANG="1"), []),
    }


@pytest.fixture(scope="session")
def scenarios(tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "rollout"
    base.mkdir(exist_ok=True)
    plans = _scenarios(base)
    env_base = {k: v for k, v in os.environ.items()
                if not k.startswith(("SGLANG_", "TRITON_", "ROLLOUT_", "PYTHON"))}
    env_base.update(TRITON_INTERPRET="1", SGLANG_SM120_FLASHMLA_BACKEND="torch",
                    PYTHONWARNINGS="ignore")
    pending = list(plans.items())
    running, results = {}, {}
    deadline = time.monotonic() + 420
    while pending or running:
        while pending and len(running) < 3:
            name, (python, site, env, calls) = pending.pop(0)
            log = open(base / f"{name}.log", "w+")
            proc = subprocess.Popen([str(python), str(SCENARIO), *calls],
                                    env=dict(env_base, PYTHONPATH=str(site), **env),
                                    stdout=log, stderr=subprocess.STDOUT, cwd=base)
            running[name] = (proc, log)
        for name, (proc, log) in list(running.items()):
            if proc.poll() is None:
                if time.monotonic() > deadline:
                    proc.kill()
                else:
                    continue
            proc.wait()
            log.seek(0)
            text = log.read()
            log.close()
            lines = [x for x in text.splitlines() if x.startswith("ROLLOUT-SCENARIO ")]
            results[name] = (json.loads(lines[-1].split(" ", 1)[1]) if lines and proc.returncode == 0
                             else {"error": f"exit {proc.returncode}", "output": text[-4000:]})
            del running[name]
        time.sleep(0.2)
    return results


def _get(scenarios, name) -> dict:
    result = scenarios[name]
    assert "error" not in result, f"scenario {name} failed:\n{result.get('output')}"
    return result


def _ours(result, level=None) -> list:
    return [r for r in result["logs"] if r["logger"].startswith("dsv4kit")
            and (level is None or r["level"] == level)]


def _no_tracebacks(result):
    bad = [r for r in result["logs"] if r["traceback"] or r["level"] in ("ERROR", "CRITICAL")]
    assert not bad, bad


def test_flags_on_replace_every_target_and_the_kernels_serve_the_calls(scenarios):
    result = _get(scenarios, "on")
    assert result["targets"] == {
        "indexer": {"replaced": True, "hook": "_IndexerGuard"},
        "indexer_tilelang": {"replaced": True, "hook": "_IndexerGuard"},
        "attention": {"replaced": True, "hook": "_AttentionGuard"},
        "indexer_fp4": {"replaced": True, "hook": "_Fp4IndexerGuard"},
    }
    state = result["plugin_state"]
    assert state["indexer"] == {"status": "kernel", "reason": None, "kernel_calls": 2,
                                "original_calls": 0}
    # T = 65 > SM120_DECODE_MAX_TOKENS went to SGLang's original, the decode calls to the kernel.
    assert state["attention"] == {"status": "kernel", "reason": None, "kernel_calls": 2,
                                  "original_calls": 1}
    assert state["indexer_tilelang"]["status"] == "hooked"  # never called here
    assert result["SM120_DECODE_MAX_TOKENS"] == 64  # kept for the backend and the model
    calls = result["calls"]
    # The dsv4kit kernels (Triton interpreter) agree with SGLang's own torch paths.
    assert calls["indexer_good"]["shape"] == [3, 128] and calls["indexer_good"]["page_tail_neg_inf"]
    assert calls["indexer_good"]["max_rel_diff"] < 1e-2  # SGLang's path rounds dots to bf16
    assert calls["attention_good"]["shape"] == [2, 1, 16, 512]
    assert calls["attention_good"]["dtype"] == "torch.bfloat16"
    assert calls["attention_good"]["max_abs_diff"] <= 0.125  # bf16 outputs of magnitude ~4
    assert calls["attention_prefill"]["max_abs_diff"] == 0.0  # the original itself
    # SGLang's registry applied our three hooks; our log says what serves each target.
    applied = [r["message"] for r in result["logs"] if r["message"].startswith("Applied 1 hook(s)")]
    assert sorted(m.split(" to ")[1].split(" ")[0] for m in applied) == sorted(
        [INDEXER, TILELANG, ATTENTION, FP4])
    served = [r["message"] for r in _ours(result) if "now served by" in r["message"]]
    assert len(served) == 3 and any(INDEXER in m for m in served) and any(ATTENTION in m for m in served)
    # DeepGEMM's FP4 entry (a pybind-style function: parameters read from its docstring) is ours
    # from its first call, agreeing with the stand-in's float64 logits.
    assert any(FP4 in m and "indexer_fp4:fp8_fp4_paged_mqa_logits_for_sglang" in m for m in served)
    assert state["indexer_fp4"] == {"status": "kernel", "reason": None, "kernel_calls": 2,
                                    "original_calls": 0}
    assert calls["indexer_fp4_good"]["shape"] == [3, 128]
    assert calls["indexer_fp4_good"]["max_rel_diff"] < 1e-5
    assert not _ours(result, "WARNING")
    _no_tracebacks(result)


def test_first_call_contract_mismatch_falls_back_to_the_original_for_good(scenarios):
    result = _get(scenarios, "bad_first_call")
    state = result["plugin_state"]
    assert state["indexer"]["status"] == "fallback"
    assert "q_fp8 is float8_e4m3fn [3, 1, 32, 128], expected float8_e4m3fn [B, 1, 64, 128]" in \
        state["indexer"]["reason"]
    assert state["attention"]["status"] == "fallback"
    assert "q is float16" in state["attention"]["reason"]
    # The later, conforming calls still go to the original: the fallback is permanent.
    assert state["indexer"]["kernel_calls"] == 0 and state["indexer"]["original_calls"] == 2
    assert state["attention"]["kernel_calls"] == 0 and state["attention"]["original_calls"] == 2
    assert "error" not in result["calls"]["indexer_good"]
    assert result["calls"]["indexer_good"]["max_rel_diff"] == 0.0
    assert result["calls"]["attention_good"]["max_abs_diff"] == 0.0
    # The FP4 entry given the 132-byte FP8 cache view: the original serves it, then for good.
    assert state["indexer_fp4"]["status"] == "fallback"
    assert "kv_cache is uint8 [4, 64, 1, 132], expected uint8 [pages, 64, 1, 68]" in \
        state["indexer_fp4"]["reason"]
    assert state["indexer_fp4"]["kernel_calls"] == 0 and state["indexer_fp4"]["original_calls"] == 2
    warnings = [r["message"] for r in _ours(result, "WARNING")]
    # Without tilelang the TileLang target is skipped (one line), then one line per fallback.
    assert len(warnings) == 4, warnings
    assert any(FP4 in w and "falls back to SGLang's original" in w for w in warnings)
    assert any(TILELANG in w and "tilelang is not importable" in w for w in warnings)
    assert any(INDEXER in w and "falls back to SGLang's original" in w for w in warnings)
    assert any(ATTENTION in w and "falls back to SGLang's original" in w for w in warnings)
    assert all("\n" not in w for w in warnings)
    _no_tracebacks(result)


def test_later_calls_the_kernel_refuses_or_breaks_go_to_the_original(scenarios):
    result = _get(scenarios, "later_calls")
    calls = result["calls"]["indexer_later_calls"]
    assert "error" not in calls, calls  # SGLang never sees our exception
    assert calls["refused_equals_original"] and calls["broken_equals_original"]
    state = result["plugin_state"]["indexer"]
    # A refused call is served by the original and the kernel stays on; a kernel that breaks
    # hands the target back to the original for the rest of the process.
    assert state["refused_calls"] == 1 and "weight must be contiguous" in state["last_refusal"]
    assert state["status"] == "fallback" and "a later call" in state["reason"]
    assert "a compile variant failed" in state["reason"]
    assert state["kernel_calls"] == 1 and state["original_calls"] == 2
    warnings = [r["message"] for r in _ours(result, "WARNING")]
    assert any("refused a call" in w for w in warnings) and any("falls back" in w for w in warnings)
    _no_tracebacks(result)


def test_flags_unset_leave_sglang_stock_and_quiet(scenarios):
    result = _get(scenarios, "flags_unset")
    assert result["targets"] == {key: {"replaced": False, "hook": None}
                                 for key in ("indexer", "indexer_tilelang", "attention", "indexer_fp4")}
    assert result["plugin_state"] == {}
    assert not _ours(result)
    assert result["calls"]["indexer_good"]["max_rel_diff"] == 0.0
    _no_tracebacks(result)


def test_unsupported_sglang_version_stays_stock_with_one_line(scenarios):
    result = _get(scenarios, "unsupported_version")
    assert not any(t["replaced"] for t in result["targets"].values())
    warnings = [r["message"] for r in _ours(result, "WARNING")]
    assert len(warnings) == 1, warnings
    assert "SGLang 0.5.24 is not a supported version (supported: 0.5.23)" in warnings[0]
    assert all(target in warnings[0] for target in (INDEXER, TILELANG, ATTENTION, FP4))
    _no_tracebacks(result)


def test_missing_target_or_changed_signature_stays_stock_per_target(scenarios):
    result = _get(scenarios, "drift")
    assert result["targets"]["indexer"] == {"replaced": False, "hook": None, "missing": True}
    assert result["targets"]["attention"]["replaced"] is False
    assert result["targets"]["indexer_tilelang"]["replaced"] is True  # unaffected target still goes
    assert result["targets"]["indexer_fp4"]["replaced"] is True
    warnings = [r["message"] for r in _ours(result, "WARNING")]
    assert len(warnings) == 2, warnings
    assert any(INDEXER in w and "has no fp8_paged_mqa_logits_torch_sm120" in w for w in warnings)
    assert any(ATTENTION in w and "signature is (q, **kwargs), dsv4kit expects (**kwargs)" in w
               for w in warnings)
    _no_tracebacks(result)


def test_uninstalling_the_wheel_rolls_back(scenarios):
    result = _get(scenarios, "uninstalled")
    assert not any(t["replaced"] for t in result["targets"].values())
    assert result["plugin_state"] is None  # dsv4kit is gone from the venv
    assert not any("dsv4kit" in r["message"] for r in result["logs"])
    _no_tracebacks(result)
