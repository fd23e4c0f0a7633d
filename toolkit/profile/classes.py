"""The one table that maps a kernel (or op) name from a torch-profiler trace to a kernel class.

``RULES`` is read top to bottom; the first pattern that matches names the class and the
implementation. A name no rule matches is ``other`` and is listed in the breakdown. The table in
docs/profiling.md is generated from ``RULES`` (``markdown_table``) and a test keeps the two equal.

``SCOPES`` covers what a name alone cannot tell: SGLang's torch fallbacks run generic aten kernels
(copies, multiplies, a bf16 ``bmm``), so a kernel launched inside one of these Python functions
(the trace's ``python_function`` events, present only in a trace taken with stacks; ``dsv4kit
profile`` asks for none) takes the scope's class. Otherwise, and inside a CUDA graph, the fallbacks
show up by their kernel names (elementwise, dense GEMM, copies); the breakdown says when no
indexer kernel ran by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Display order, and the label each class has in tables and plots.
CLASSES = {
    "moe_gemm": "MoE GEMM",
    "dense_gemm": "dense GEMM",
    "nccl": "NCCL / all-reduce",
    "attention": "sparse-MLA attention",
    "indexer": "indexer",
    "topk": "top-k",
    "elementwise": "elementwise / glue",
    "memcpy": "memory copies",
    "other": "other",
}


@dataclass(frozen=True)
class Rule:
    klass: str
    impl: str
    pattern: str
    source: str

    def matches(self, name: str) -> bool:
        return re.search(self.pattern, name) is not None


RULES: tuple[Rule, ...] = (
    # Ours: the @triton.jit kernels of dsv4kit.kernels (the kernel name is the function name).
    Rule("indexer", "ours", r"^_indexer_logits_kernel", "dsv4kit kernels/indexer.py"),
    Rule("indexer", "ours", r"^_fp4_logits_kernel", "dsv4kit kernels/indexer_fp4.py"),
    Rule("indexer", "ours", r"^_shared_rows_kernel", "dsv4kit kernels/indexer_tiles.py (rows that share keys)"),
    Rule("indexer", "ours", r"^_fp4_shared_rows_kernel", "dsv4kit kernels/indexer_fp4.py (rows that share keys)"),
    Rule("attention", "ours", r"^_(sparse_mla_decode(_wide)?|combine_splits|simt_scope)_kernel",
         "dsv4kit kernels/sparse_mla_decode.py, sparse_mla_simt.py"),
    # SGLang 0.5.23's DeepSeek-V4 per-step glue: cache stores, attention metadata, compressors
    # (its JIT CUDA in kernels/jit/csrc/deepseek_v4/ and the Triton kernels beside the backend).
    # Before the attention rules: "flashmla" in a store's name is the cache layout, not attention.
    Rule("elementwise", "dsv4 glue", r"fused_store_(indexer|flashmla)_cache|_causal_swa_page_indices|"
                                     r"_page_table_positions|_small_page_table|flashmla_sched_meta|_low_ratio_metadata|"
                                     r"_build_swa_token_ids|_combine_topk_swa_indices|_expand_prefill_causally|"
                                     r"online_c128_mtp_|flash_c(1|2|4|128)_(online_)?decode|plan_c128_|plan_compress_|"
                                     r"c2_prefill_store|index_[qk]_kernel|cvt_fp8_e4m3|mask_topk_ids_padded|"
                                     r"fused_k_norm_rope|fused_norm_rope|_kv_norm_rope_fp8_store|_dequantize_k_cache|"
                                     r"_fill_all_compressed_indices|_init_compressed_attn_metadata",
         "SGLang 0.5.23 kernels/jit/csrc/deepseek_v4/*.cuh, ops/attention/dsv4/*metadata*.py, rope.py, "
         "sparse_prefill_kernels.py, dequant_k_cache.py"),
    # SGLang 0.5.23's block-FP8 linear layers (Triton), before the attention and GEMM rules.
    Rule("dense_gemm", "sglang triton fp8", r"_w8a8_block_fp8_matmul|_reduce_block_fp8_split_k|^scaled_mm_kernel|"
                                                r"wo_a_fused_kernel",
         "SGLang 0.5.23 kernels/ops/gemm/fp8_kernel.py, JIT wo_a_fused.cuh"),
    # FlashInfer's non-attention kernels (namespaces flashinfer::norm, ::activation, ::sampling; rope
    # in pos_enc.cuh; the all-reduce fusions in comm/): never attention.
    Rule("nccl", "flashinfer all-reduce", r"allreduce_fusion_kernel|all_reduce_norm_kernel|oneShotAllReduceKernel|"
                                          r"fused_allreduce_allgather|fused_reducescatter_allreduce",
         "FlashInfer 0.7.2 include/flashinfer/comm (trtllm_allreduce_fusion)"),
    Rule("elementwise", "flashinfer", r"flashinfer::(norm|activation|sampling)::|RMSNorm\w*Kernel|act_and_mul_kernel|"
                                      r"BatchQKApplyRotary|RopeQuantize|fusedQKNormRope|SamplingFromProb|TopKTopP|"
                                      r"TopPRenormProb|TopKMaskLogits",
         "FlashInfer 0.7.2 norm.cuh, activation.cuh, pos_enc.cuh, sampling.cuh"),
    # SGLang 0.5.23 stock indexers.
    Rule("indexer", "tilelang", r"fp8_paged_mqa_logits_kernel|^fp8_paged_mqa_logits",
         "SGLang tilelang_kernel.py fp8_paged_mqa_logits (TileLang names it <prim_func>_kernel)"),
    Rule("indexer", "deepgemm", r"paged_mqa_logits|fp8_mqa_logits", "DeepGEMM (not the sm_120 default)"),
    # SGLang 0.5.23 stock sparse-MLA attention on sm_120 and FlashMLA on sm_90.
    Rule("attention", "triton", r"^_tiled_sparse_decode_kernel", "SGLang flash_mla_sm120_triton.py"),
    Rule("attention", "flashinfer", r"^_page_(mark|split)_kernel",
         "SGLang flash_mla_sm120.py (re-paging before FlashInfer's decode)"),
    Rule("attention", "flashinfer", r"flashinfer::sparse_mla_sm120|sparse_mla_(decode|prefill)\w*_kernel|"
                                    r"BatchDecodeWithPaged|BatchPrefillWithPaged",
         "FlashInfer 0.7.2 attention/sparse_mla_sm120 (sparse_mla_decode_dsv4_*_kernel) and its paged kernels"),
    Rule("attention", "flashmla", r"(?i)flash_fwd_.*mla|flashmla|flash_mla|splitkv_mla|mla_combine",
         "FlashMLA (sgl-flash-mla, sm_90)"),
    # Top-k and MoE routing (before the generic GEMM and elementwise rules).
    Rule("topk", "sglang", r"topk_transform|topk_v[12]|fast_topk|topk_bf16_small|topk_plan_cluster|"
                           r"topk_(main|packed|ragged|ragged_kpool|persistent_cluster|small_batch_cluster)_kernel|topk_split_(hist|select)",
         "SGLang JIT topk_v1.cuh / topk_v2.cuh"),
    Rule("elementwise", "moe routing", r"(?i)moe_align|moe_sum|topk_softmax|grouped_topk|count_and_sort_expert|"
                                       r"biased_grouped_topk|hash_topk|moe::dev::routing|routingIndices", "SGLang / sgl-kernel MoE routing"),
    Rule("topk", "torch", r"(?i)sbtopk|mbtopk|gatherTopK|radixSelect|bitonicSort|aten::topk|aten::sort",
         "torch topk / sort"),
    # Communication.
    Rule("nccl", "nccl", r"^ncclDevKernel|^ncclKernel|(?i:nccl)", "NCCL"),
    Rule("nccl", "custom all-reduce", r"(?i)cross_device_reduce|all_?reduce|one_?shot|two_?shot|c10d::",
         "SGLang / vLLM custom all-reduce, c10d ops"),
    # MoE expert GEMMs. flashinfer_mxfp4 (the sm_120 FP4 runner) calls FlashInfer's
    # trtllm_fp4_block_scale_moe: TRT-LLM-gen batched-GEMM cubins named bmm_<types>_..., and the
    # moe::dev:: routing / activation / finalize kernels around them.
    Rule("moe_gemm", "flashinfer mxfp4", r"^bmm_|batchedGemm|BatchedGemm|moe::dev::(activation|finalize)|"
                                         r"trtllm_fp4_block_scale_moe",
         "FlashInfer 0.7.2 trtllm_fp4_block_scale_moe (SGLang's flashinfer_mxfp4 runner)"),
    Rule("moe_gemm", "sglang", r"(?i)marlin_moe|moe_wna16|fused_moe|moe_gemm|MoeFCGemm|grouped_?gemm|group_gemm|"
                               r"m_grouped|cutlass_moe|fp4.*moe|moe.*fp4|expert",
         "Marlin MoE, Triton fused_moe, CUTLASS/FlashInfer grouped GEMMs"),
    # Dense GEMMs (cuBLAS, CUTLASS, nvjet, torch matmuls).
    Rule("dense_gemm", "cublas/cutlass", r"(?i)gemm|gemv|cutlass|cublas|xmma|nvjet|splitKreduce|s16816|s1688|"
                                         r"^sm\d+_|^ampere_|^turing_|^volta_",
         "cuBLAS, cuBLASLt, CUTLASS, nvjet"),
    Rule("dense_gemm", "torch", r"^aten::(mm|addmm|bmm|matmul|linear|baddbmm|_scaled_mm)$", "torch ops (CPU trace)"),
    # Memory copies.
    Rule("memcpy", "copy", r"(?i)^memcpy|^memset|copy_kernel|CatArrayBatchedCopy|direct_copy|"
                           r"^aten::(copy_|cat|clone|contiguous|index_select|gather|index|to|_to_copy|empty_like)$",
         "CUDA memcpy/memset, torch copies"),
    # Elementwise and glue: norms, rope, activations, quantisation, reductions, Triton glue.
    Rule("elementwise", "glue", r"(?i)elementwise|reduce_kernel|rms_?norm|layer_?norm|rotary|rope|silu|gelu|"
                                r"act_and_mul|fused_add|softmax|triton_(poi|red|per)_|quant|fp8_cvt|store_cache|"
                                r"^store|norm_rope|^c(4|128)_|index_k|compress|fill|arange|where|"
                                r"^aten::(mul|add|sub|div|clamp|clamp_min|relu|sum|exp|neg|where|fill_|zero_|"
                                r"rsqrt|pow|mean|sigmoid|softmax|silu|gelu|cumsum|masked_fill|max|amax|ones|zeros)_?$",
         "torch elementwise/reduce kernels, SGLang DSV4 JIT glue, norms, rope, quantisation"),
)

#: (class, impl, Python function name pattern): kernels launched inside these take their class.
SCOPES: tuple[tuple[str, str, str], ...] = (
    ("indexer", "torch", r"fp8_paged_mqa_logits_torch"),
    ("attention", "torch", r"_sm120_sparse_decode_fwd"),
    ("indexer", "ours", r"dsv4kit.*indexer_logits"),
)


def classify(name: str) -> tuple[str, str]:
    """(class, implementation) of a kernel or op name; ("other", "") when no rule matches."""
    for rule in RULES:
        if rule.matches(name):
            return rule.klass, rule.impl
    return "other", ""


def scope_class(function_name: str):
    """(class, impl) when ``function_name`` (a python_function event name) is one of ``SCOPES``."""
    for klass, impl, pattern in SCOPES:
        if re.search(pattern, function_name):
            return klass, impl
    return None


def markdown_table() -> str:
    """The documented table (docs/profiling.md), generated from RULES and SCOPES."""
    lines = ["| # | class | implementation | name pattern (Python regex, first match wins) | where the names come from |",
             "| --- | --- | --- | --- | --- |"]
    for i, rule in enumerate(RULES, 1):
        pattern = rule.pattern.replace("|", "\\|")
        lines.append(f"| {i} | {CLASSES[rule.klass]} | {rule.impl} | `{pattern}` | {rule.source} |")
    lines.append("")
    lines.append("| scope: kernels launched inside this Python function | class | implementation |")
    lines.append("| --- | --- | --- |")
    for klass, impl, pattern in SCOPES:
        lines.append(f"| `{pattern}` | {CLASSES[klass]} | {impl} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m dsv4kit.profile.classes: the table for docs/profiling.md
    print(markdown_table())
