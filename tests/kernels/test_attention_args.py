"""Argument checks of the sparse-MLA decode entry point, the V4 page builder and the suite specs."""

import logging

import pytest
import torch

from dsv4kit.kernels import sparse_mla_decode as dec
from dsv4kit.kernels.sparse_mla_reference import (
    dequantize_v4, make_inputs, page_bytes, quantize_v4_pages, sparse_mla_reference,
)
from dsv4kit.validation import attention_suite


@pytest.fixture(scope="module")
def good():
    return make_inputs(T=2, heads=16, padded_heads=16, extra="c4", extra_width=64, seq_lens=[300, 20]).kwargs


def _call(kw, **changes):
    args = dict(kw)
    args.update(changes)
    return dec.flash_mla_with_kvcache_sm120(**args)


@pytest.mark.parametrize("change, message", [
    (lambda kw: {"q": kw["q"][:, :, :, :256]}, "q must be"),
    (lambda kw: {"q": kw["q"].float().to(torch.int32)}, "q must be bf16"),
    (lambda kw: {"q": torch.zeros(2, 1, 65, 512, dtype=torch.bfloat16)}, "heads"),
    (lambda kw: {"head_dim_v": 448}, "head_dim_v"),
    (lambda kw: {"softmax_scale": float("nan")}, "softmax_scale"),
    (lambda kw: {"softmax_scale": torch.tensor(0.04)}, "softmax_scale"),
    (lambda kw: {"indices": kw["indices"].long()}, "indices must be int32"),
    (lambda kw: {"indices": kw["indices"][:1]}, "indices must be"),
    (lambda kw: {"topk_length": None}, "topk_length is required"),
    (lambda kw: {"topk_length": kw["topk_length"].long()}, "topk_length must be int32"),
    (lambda kw: {"attn_sink": kw["attn_sink"][:8]}, "attn_sink"),
    (lambda kw: {"attn_sink": kw["attn_sink"].double()}, "attn_sink must be float32"),
    (lambda kw: {"k_cache": kw["k_cache"].view(torch.uint8)[..., :576]}, "V4 layout"),
    (lambda kw: {"k_cache": kw["k_cache"].to(torch.float16)}, "1-byte dtype"),
    (lambda kw: {"extra_topk_length": None}, "given together"),
    (lambda kw: {"extra_indices_in_kvcache": kw["extra_indices_in_kvcache"][:, :, :0]}, "width >= 1"),
])
def test_bad_arguments_raise_clear_errors(good, change, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _call(good, **change(good))


def test_cache_stride_and_storage_are_checked(good):
    cache = good["k_cache"]
    short = torch.as_strided(cache, cache.shape, (cache.stride(0) // 2, 584, 584, 1))
    with pytest.raises(ValueError, match="stride\\(0\\)"):
        _call(good, k_cache=short)
    with pytest.raises(ValueError, match="stride\\(3\\)"):
        _call(good, k_cache=torch.as_strided(cache, (1, *cache.shape[1:]), (cache.stride(0), 584, 584, 2)))


def test_page_bytes_and_round_trip():
    assert [page_bytes(ps) for ps in (256, 64, 2)] == [149760, 37440, 1728]
    kv = torch.randn(70, 512) * torch.exp2(torch.randint(-3, 4, (70, 1)).float())
    cache = quantize_v4_pages(kv, 64)
    assert cache.shape == (2, 64, 1, 584) and cache.stride(0) == 37440
    back = dequantize_v4(cache, torch.arange(70))
    assert torch.equal(back[:, 448:], kv[:, 448:].to(torch.bfloat16).float())
    # fp8 e4m3 keeps 3 mantissa bits: the scaled error is at most half a step of 2^-3 relative.
    tile_amax = kv[:, :448].reshape(70, 7, 64).abs().amax(-1, keepdim=True)
    err = (back[:, :448] - kv[:, :448]).reshape(70, 7, 64).abs()
    assert bool((err <= tile_amax * 2 ** -4 + 1e-6).all())
    # ue8m0: every scale byte is the exponent of a power of two >= amax / 448
    scales = cache.as_strided((2, 37440), (37440, 1))[:, 64 * 576:64 * 584].reshape(2, 64, 8)[:, :, :7]
    exps = scales.reshape(-1, 7)[:70].float() - 127
    assert bool((torch.exp2(exps) * 448 >= tile_amax.squeeze(-1) * (1 - 1e-6)).all())


def test_prefill_sized_calls_use_the_reference_and_log_once(caplog):
    inputs = make_inputs(T=dec.SM120_DECODE_MAX_TOKENS + 1, heads=16, padded_heads=16, seq_lens=None, seed=9)
    dec._LOGGED_DELEGATION = False
    with caplog.at_level(logging.WARNING, logger=dec.__name__):
        out, lse = dec.flash_mla_with_kvcache_sm120(**inputs.kwargs)
        dec.flash_mla_with_kvcache_sm120(**inputs.kwargs)
    ref, ref_lse = sparse_mla_reference(**inputs.kwargs)
    assert out.dtype == torch.bfloat16 and out.shape == (65, 1, 16, 512)
    assert torch.equal(out, ref.to(torch.bfloat16))
    assert sum("float32 torch reference" in r.getMessage() for r in caplog.records) == 1


def test_module_contract():
    assert dec.SM120_DECODE_MAX_TOKENS == 64
    assert dec.choose_num_splits(64, 2, 640, 32, 132) == 1
    assert dec.choose_num_splits(64, 1, 640, 32, 132) == 2  # 64 programs: two splits fill the wave
    assert dec.choose_num_splits(16, 2, 640, 32, 132) == 4
    assert dec.choose_num_splits(1, 2, 8384, 32, 132) == dec.MAX_SPLITS
    assert dec.choose_num_splits(1, 2, 64, 32, 132) == 2
    sm120 = dec.default_config(64, (12, 0))
    assert (sm120.block_h, sm120.block_n, sm120.num_warps, sm120.prefetch, sm120.wide) == (32, 32, 8, True, False)
    sm90 = dec.default_config(64, (9, 0))  # the H200 sweep's fastest tile
    assert sm90 == dec.DecodeConfig(64, 64, 8, 2, 2, True)
    assert dec.default_config(24, (9, 0)).block_h == 32


def test_small_calls_get_small_programs():
    """T <= SMALL_CALL_TOKENS: 16-head, 32-row programs on both targets (the H200 runs showed
    them ahead of the wide kernel at T = 1 and 2); larger calls keep each target's tiles."""
    small = dec.DecodeConfig(16, 32, 4, 1, 1, False)
    for cap in ((9, 0), (12, 0)):
        for T in range(1, dec.SMALL_CALL_TOKENS + 1):
            assert dec.default_config(64, cap, T) == small
        assert dec.default_config(64, cap, dec.SMALL_CALL_TOKENS + 1) == dec.default_config(64, cap)
    # one c4 token: 20 one-step splits of 4 head blocks = 80 programs on 132 SMs
    assert dec.choose_num_splits(1, 4, 640, 32, 132) == 20


def test_pdl_policy(monkeypatch):
    cpu = torch.device("cpu")
    assert not dec.use_pdl(dec.DecodeConfig(pdl=True), cpu, 1)  # never off the GPU / in the interpreter
    monkeypatch.setattr(dec, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(dec, "interpreting", lambda: False)
    gpu = torch.device("cuda", 0)
    assert dec.use_pdl(dec.DecodeConfig(), gpu, dec.PDL_MAX_TOKENS)
    assert not dec.use_pdl(dec.DecodeConfig(), gpu, dec.PDL_MAX_TOKENS + 1)
    assert dec.use_pdl(dec.DecodeConfig(pdl=True), gpu, 64)
    monkeypatch.setenv(dec.PDL_ENV, "0")
    assert not dec.use_pdl(dec.DecodeConfig(), gpu, 1)
    monkeypatch.setattr(dec, "device_capability", lambda device: (8, 9))
    monkeypatch.delenv(dec.PDL_ENV)
    assert not dec.use_pdl(dec.DecodeConfig(pdl=True), gpu, 1)  # griddepcontrol needs sm_90


def test_combine_tiles_cover_every_split():
    for splits in range(1, dec.MAX_SPLITS + 1):
        p2, heads, dims = dec.combine_tiles(splits, 64)
        assert p2 >= splits and p2 & (p2 - 1) == 0
        assert heads == dec.COMBINE_BLOCK_H and 512 % dims == 0 and 16 <= dims <= dec.COMBINE_BLOCK_D
        assert p2 * heads * dims <= 8192


def test_tiles_env_override(monkeypatch):
    monkeypatch.setenv(dec.TILES_ENV, "64,64,8,2,0,1")
    assert dec.default_config(64, (12, 0)) == dec.DecodeConfig(64, 64, 8, 2, False, True)
    monkeypatch.setenv(dec.TILES_ENV, "64,64")
    with pytest.raises(ValueError, match=dec.TILES_ENV):
        dec.default_config(64, (9, 0))
    for bad in ("48,64,8,2,0,1", "64,64,8,2,0,2", "32,32,8,1,2,0"):  # BLOCK_H, WIDE, PREFETCH 2 tiled
        monkeypatch.setenv(dec.TILES_ENV, bad)
        with pytest.raises(ValueError, match="BLOCK_H"):
            dec.default_config(64, (9, 0))


@pytest.mark.parametrize("spec", ["c4-T16-H64", "c128-T1-H16of64-ps64-x8256-L131072-holes-empty",
                                  "swa-T4-H32of64-L60", "c4-T3-H16-ps64-x64-views"])
def test_suite_parses_specs(spec):
    case = attention_suite.parse_case(spec)
    assert case.T >= 1 and case.heads <= case.padded_heads


@pytest.mark.parametrize("spec, message", [
    ("c8-T1-H64", "kind"), ("c4-H64", "missing T"), ("c4-T1", "missing H"), ("c4-T1-H65", "H <="),
    ("c4-T1-H64-ps128", "page size"), ("swa-T1-H64-x64", "needs a c4"), ("c4-T1-H64-foo", "unknown part"),
])
def test_suite_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        attention_suite.parse_case(spec)


def test_suite_profiles():
    for profile in ("cpu", "gpu"):
        for spec in attention_suite.default_cases(profile):
            attention_suite.parse_case(spec)
    with pytest.raises(ValueError):
        attention_suite.default_cases("tpu")


def test_unaligned_pages_are_rejected(good):
    cache = good["k_cache"]
    buf = torch.zeros(cache.shape[0] * cache.stride(0) + 16, dtype=torch.uint8)
    shifted = torch.as_strided(buf, cache.shape, cache.stride(), 8)  # pages start 8 bytes off
    with pytest.raises(ValueError, match="16-byte aligned"):
        _call(good, k_cache=shifted)


def test_profile_target_rejects_bad_arguments_and_needs_a_gpu(monkeypatch, capsys):
    import torch

    from dsv4kit.validation import profile_attention

    for argv in (["--tokens", "0"], ["--tokens", "65"], ["--calls", "0"]):
        with pytest.raises(SystemExit) as exc:
            profile_attention.main(argv)
        assert exc.value.code == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert profile_attention.main(["--tokens", "1"]) == 5
    assert "needs a GPU" in capsys.readouterr().err


def test_misspelt_keyword_is_an_error_not_ignored(good):
    with pytest.raises(TypeError, match="extra_topk_lenght"):
        _call(good, extra_topk_lenght=good["extra_topk_length"])


def test_cpu_tensors_without_the_interpreter_are_refused_clearly(good, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        _call(good)


def test_infinite_outputs_fail_the_comparison():
    from dsv4kit.kernels.sparse_mla_reference import compare

    ref = torch.randn(2, 1, 4, 512)
    out = ref.clone()
    assert compare(out, ref, 4)["rel"] == 0.0
    out[1, 0, 2] = float("inf")
    stats = compare(out, ref, 4)
    assert stats["nan_free"] and not stats["rel"] <= 1e-2
    out[1, 0, 2] = float("nan")
    assert not compare(out, ref, 4)["nan_free"]


def test_reference_reads_fp8_views_of_the_cache_as_bytes(good):
    slots = torch.tensor([[0, 5, 17]])
    as_u8 = dequantize_v4(good["k_cache"], slots)
    as_fp8 = dequantize_v4(good["k_cache"].view(torch.float8_e4m3fn), slots)
    assert torch.equal(as_u8, as_fp8) and torch.isfinite(as_fp8).all()


def test_refusals_are_kernel_argument_errors_for_the_plugin(good):
    from dsv4kit.kernels import indexer
    from dsv4kit.kernels.errors import KernelArgumentError

    assert issubclass(KernelArgumentError, ValueError) and issubclass(KernelArgumentError, TypeError)
    with pytest.raises(KernelArgumentError, match="flash_mla_with_kvcache_sm120: head_dim_v"):
        _call(good, head_dim_v=448)
    with pytest.raises(KernelArgumentError, match="flash_mla_with_kvcache_sm120: softmax_scale must be a Python"):
        _call(good, softmax_scale=torch.tensor(0.04))  # a TypeError in the checks
    with pytest.raises(KernelArgumentError, match="fp8_paged_mqa_logits: "):
        indexer.fp8_paged_mqa_logits(good["q"], None, None, None, None, None, 1, False)
