"""The trace parser on traces the REAL torch profiler writes (made here, at test time), the class
table on the names the kernels really carry, and the H200 fixture when it is committed."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4kit.profile import breakdown, classes, trace

FIXTURES = Path(__file__).resolve().parent / "fixtures"
H200_FIXTURE = FIXTURES / "h200_kernels.trace.json.gz"


# Profiled in a child interpreter: the in-process inventory loader imports ansible, which replaces
# sys.intern with an object, and torch's profiler then fails importing torch._dynamo in that process.
PROFILE_SCRIPT = """
import sys
import torch
from torch.profiler import ProfilerActivity, profile, record_function


def fp8_paged_mqa_logits_torch_sm120(k, q):
    # Named like SGLang's torch indexer fallback, so its ops take the indexer class by scope.
    return torch.bmm(k, q).clamp_min(0).sum(-1)


a, k, q = torch.randn(128, 128), torch.randn(4, 512, 128), torch.randn(4, 128, 64)
with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    with record_function("step[EXTEND bs=1 toks=16]"):
        torch.fft.rfft(a)  # only in the prefill step: must not reach the decode breakdown
    for _ in range(3):
        with record_function("step[DECODE bs=4]"):
            b = a @ a
            (b * 2.0).clamp_min(0.0)
            b.clone()
            torch.topk(b[0], 8)
            torch.special.bessel_j0(b)  # a name no rule knows
            fp8_paged_mqa_logits_torch_sm120(k, q)
prof.export_chrome_trace(sys.argv[1])
"""


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> Path:
    """3 decode steps and one prefill step of real ops, profiled by torch 2.13 with stacks (SGLang's
    default), exported as SGLang exports it (gzip Chrome trace)."""
    path = tmp_path_factory.mktemp("trace") / "1700000000.0-TP-0.trace.json.gz"
    subprocess.run([sys.executable, "-c", PROFILE_SCRIPT, str(path)], check=True, timeout=300)
    return path


def test_a_real_cpu_trace_gives_the_decode_breakdown(cpu_trace):
    assert cpu_trace.read_bytes()[:2] == b"\x1f\x8b"
    result = trace.analyze_file(cpu_trace)
    assert result["mode"] == "cpu" and result["decode_steps"] == 3 and result["batch_size"] == 4
    got = result["classes"]
    assert got["dense_gemm"]["impls"] == {"torch": pytest.approx(got["dense_gemm"]["us_per_step"], abs=0.01)}
    assert got["indexer"]["impls"].get("torch", 0) > 0  # bmm/clamp_min/sum inside the fallback's scope
    assert got["elementwise"]["us_per_step"] > 0 and got["memcpy"]["us_per_step"] > 0
    assert got["topk"]["impls"].get("torch", 0) > 0
    names = [u["name"] for u in result["unknown"]]
    assert "aten::special_bessel_j0" in names and not any("fft" in n for n in names)
    assert result["step_time_ms"] > 0 and result["trace_tok_s"] > 0
    assert abs(sum(c["share"] for c in got.values()) - 1.0) < 1e-3


def test_ranks_combine_and_the_gate_reads_the_shares(cpu_trace):
    one = trace.analyze_file(cpu_trace)
    combined = breakdown.combine([one, one], context_length=4096)
    assert combined["ranks"] == 2
    assert combined["classes"]["indexer"]["us_per_step"] == pytest.approx(one["classes"]["indexer"]["us_per_step"])
    text = breakdown.format_table(combined)
    assert "indexer" in text and "not in the class table" in text
    share = combined["classes"]["indexer"]["share"]
    assert breakdown.check_shares(combined, breakdown.parse_share_limits([f"indexer={100 * share + 1:.2f}%"])) == []
    assert breakdown.check_shares(combined, breakdown.parse_share_limits(["indexer=0%"]))
    assert breakdown.parse_share_limits(["MoE GEMM=0.3"]) == {"moe_gemm": 0.3}


def test_an_interpreted_triton_kernel_leaves_only_host_ops(tmp_path):
    """Under TRITON_INTERPRET a Triton kernel runs as Python and numpy: torch's
    profiler records no event named after it, only the host ops around it. The parser still reads
    the trace; on the GPU the kernel is a ``kernel`` event under its @triton.jit name."""
    script = """
import json, sys
import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile, record_function


@triton.jit
def _twice_kernel(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)


x, y = torch.randn(256), torch.empty(256)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    with record_function("step[DECODE bs=1]"):
        _twice_kernel[(2,)](x, y, 256, BLOCK=128)
prof.export_chrome_trace(sys.argv[1])
assert torch.equal(y, x * 2)
"""
    path = tmp_path / "t.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=300, env=env)
    data = json.loads(path.read_text())
    assert not any("_twice_kernel" in str(e.get("name")) for e in data["traceEvents"])
    assert trace.analyze(data)["decode_steps"] == 1


def _gpu_event(name, ts, dur, corr, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "device": 0, "stream": 7}}


def test_gpu_kernels_follow_their_launch_into_the_decode_step():
    """The GPU shape of a torch trace (kernel events tied by ``correlation`` to a cudaGraphLaunch
    inside SGLang's step span); hand-made here, the H200 fixture below is the real one."""
    host = 100
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "step[EXTEND bs=1 toks=64]", "pid": host, "tid": 1, "ts": 0, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": host, "tid": 1, "ts": 10, "dur": 2, "args": {"correlation": 1}},
        {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=8]", "pid": host, "tid": 1, "ts": 100, "dur": 20},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": host, "tid": 1, "ts": 105, "dur": 5, "args": {"correlation": 2}},
        _gpu_event("fused_moe_kernel", 1000, 300, 1),  # the prefill's: not counted
        _gpu_event("_indexer_logits_kernel", 1100, 10, 2),
        _gpu_event("_sparse_mla_decode_kernel", 1110, 40, 2),
        _gpu_event("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1150, 30, 2),
        _gpu_event("Memcpy DtoD (Device -> Device)", 1180, 5, 2, cat="gpu_memcpy"),
        _gpu_event("brand_new_kernel", 1185, 15, 2),
    ]
    result = trace.analyze({"traceEvents": events})
    assert result["mode"] == "gpu" and result["decode_steps"] == 1 and result["batch_size"] == 8
    got = {k: v["us_per_step"] for k, v in result["classes"].items() if v["us_per_step"]}
    assert got == {"indexer": 10, "attention": 40, "nccl": 30, "memcpy": 5, "other": 15}
    assert result["step_time_ms"] == pytest.approx(0.1)  # first kernel start to last kernel end
    assert result["unknown"] == [{"name": "brand_new_kernel", "us_per_step": 15}]


@pytest.mark.parametrize("name, klass, impl", [
    ("_indexer_logits_kernel", "indexer", "ours"),
    ("_sparse_mla_decode_kernel", "attention", "ours"),
    ("_sparse_mla_decode_wide_kernel", "attention", "ours"),
    ("_combine_splits_kernel", "attention", "ours"),
    ("fp8_paged_mqa_logits_kernel", "indexer", "tilelang"),
    ("_tiled_sparse_decode_kernel", "attention", "triton"),
    ("_page_mark_kernel", "attention", "flashinfer"),
    ("void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8>, true>(Flash_fwd_mla_params)",
     "attention", "flashmla"),
    ("topk_transform_kernel", "topk", "sglang"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float, unsigned int>)",
     "topk", "torch"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl", "nccl"),
    ("void marlin_moe_wna16::Marlin<(vllm::ScalarTypeId)5, 256, 1, 8, 8, 4, false>()", "moe_gemm", "sglang"),
    ("fused_moe_kernel", "moe_gemm", "sglang"),
    ("void moe_align_block_size_kernel<int>(int const*, int*)", "elementwise", "moe routing"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "dense_gemm", "cublas/cutlass"),
    ("nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NTN", "dense_gemm", "cublas/cutlass"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::clamp_min_scalar_kernel_impl"
     "(at::TensorIteratorBase&, c10::Scalar)::{lambda()#1}::operator()() const::{lambda()#8}::operator()() const::"
     "{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, ...)", "elementwise", "glue"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>", "memcpy", "copy"),
    ("Memcpy DtoD (Device -> Device)", "memcpy", "copy"),
    ("aten::copy_", "memcpy", "copy"),
    ("aten::bmm", "dense_gemm", "torch"),
    ("aten::clamp_min", "elementwise", "glue"),
    ("a_kernel_nobody_knows", "other", ""),
])
def test_kernel_names_map_to_their_class(name, klass, impl):
    assert classes.classify(name) == (klass, impl)


def test_the_class_table_names_our_kernels_by_their_triton_names():
    """Every @triton.jit kernel of dsv4kit.kernels that is launched (a *_kernel) is in the table as ours."""
    import re

    root = Path(__file__).resolve().parents[2] / "kernels"
    names = set()
    for path in root.glob("*.py"):
        names.update(re.findall(r"@triton\.jit[^\n]*\n\s*def (_\w+_kernel)\(", path.read_text()))
    assert names, "no @triton.jit kernels found"
    for name in sorted(names):
        assert classes.classify(name)[1] == "ours", name


def test_the_h200_fixture_parses_into_known_classes():
    """A real H200 trace (validation/profile_trace.py): our indexer and attention beside TileLang's
    indexer and FlashMLA, inside CUDA graphs; every kernel of those four has a class."""
    with gzip.open(H200_FIXTURE, "rt") as fh:
        data = json.load(fh)
    meta = data.get("dsv4kit", {})
    assert meta.get("command") and meta.get("device")
    result = trace.analyze(data)
    assert result["mode"] == "gpu" and result["decode_steps"]
    impls = {(k, i) for k, v in result["classes"].items() for i, us in v["impls"].items() if us}
    expected = {"indexer:dsv4kit": ("indexer", "ours"), "indexer:sglang-tilelang": ("indexer", "tilelang"),
                "attention:dsv4kit": ("attention", "ours"), "attention:sglang-triton-sm120": ("attention", "triton"),
                "attention:flashmla-sm90": ("attention", "flashmla"),
                "attention:flashinfer-sm120": ("attention", "flashinfer")}
    assert {"indexer:dsv4kit", "attention:dsv4kit"} <= set(meta["graphs"])
    for label in meta["graphs"]:
        assert expected[label] in impls, f"{label}: its kernels are not classified as {expected[label]}: {result['unknown']}"


def test_the_documented_table_is_the_module_table():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "profiling.md").read_text()
    start, end = "<!-- kernel-classes:start -->\n", "\n<!-- kernel-classes:end -->"
    assert doc.split(start, 1)[1].split(end, 1)[0] == classes.markdown_table(), \
        "regenerate the table in docs/profiling.md with python -m dsv4kit.profile.classes"
