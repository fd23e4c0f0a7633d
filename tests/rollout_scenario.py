"""Runs SGLang 0.5.23's real plugin loader in a fresh process and prints what happened as JSON.

Used by tests/rollout/test_rollout_sglang.py: ``python tests/rollout_scenario.py CALL...`` inside a test
venv where the real SGLang wheel is on PYTHONPATH and the dsv4kit wheel is (or is not) installed.
It calls ``sglang.srt.plugins.load_plugins()`` exactly as SGLang's scheduler process does, then
reports, per target, whether the module attribute SGLang looks up at call time was replaced, and
runs the requested CALLs through those module attributes (as SGLang's dispatch does):

* ``indexer_good`` / ``indexer_bad``: the torch sm_120 indexer target with contract-conforming
  inputs / with 32 index heads instead of 64;
* ``attention_good`` / ``attention_bad`` / ``attention_prefill``: the sparse-MLA target with
  conforming decode inputs / with an fp16 q / with T = 65 rows (beyond SM120_DECODE_MAX_TOKENS);
* ``indexer_fp4_good`` / ``indexer_fp4_bad``: DeepGEMM's FP4 entry (``deep_gemm`` is the stand-in
  package tests/deep_gemm_standin when ``ROLLOUT_STANDIN_DEEPGEMM=1``) with SGLang's eight FP4
  arguments / with the 132-byte FP8 cache view instead of the 68-byte one.

Each call's result is compared with SGLang's own function (the replaced attribute's
``__wrapped__``), which runs on the CPU: the indexer's torch path, and the attention's ``torch``
backend (the test sets ``SGLANG_SM120_FLASHMLA_BACKEND=torch``). dsv4kit kernels run in Triton's
CPU interpreter (the test sets ``TRITON_INTERPRET=1``).

Stand-ins (compiled packages only; every SGLang file stays real): ``torchvision`` always, because
the PyPI torchvision needs a CUDA torch and SGLang's config package imports
``torchvision.transforms`` at import time; ``tilelang`` when ``ROLLOUT_STANDIN_TILELANG=1``, to
make the TileLang target's module importable (tilelang is a TVM-based compiled package). A
stand-in module answers any attribute with an inert placeholder; nothing of it is ever executed
by these calls.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys

import standins  # tests/standins.py (this script's directory is on sys.path)

STANDIN_ROOTS = {"torchvision"}
if os.environ.get("ROLLOUT_STANDIN_TILELANG") == "1":
    STANDIN_ROOTS.add("tilelang")
standins.install(STANDIN_ROOTS)
if os.environ.get("ROLLOUT_STANDIN_DEEPGEMM") == "1":
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "deep_gemm_standin"))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append({"logger": record.name, "level": record.levelname,
                             "message": record.getMessage(),
                             "traceback": bool(record.exc_info)})


TARGETS = {
    "indexer": ("sglang.srt.layers.attention.dsv4.indexer", "fp8_paged_mqa_logits_torch_sm120"),
    "indexer_tilelang": ("sglang.kernels.ops.attention.dsa.tilelang_kernel",
                         "tilelang_fp8_paged_mqa_logits"),
    "attention": ("sglang.kernels.ops.attention.flash_mla_sm120", "flash_mla_with_kvcache_sm120"),
    "indexer_fp4": ("deep_gemm", "fp8_fp4_paged_mqa_logits"),
}


def _attr(key):
    module_name, function = TARGETS[key]
    return getattr(importlib.import_module(module_name), function)


def _stock_of(fn):
    return getattr(fn, "__wrapped__", fn)


def _indexer_call(heads: int) -> dict:
    import torch

    from dsv4kit.kernels.indexer_reference import make_indexer_inputs

    inputs = make_indexer_inputs(batch=3, heads=heads, pages_per_row=2, max_len=100, seed=1)
    fn = _attr("indexer")
    out = fn(*inputs.args())  # positional, as forward_c4_indexer calls it
    ref = _stock_of(fn)(*inputs.args())
    lengths = inputs.seq_lens.long()
    cols = torch.arange(out.shape[1])
    live = cols.unsqueeze(0) < lengths.unsqueeze(1)
    diff = (out - ref).abs()[live]
    scale = ref.abs()[live].max() if live.any() else torch.tensor(1.0)
    # Through SGLang the kernel leaves the tail past L's page unwritten (SGLang masks by length);
    # [L, ceil(L/64)*64) is -inf.
    page_end = (lengths + 63) // 64 * 64
    in_page_tail = ~live & (cols.unsqueeze(0) < page_end.unsqueeze(1))
    return {"shape": list(out.shape), "dtype": str(out.dtype),
            "max_rel_diff": float(diff.max() / scale) if diff.numel() else 0.0,
            "page_tail_neg_inf": bool(torch.isneginf(out[in_page_tail]).all())}


def _indexer_fp4_call(fp8_view: bool) -> dict:
    import torch

    from dsv4kit.kernels.indexer_fp4_reference import make_fp4_inputs

    inputs = make_fp4_inputs(3, 64, 2, 100, seed=1, seq_lens_2d=True)  # [B, 1], as SGLang passes
    args = list(inputs.args())
    if fp8_view:
        args[1] = torch.zeros(4, 64, 1, 132, dtype=torch.uint8)
    fn = _attr("indexer_fp4")
    out = fn(*args)
    ref = _stock_of(fn)(*args)
    live = torch.arange(out.shape[1]).unsqueeze(0) < inputs.seq_lens.long()
    diff = (out - ref).abs()[live]
    return {"shape": list(out.shape), "max_rel_diff": float(diff.max() / ref.abs()[live].max())}


def _attention_call(T: int, dtype=None) -> dict:
    import torch

    from dsv4kit.kernels.sparse_mla_reference import make_inputs

    inputs = make_inputs(T=T, heads=16, padded_heads=16, swa_page_size=64, swa_width=64,
                         seq_lens=[40 + 3 * t for t in range(T)], seed=2)
    kwargs = dict(inputs.kwargs)
    if dtype == "fp16":
        kwargs["q"] = kwargs["q"].to(torch.float16)
    fn = _attr("attention")
    out = fn(**kwargs)[0]  # keyword arguments, as the DeepSeek-V4 backend calls it
    ref = _stock_of(fn)(**kwargs)[0]
    return {"shape": list(out.shape), "dtype": str(out.dtype),
            "max_abs_diff": float((out.float() - ref.float()).abs().max())}


def _indexer_later_calls() -> dict:
    """After a good first call: a call the kernel's own checks refuse (a non-contiguous weight,
    which SGLang's function accepts), then a kernel that breaks (a compile variant failing)."""
    import torch

    from dsv4kit.kernels.indexer_reference import make_indexer_inputs

    inputs = make_indexer_inputs(batch=3, heads=64, pages_per_row=2, max_len=100, seed=1)
    fn = _attr("indexer")
    args = list(inputs.args())
    fn(*args)  # the first call passes the guard
    strided = list(args)
    strided[2] = torch.cat([args[2], args[2][:, :1]], 1)[:, :64]  # same values, not contiguous
    refused = fn(*strided)
    guard = _hook_of(fn)

    def broken(*_args, **_kwargs):
        raise RuntimeError("a compile variant failed")

    guard.kernel = broken
    after_break = fn(*args)
    stock = _stock_of(fn)
    return {"refused_equals_original": bool(torch.equal(refused, stock(*strided))),
            "broken_equals_original": bool(torch.equal(after_break, stock(*args)))}


CALLS = {
    "indexer_later_calls": _indexer_later_calls,
    "indexer_good": lambda: _indexer_call(64),
    "indexer_bad": lambda: _indexer_call(32),
    "attention_good": lambda: _attention_call(2),
    "attention_bad": lambda: _attention_call(2, dtype="fp16"),
    "attention_prefill": lambda: _attention_call(65),
    "indexer_fp4_good": lambda: _indexer_fp4_call(False),
    "indexer_fp4_bad": lambda: _indexer_fp4_call(True),
}


def main(calls) -> dict:
    records = _Records()
    logging.getLogger().addHandler(records)
    logging.getLogger().setLevel(logging.INFO)

    from sglang.srt.plugins import load_plugins

    load_plugins()

    report = {"targets": {}, "calls": {}, "plugin_state": None}
    for key in TARGETS:
        if key == "indexer_tilelang" and "tilelang" not in STANDIN_ROOTS:
            continue
        if key == "indexer_fp4" and os.environ.get("ROLLOUT_STANDIN_DEEPGEMM") != "1":
            continue
        module_name, function = TARGETS[key]
        fn = getattr(importlib.import_module(module_name), function, None)
        if fn is None:
            report["targets"][key] = {"replaced": False, "hook": None, "missing": True}
            continue
        hook = _hook_of(fn)
        report["targets"][key] = {"replaced": hasattr(fn, "__wrapped__"),
                                  "hook": type(hook).__name__ if hook is not None else None}
    fm = importlib.import_module(TARGETS["attention"][0])
    report["SM120_DECODE_MAX_TOKENS"] = getattr(fm, "SM120_DECODE_MAX_TOKENS", None)
    for name in calls:
        try:
            report["calls"][name] = CALLS[name]()
        except Exception as exc:  # reported, the test decides
            report["calls"][name] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        from dsv4kit.rollout.plugin import rollout_state

        report["plugin_state"] = rollout_state()
    except ImportError:
        report["plugin_state"] = None
    report["logs"] = records.records
    return report


def _hook_of(fn):
    """The REPLACE hook SGLang's wrapper calls (from its closure), or None."""
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if type(value).__module__.startswith("dsv4kit"):
            return value
    return None


if __name__ == "__main__":
    result = main(sys.argv[1:])
    sys.stdout.flush()
    print("ROLLOUT-SCENARIO " + json.dumps(result))
