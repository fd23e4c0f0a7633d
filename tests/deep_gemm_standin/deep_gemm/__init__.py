"""A stand-in for DeepGEMM (a compiled CUDA package that cannot be installed here), just enough
for the rollout scenarios: ``fp8_fp4_paged_mqa_logits`` shaped like its pybind11 binding (no
introspectable signature, the signature on the docstring's first line) that computes the logits
with dsv4kit's float64 reference, and ``get_paged_mqa_logits_metadata`` / ``get_num_sms``."""

import torch

_DOC = ("fp8_fp4_paged_mqa_logits(q: tuple[torch.Tensor, typing.Optional[torch.Tensor]], "
        "kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor, "
        "block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: typing.SupportsInt, "
        "clean_logits: bool = False, logits_dtype: torch.dtype = torch.float32, "
        "indices: typing.Optional[torch.Tensor] = None) -> torch.Tensor\n")


class _Builtin:
    """Behaves like a pybind11 function for ``inspect``: no signature, a docstring one."""

    __doc__ = _DOC
    __name__ = "fp8_fp4_paged_mqa_logits"
    __qualname__ = "fp8_fp4_paged_mqa_logits"
    __module__ = "deep_gemm"

    @property
    def __signature__(self):
        raise ValueError("no signature found for builtin <built-in method fp8_fp4_paged_mqa_logits>")

    def __call__(self, q, kv_cache, weights, context_lens, block_table, schedule_meta,
                 max_context_len, clean_logits=False, logits_dtype=torch.float32, indices=None):
        from dsv4kit.kernels.indexer_fp4_reference import exact_logits_f64

        assert not clean_logits and indices is None
        out = exact_logits_f64(q, kv_cache, weights, context_lens, block_table, max_context_len)
        return out.float()


fp8_fp4_paged_mqa_logits = _Builtin()


def get_num_sms() -> int:
    return 4


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32)
