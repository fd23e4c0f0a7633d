"""Every implementation of a kernel target that can run here: ours and SGLang 0.5.23's own.

``implementations(target, device)`` returns the loaded ones (each callable with the SGLang
arguments of that target) and, for the others, why they cannot run on this machine. Validation,
the benchmarks and the per-host verdict all time and check exactly these callables.

Targets and their SGLang contracts:

* ``"indexer"``: ``fn(q_fp8, kvcache, weight, seq_lens, page_table, deep_gemm_metadata,
  max_seq_len, clean_logits)`` -> fp32 ``[B, max_seq_len]``; only ``[0, L)`` of a row is read by
  SGLang (``tail`` says what an implementation leaves past ``L``).
* ``"indexer_fp4"``: every indexer a host can run for its c4 layers, FP4 and FP8 side by side:
  ours FP4 ("dsv4kit": DeepGEMM's ``fp8_fp4_paged_mqa_logits`` arguments, docs/sglang-contract.md
  §2.10), DeepGEMM's own FP4 function where it imports (SGLang's only FP4 route: the stock
  default), ours FP8 ("dsv4kit-fp8") and TileLang FP8. Each function carries ``cache_format``
  ("fp4" or "fp8"): the inputs it takes.
* ``"attention"``: ``fn(**kwargs)`` with the keyword arguments of ``flash_mla_with_kvcache_sm120``
  -> ``(out [T, 1, H, 512] bf16, lse)``.

What stock SGLang 0.5.23 runs by default: on sm_120 the TileLang indexer and FlashInfer's
``_sparse_mla_sm120`` attention; on sm_90 FlashMLA (``sgl-flash-mla``, ``use_legacy=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from dsv4kit.validation import sglang_stock

TARGETS = ("indexer", "attention", "indexer_fp4")

TILELANG_MODULE = "sglang.kernels.ops.attention.dsa.tilelang_kernel"
INDEXER_FALLBACK_MODULE = "sglang.srt.layers.attention.dsv4.indexer"
SM120_MODULE = "sglang.kernels.ops.attention.flash_mla_sm120"
SM120_TRITON_MODULE = "sglang.kernels.ops.attention.flash_mla_sm120_triton"
FLASHMLA_INTERFACE_MODULE = "sglang.kernels.ops.attention.flash_mla_interface"


@dataclass(frozen=True)
class Implementation:
    target: str  # "indexer" | "attention"
    name: str  # "dsv4kit", "sglang-tilelang", "sglang-torch", "sglang-triton-sm120", ...
    stock_default: bool  # what stock SGLang 0.5.23 runs by default on this GPU
    fn: Callable  # called with the SGLang-contract arguments of that target
    # Indexer only: what the output holds past L ("exact": -inf, "page": -inf up to the end of
    # L's page, "none": unwritten); see dsv4kit.kernels.indexer_reference.compare.
    tail: Optional[str] = field(default=None, compare=False)
    origin: str = field(default="", compare=False)  # "dsv4kit", "installed", "wheel:<dir>"


def _capability(device) -> Optional[tuple]:
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def _indexer_fallback_namespace() -> dict:
    """Globals of SGLang's indexer module that its torch fallback uses (CUDA build values)."""
    from typing import Any

    import torch
    import torch.nn.functional as F

    return {"torch": torch, "F": F, "Any": Any, "FP8_DTYPE": torch.float8_e4m3fn}


def _sm120_positional(fn: Callable) -> Callable:
    """SGLang's sm_120 backends take positional arguments; adapt them to the keyword contract."""

    def call(**kw):
        return fn(kw["q"], kw["k_cache"], kw["indices"], kw.get("topk_length"), kw.get("attn_sink"),
                  kw["head_dim_v"], kw.get("softmax_scale"), kw.get("extra_k_cache"),
                  kw.get("extra_indices_in_kvcache"), kw.get("extra_topk_length"))

    return call


def _padded_to_64(q, sink, buffers: dict):
    """q and the sink as SGLang hands them to FlashMLA on sm_90: padded to 64 heads (model.py
    ``_kernel_num_heads``: every head count but 64 at attention-TP > 1; the sink padded with 0).

    A q that is the leading heads of a 64-head buffer, as SGLang's own is, is widened in place
    (no copy); otherwise it is copied into a buffer kept per shape."""
    import torch

    T, one, H, D = q.shape
    if H >= 64:
        return q, sink
    if q.stride(3) == 1 and q.stride(2) == D and q.stride(0) >= 64 * D and q.stride(1) >= 64 * D \
            and q.storage_offset() + (T - 1) * q.stride(0) + 64 * D <= q.untyped_storage().nbytes() // q.element_size():
        wide = q.as_strided((T, one, 64, D), q.stride())
    else:
        wide = buffers.setdefault(("q", T, one, D, q.dtype), q.new_zeros(T, one, 64, D))
        wide[:, :, :H].copy_(q)
    if sink is not None:
        key = ("sink", sink.data_ptr())
        if key not in buffers:  # filled on the first call, outside capture
            buffers[key] = (sink, torch.cat([sink, sink.new_zeros(64 - H)]))
        sink = buffers[key][1]
    return wide, sink


def _flashmla_call(interface) -> Callable:
    """FlashMLA as SGLang's DSV4 backend calls it on sm_90 (``use_legacy=True`` for the V4 layout),
    with q padded to 64 heads as SGLang pads it there (the output is cut back to the real heads).

    SGLang builds one scheduler object per forward batch and every layer reuses it; likewise here
    one is kept per set of shapes and length tensors (filled by the first call, outside capture).
    """
    schedules: dict = {}
    buffers: dict = {}

    def call(**kw):
        heads = kw["q"].shape[2]
        q, sink = _padded_to_64(kw["q"], kw.get("attn_sink"), buffers)
        key = (tuple(q.shape), tuple(kw["k_cache"].shape), tuple(kw["indices"].shape),
               id(kw.get("topk_length")), id(kw.get("extra_topk_length")),
               None if kw.get("extra_indices_in_kvcache") is None
               else tuple(kw["extra_indices_in_kvcache"].shape))
        if key not in schedules:  # the tensors are kept so their ids stay unique
            schedules[key] = (interface.get_mla_metadata()[0], kw.get("topk_length"),
                              kw.get("extra_topk_length"))
        out, lse = interface.flash_mla_with_kvcache(
            q=q, k_cache=kw["k_cache"], head_dim_v=kw["head_dim_v"], block_table=None,
            cache_seqlens=None, tile_scheduler_metadata=schedules[key][0],
            softmax_scale=kw.get("softmax_scale"), is_fp8_kvcache=True, indices=kw["indices"],
            topk_length=kw.get("topk_length"), attn_sink=sink,
            extra_k_cache=kw.get("extra_k_cache"),
            extra_indices_in_kvcache=kw.get("extra_indices_in_kvcache"),
            extra_topk_length=kw.get("extra_topk_length"), use_legacy=True)
        return (out[:, :, :heads], lse) if heads < 64 else (out, lse)

    return call


def _indexer(device, cap) -> tuple[list[Implementation], dict[str, str]]:
    from dsv4kit.kernels import indexer

    loaded = [Implementation("indexer", "dsv4kit", False, indexer.fp8_paged_mqa_logits_for_sglang,
                             tail="page", origin="dsv4kit")]
    missing: dict[str, str] = {}
    sm120 = cap is not None and cap[0] == 12
    if cap is None:
        missing["sglang-tilelang"] = "not available: needs a CUDA GPU"
    else:
        try:
            module = sglang_stock.load_module(TILELANG_MODULE)
            loaded.append(Implementation("indexer", "sglang-tilelang", sm120,
                                         module.tilelang_fp8_paged_mqa_logits, tail="none",
                                         origin=sglang_stock.origin()))
        except sglang_stock.StockUnavailable as exc:
            missing["sglang-tilelang"] = f"not available: {exc}"
    try:
        fallback = sglang_stock.load_function(INDEXER_FALLBACK_MODULE,
                                              "fp8_paged_mqa_logits_torch_sm120",
                                              _indexer_fallback_namespace)
        loaded.append(Implementation("indexer", "sglang-torch", False, fallback, tail="exact",
                                     origin=sglang_stock.origin()))
    except sglang_stock.StockUnavailable as exc:
        missing["sglang-torch"] = f"not available: {exc}"
    return loaded, missing


def _with_format(fn: Callable, cache_format: str) -> Callable:
    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    call.cache_format = cache_format
    return call


def _deep_gemm_fp4() -> Callable:
    """DeepGEMM's FP4 logits as SGLang calls them: its schedule from the lengths, per call."""
    import deep_gemm

    fn = deep_gemm.fp8_fp4_paged_mqa_logits

    def call(q, kv_cache, weights, lens, table, _meta, max_len, clean=False):
        lens2 = lens.reshape(-1, 1).contiguous()
        meta = deep_gemm.get_paged_mqa_logits_metadata(lens2, 64, deep_gemm.get_num_sms())
        return fn(q, kv_cache, weights, lens2, table, meta, max_len, clean)

    return call


def _indexer_fp4(device, cap) -> tuple[list[Implementation], dict[str, str]]:
    from dsv4kit.kernels import indexer, indexer_fp4

    loaded = [Implementation("indexer_fp4", "dsv4kit", False,
                             _with_format(indexer_fp4.fp8_fp4_paged_mqa_logits_for_sglang, "fp4"),
                             tail="page", origin="dsv4kit"),
              Implementation("indexer_fp4", "dsv4kit-fp8", False,
                             _with_format(indexer.fp8_paged_mqa_logits_for_sglang, "fp8"),
                             tail="page", origin="dsv4kit")]
    missing: dict[str, str] = {}
    if cap is None:
        missing["deepgemm-fp4"] = "not available: needs a CUDA GPU"
    else:
        try:
            loaded.append(Implementation("indexer_fp4", "deepgemm-fp4", True,
                                         _with_format(_deep_gemm_fp4(), "fp4"), tail="none",
                                         origin="installed"))
        except Exception as exc:  # noqa: BLE001 - absent, or its extension does not load here
            missing["deepgemm-fp4"] = f"not available: {type(exc).__name__}: {str(exc)[:120]}"
    fp8, why = _indexer(device, cap)
    for impl in fp8:
        if impl.name == "sglang-tilelang":
            loaded.append(Implementation("indexer_fp4", impl.name, False,
                                         _with_format(impl.fn, "fp8"), tail=impl.tail,
                                         origin=impl.origin))
    if "sglang-tilelang" in why:
        missing["sglang-tilelang"] = why["sglang-tilelang"]
    return loaded, missing


def _attention(device, cap) -> tuple[list[Implementation], dict[str, str]]:
    from dsv4kit.kernels import sparse_mla_decode

    loaded = [Implementation("attention", "dsv4kit", False,
                             sparse_mla_decode.flash_mla_with_kvcache_sm120, origin="dsv4kit")]
    missing: dict[str, str] = {}
    sm120 = cap is not None and cap[0] == 12
    sm90 = cap is not None and cap[0] == 9

    def stock(name: str, default: bool, make: Callable[[], Callable]) -> None:
        try:
            loaded.append(Implementation("attention", name, default, make(),
                                         origin=sglang_stock.origin()))
        except sglang_stock.StockUnavailable as exc:
            missing[name] = f"not available: {exc}"
        except (ImportError, AttributeError, OSError, RuntimeError) as exc:
            missing[name] = f"not available: {type(exc).__name__}: {str(exc)[:120]}"

    if cap is None:
        missing["sglang-triton-sm120"] = "not available: needs a CUDA GPU"
    else:
        stock("sglang-triton-sm120", False, lambda: _sm120_positional(
            sglang_stock.load_module(SM120_TRITON_MODULE).flash_mla_sparse_decode_triton))
    stock("sglang-torch", False, lambda: _sm120_positional(
        sglang_stock.load_module(SM120_MODULE)._sm120_sparse_decode_fwd))
    if sm120:
        def flashinfer():
            import flashinfer.mla._sparse_mla_sm120  # noqa: F401 - FlashInfer's sm_120a kernel
            return _sm120_positional(sglang_stock.load_module(SM120_MODULE)._flash_mla_flashinfer)

        stock("flashinfer-sm120", True, flashinfer)
    else:
        missing["flashinfer-sm120"] = "not available: needs sm_120"
    if sm90:
        stock("flashmla-sm90", True, lambda: _flashmla_call(
            sglang_stock.load_module(FLASHMLA_INTERFACE_MODULE)))
    else:
        missing["flashmla-sm90"] = "not available: needs sm_90 (FlashMLA's legacy V4 kernels)"
    return loaded, missing


def implementations(target: str, device) -> tuple[list[Implementation], dict[str, str]]:
    """The implementations of ``target`` loaded on ``device``, and ``{name: why unavailable}``."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    cap = _capability(device)
    return {"indexer": _indexer, "attention": _attention, "indexer_fp4": _indexer_fp4}[target](device, cap)
