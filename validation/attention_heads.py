"""How many query heads SGLang 0.5.23 hands the sparse-MLA decode call on one GPU of a box.

DeepSeek-V4-Flash has 64 query heads; attention tensor parallelism splits them, so a decode server
at TP ``tp`` holds ``64 // tp`` per GPU. On sm_120 (``model.py`` ``_kernel_num_heads``, 1215-1235)
the call gets those heads unpadded when attention-TP is 1, when the batch is over the decode limit
(``SM120_DECODE_MAX_TOKENS`` = 64 tokens), or when the configured backend
(``SGLANG_SM120_FLASHMLA_BACKEND``, default ``flashinfer``) is FlashInfer and FlashInfer has a
decode kernel for that head count (FlashInfer 0.7.2, SGLang's pin: 8, 16, 32, 64 and 128 heads,
up to 64 tokens). Otherwise q is padded to 64 heads. docs/sglang-contract.md §4.2 says the same.
"""

from __future__ import annotations

MODEL_HEADS = 64
DECODE_MAX_TOKENS = 64
#: FlashInfer 0.7.2's DSV4 decode specialisations (``_STATIC_DECODE_ENVELOPE[DSV4].dedicated_heads``).
FLASHINFER_DSV4_DECODE_HEADS = frozenset({8, 16, 32, 64, 128})
BACKENDS = ("flashinfer", "triton", "torch")
DEFAULT_BACKEND = "flashinfer"
#: The inventory's default decode server: dsv4_decode_gpus [4, 5, 6, 7].
DEFAULT_DECODE_TP = 4


def kernel_heads(decode_tp: int, tokens: int, backend: str = DEFAULT_BACKEND) -> tuple[int, int]:
    """``(real heads, heads of q as the kernel gets it)`` for one GPU of a TP ``decode_tp`` server
    decoding ``tokens`` tokens, under ``SGLANG_SM120_FLASHMLA_BACKEND=backend``. ValueError on a
    TP that does not divide the heads, or an unknown backend."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if decode_tp < 1 or MODEL_HEADS % decode_tp:
        raise ValueError(f"decode TP {decode_tp} does not divide the model's {MODEL_HEADS} heads")
    local = MODEL_HEADS // decode_tp
    if decode_tp == 1 or tokens > DECODE_MAX_TOKENS:
        return local, local
    if backend == "flashinfer" and local in FLASHINFER_DSV4_DECODE_HEADS:
        return local, local
    return local, MODEL_HEADS


def label(heads: int, padded: int) -> str:
    """``H=16`` or ``H=16of64`` (16 real heads in a q padded to 64)."""
    return f"H={heads}" if heads == padded else f"H={heads}of{padded}"
