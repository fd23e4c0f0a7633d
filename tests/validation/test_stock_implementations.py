"""SGLang 0.5.23's own implementations, loaded unmodified from the real wheel, beside ours.

Runs in subprocesses with ``TRITON_INTERPRET=1`` and ``DSV4KIT_SGLANG_SOURCE`` set to the unpacked
wheel (tests/sglang_wheel.py): SGLang is not installed here, exactly as on the benchmark GPU.
"""

import json
import os
import subprocess
import sys

import pytest

from tests import sglang_wheel


def _run(script: str, source=None, timeout: float = 600) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSV4KIT_SGLANG_SOURCE")}
    env["TRITON_INTERPRET"] = "1"
    if source is not None:
        env["DSV4KIT_SGLANG_SOURCE"] = str(source)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def source():
    return sglang_wheel.sglang_site()


INDEXER = r"""
import json, sys, torch
from dsv4kit.kernels import indexer_reference as ref
from dsv4kit.validation.implementations import Implementation, implementations
loaded, missing = implementations("indexer", "cpu")
by_name = {i.name: i for i in loaded}
inputs = ref.make_indexer_inputs(5, 64, 6, 380, seed=3, device="cpu")
exact = ref.exact_logits_f64(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                             inputs.page_table, inputs.max_seq_len)
theirs = by_name["sglang-torch"].fn(*inputs.args())
ours = by_name["dsv4kit"].fn(*inputs.args())
print(json.dumps({
    "loaded": {i.name: [i.stock_default, i.origin, i.tail] for i in loaded},
    "missing": missing,
    "same_as_our_copy": bool(torch.equal(theirs, ref.fallback_logits(*inputs.args()))),
    "theirs": ref.compare(theirs, exact, inputs.seq_lens, tail=by_name["sglang-torch"].tail),
    "ours": ref.compare(ours, exact, inputs.seq_lens, tail=by_name["dsv4kit"].tail),
    "sglang_modules_left": sorted(m for m in sys.modules if m.split(".")[0] == "sglang"),
    "frozen": Implementation.__dataclass_params__.frozen,
}))
"""


def test_indexer_torch_fallback_runs_from_the_wheel_beside_ours(source):
    got = _run(INDEXER, source)
    assert got["frozen"]
    assert got["loaded"]["dsv4kit"] == [False, "dsv4kit", "page"]
    stock_default, origin, tail = got["loaded"]["sglang-torch"]
    assert not stock_default and origin == f"wheel:{source}" and tail == "exact"
    assert got["missing"] == {"sglang-tilelang": "not available: needs a CUDA GPU"}
    # SGLang's own function (compiled from the wheel's file) is bitwise our documented copy.
    assert got["same_as_our_copy"]
    assert got["theirs"]["pattern_ok"] and 1e-4 < got["theirs"]["rel"] < 5e-3  # bf16 scores
    assert got["ours"]["pattern_ok"] and got["ours"]["rel"] < 1e-6
    assert got["sglang_modules_left"] == []  # the stand-ins are gone after loading


ATTENTION = r"""
import json, sys
from dsv4kit.kernels.sparse_mla_reference import compare, make_inputs, sparse_mla_reference
from dsv4kit.validation.implementations import implementations
loaded, missing = implementations("attention", "cpu")
by_name = {i.name: i for i in loaded}
inputs = make_inputs(T=2, heads=16, padded_heads=64, swa_page_size=256, extra="c4", extra_width=64,
                     seq_lens=[300, 40], seed=1, device="cpu")
ref, _ = sparse_mla_reference(**inputs.kwargs)
out, _ = by_name["sglang-torch"].fn(**inputs.kwargs)
print(json.dumps({"loaded": {i.name: [i.stock_default, i.origin] for i in loaded},
                  "missing": missing, "stats": compare(out, ref, 16),
                  "sglang_modules_left": sorted(m for m in sys.modules if m.split(".")[0] == "sglang")}))
"""


def test_attention_torch_path_runs_from_the_wheel_and_the_rest_say_why_not(source):
    got = _run(ATTENTION, source)
    assert set(got["loaded"]) == {"dsv4kit", "sglang-torch"}
    assert got["loaded"]["sglang-torch"] == [False, f"wheel:{source}"]
    assert got["missing"]["flashinfer-sm120"] == "not available: needs sm_120"
    assert got["missing"]["flashmla-sm90"].startswith("not available: needs sm_90")
    assert got["missing"]["sglang-triton-sm120"] == "not available: needs a CUDA GPU"
    assert got["stats"]["nan_free"] and got["stats"]["rel"] < 1e-2
    assert got["sglang_modules_left"] == []


NOTHING = r"""
import json
from dsv4kit.validation.implementations import implementations
print(json.dumps([implementations(t, "cpu")[1] for t in ("indexer", "attention")]))
"""


def test_without_sglang_or_a_source_every_stock_implementation_says_how_to_get_it():
    indexer, attention = _run(NOTHING)
    assert "DSV4KIT_SGLANG_SOURCE is not set" in indexer["sglang-torch"]
    assert "DSV4KIT_SGLANG_SOURCE is not set" in attention["sglang-torch"]


def test_a_source_without_sglang_is_named(tmp_path):
    indexer, _ = _run(NOTHING, tmp_path)
    assert f"DSV4KIT_SGLANG_SOURCE={tmp_path} holds no sglang/ folder" in indexer["sglang-torch"]


def test_another_installed_sglang_version_is_refused(monkeypatch):
    import importlib.metadata

    from dsv4kit.validation import sglang_stock

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.24")
    with pytest.raises(sglang_stock.StockUnavailable, match="SGLang 0.5.24 is installed"):
        sglang_stock.origin()


def test_unknown_target_is_refused():
    from dsv4kit.validation.implementations import implementations

    with pytest.raises(ValueError, match="target must be one of"):
        implementations("topk", "cpu")


def test_flashmla_is_called_as_sglangs_sm90_backend_calls_it():
    import types

    import torch

    from dsv4kit.validation.implementations import _flashmla_call

    calls, made = [], []

    def get_mla_metadata():
        made.append(object())
        return made[-1], None

    interface = types.SimpleNamespace(get_mla_metadata=get_mla_metadata,
                                      flash_mla_with_kvcache=lambda **kw: calls.append(kw) or ("out", "lse"))
    call = _flashmla_call(interface)
    lengths = torch.ones(2, dtype=torch.int32)
    kw = dict(q=torch.zeros(2, 1, 64, 512), k_cache=torch.zeros(3, 256, 1, 584), head_dim_v=512,
              softmax_scale=0.5, indices=torch.zeros(2, 1, 128, dtype=torch.int32), topk_length=lengths,
              attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, extra_topk_length=None)
    assert call(**kw) == ("out", "lse")
    call(**kw)  # same shapes and length tensors: the same scheduler object, as across layers
    call(**dict(kw, topk_length=lengths.clone()))  # other lengths: a new one
    assert len(made) == 2
    assert calls[0]["tile_scheduler_metadata"] is calls[1]["tile_scheduler_metadata"] is made[0]
    assert calls[2]["tile_scheduler_metadata"] is made[1]
    assert all(c["use_legacy"] and c["is_fp8_kvcache"] and c["block_table"] is None for c in calls)


def test_sm120_backends_get_their_positional_order():
    from dsv4kit.validation.implementations import _sm120_positional

    seen = []
    call = _sm120_positional(lambda *args: seen.append(args) or ("out", "lse"))
    call(q="q", k_cache="k", head_dim_v=512, softmax_scale=0.1, indices="i", topk_length="t",
         attn_sink="s", extra_k_cache="ek", extra_indices_in_kvcache="ei", extra_topk_length="et")
    assert seen == [("q", "k", "i", "t", "s", 512, 0.1, "ek", "ei", "et")]
