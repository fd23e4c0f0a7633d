"""The kernel-class table against the kernel names SGLang 0.5.23 and its FlashInfer run on sm_120.

SGLang's own names are read from the 0.5.23 wheel (its JIT CUDA for DeepSeek-V4 and the Triton
kernels of the DSV4 backend and the block-FP8 GEMM). FlashInfer 0.7.2's names (the version 0.5.23
pins) are listed here as they appear in its headers; its wheel is not part of the test cache."""

import ast
import re

import pytest

from dsv4kit.profile.classes import classify
from tests import sglang_wheel

_GLOBAL = re.compile(r"(?:__global__|TOPK_KERNEL)[^;{(]*?\b(\w+)\s*\(")
_QUALIFIERS = {"__launch_bounds__", "__cluster_dims__", "void"}

#: What SGLang 0.5.23 runs on sm_120 besides attention, by file: the class each kernel must take.
SGLANG_TRITON = {
    "kernels/ops/attention/dsv4/attn_metadata_kernels.py": "elementwise",
    "kernels/ops/attention/dsv4/metadata_kernel.py": "elementwise",
    "kernels/ops/attention/dsv4/rope.py": "elementwise",
    "kernels/ops/attention/dsv4/kv_norm_rope_store.py": "elementwise",
    "kernels/ops/attention/dsv4/sparse_prefill_kernels.py": "elementwise",
    "kernels/ops/gemm/fp8_kernel.py": "dense_gemm",
    "kernels/ops/attention/flash_mla_sm120_triton.py": "attention",
}
#: FlashInfer 0.7.2 kernels (include/flashinfer/{norm,activation,pos_enc,sampling}.cuh, comm/, attention/sparse_mla_sm120).
FLASHINFER = {
    "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, float)": "elementwise",
    "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)": "elementwise",
    "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(...)": "elementwise",
    "void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u>(...)": "elementwise",
    "void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u>(...)": "elementwise",
    "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16>(...)": "nccl",
    "void flashinfer::sparse_mla_sm120::sparse_mla_decode_dsv4_nvfp4_kernel<64>(...)": "attention",
    "bmm_E2m1_E2m1E2m1_Fp32_t128x8x512u2_s3_et128x8_m128x8x64_cga1x1x1_16dp256b_TN_transOut_schedS_swiGlu_sm120a": "moe_gemm",
    "void moe::dev::finalize::finalizeKernel<moe::dev::finalize::KernelParams<__nv_bfloat16>>(...)": "moe_gemm",
    "void moe::dev::routing::routingRenormalize::routingIndicesClusterKernel<...>(...)": "elementwise",
}


def _jit_kernels(site):
    names = {}
    for path in sorted((site / "kernels/jit/csrc/deepseek_v4").glob("*.cuh")):
        if "hip" in path.name or "gfx" in path.name:
            continue
        text = re.sub(r"#define[^\n]*|//[^\n]*", "", path.read_text())
        for match in _GLOBAL.finditer(text):
            if match.group(1) not in _QUALIFIERS:
                names[match.group(1)] = path.name
    return names


def _triton_kernels(source: str):
    return [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)
            and any("jit" in ast.unparse(d) for d in n.decorator_list)]


def test_sglangs_dsv4_jit_kernels_all_have_a_class_and_none_is_attention():
    site = sglang_wheel.sglang_site() / "sglang"
    names = _jit_kernels(site)
    assert {"fused_store_indexer_cache", "fused_store_flashmla_cache", "topk_transform_kernel"} <= set(names)
    wrong = {n: (f, classify(n)) for n, f in names.items() if classify(n)[0] in ("other", "attention")}
    assert not wrong, wrong


@pytest.mark.parametrize("rel, klass", sorted(SGLANG_TRITON.items()))
def test_sglangs_triton_kernels_take_their_class(rel, klass):
    site = sglang_wheel.sglang_site() / "sglang"
    kernels = _triton_kernels((site / rel).read_text())
    assert kernels, rel
    assert {n: classify(n)[0] for n in kernels} == {n: klass for n in kernels}


@pytest.mark.parametrize("name, klass", sorted(FLASHINFER.items()))
def test_flashinfer_kernels_are_attention_only_when_they_are(name, klass):
    assert classify(name)[0] == klass, classify(name)
