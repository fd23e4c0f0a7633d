"""The FP4-cache indexer kernel against the float64 reference through Triton's CPU interpreter
(with the hidden cases: shuffled and repeated page ids, page-boundary lengths, B not a multiple of
any block, ue8m0 extremes, all-zero pages), its host-side argument checks and the reference's
agreement with SGLang 0.5.23's FP4 quantiser."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4kit.kernels import indexer_fp4 as k4
from dsv4kit.kernels import indexer_fp4_reference as ref

WORKER = Path(__file__).resolve().parents[1] / "indexer_fp4_interp_worker.py"
REL_BAR = 5e-4


@pytest.fixture(scope="module")
def interp():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["name"]: r for r in json.loads(out.stdout)}


CASES = ["7x3x192xh64", "5x2x128xh32-seq_lens_2d", "3x1x64xh16", "6x3x192xh64-stale",
         "5x3x192xh64-live_pages", "max_seq_len=200<P*64", "lengths clamped", "ue8m0 extremes",
         "all-zero pages"]


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_float64(interp, name):
    r = interp[name]
    assert r["pattern_ok"] and r["nan_free"], name
    assert r["rel"] <= REL_BAR, f"{name}: rel {r['rel']:.3e}"
    assert r["dtype"] == "torch.float32" and r["contiguous"] and r["compared"] > 0


TILE_CASES = [f"{name} ({tail}, R={progs})"
              for name in ("tiles: two requests, zero row", "tiles: verify 6 rows, shared prefix page")
              for tail, progs in (("exact", 2), ("skip", 8), ("skip", 1))]


@pytest.mark.parametrize("name", TILE_CASES)
def test_row_tile_kernel_matches_float64(interp, name):
    r = interp[name]
    assert r["pattern_ok"] and r["nan_free"] and r["rel"] <= REL_BAR, name
    if "skip" in name:  # nothing at or past the page holding L is written
        assert r["past_page_untouched"], name


def test_the_entry_sends_prefill_sized_calls_to_the_row_tiles(interp):
    r = interp["tiles: entry at the row-tile batch"]
    assert r["used_tiles"] and r["pattern_ok"] and r["rel"] <= REL_BAR


def test_all_zero_pages_score_exact_zeros(interp):
    assert interp["all-zero pages"]["zeros"]


@pytest.mark.parametrize("progs", [1, 5])
def test_skip_tail_writes_nothing_past_the_page_holding_l(interp, progs):
    skip, exact = interp[f"tail=skip R={progs}"], interp[f"tail=exact R={progs}"]
    assert skip["past_page_cells"] > 0
    assert skip["past_page_untouched"] and skip["page_tail"] and skip["rel"] <= REL_BAR
    assert exact["pattern_ok"] and not exact["past_page_untouched"]
    assert interp["plugin call"]["pattern_ok"]


def test_corrupt_page_ids_are_never_dereferenced(interp):
    r = interp["corrupt page ids"]
    assert r["corrupt_positions_inf"] and r["other_positions_finite"]


def test_empty_batch(interp):
    assert interp["empty batch"]["shape"] == [0, 128]


def test_the_sglang_entry_uses_the_skip_policy(monkeypatch):
    seen = {}
    monkeypatch.setattr(k4, "fp8_fp4_paged_mqa_logits", lambda *a, **kw: seen.update(kw))
    k4.fp8_fp4_paged_mqa_logits_for_sglang(*range(7), False)
    assert seen == {"tail": "skip"}


# ---- the reference against SGLang 0.5.23's writer semantics ----


def test_quantiser_matches_sglangs_rounding():
    # Block amax 6 -> exponent 127 (scale 1): values map to codes by the threshold rule.
    x = torch.zeros(1, 128)
    x[0, :12] = torch.tensor([6.0, 0.25, 0.26, 0.75, 0.76, 1.3, -1.76, 2.5, 2.6, 3.6, 5.0, -5.1])
    packed, exps = ref.quantize_fp4(x)
    assert exps.tolist() == [[127, 112, 112, 112]]  # empty blocks sit at the 1e-4 floor
    values = ref.dequantize_fp4(packed, exps)[0, :12].tolist()
    assert values == [6.0, 0.0, 0.5, 0.5, 1.0, 1.5, -2.0, 2.0, 3.0, 4.0, 4.0, -6.0]
    # Element 2i in the low nibble of byte i.
    assert int(packed[0, 0]) == (7 | (0 << 4)) and int(packed[0, 1]) == (1 | (1 << 4))


def test_ue8m0_rounds_up_to_a_power_of_two():
    x = torch.tensor([1.0, 1.0000001, 0.75, 3.0])
    assert ref.ue8m0_ceil(x).tolist() == [127, 128, 127, 129]


def test_generator_builds_the_real_page_layout():
    inputs = ref.make_fp4_inputs(5, 64, 3, 150, seed=3)
    assert inputs.kv_cache.dtype == torch.uint8 and tuple(inputs.kv_cache.shape[1:]) == (64, 1, 68)
    assert inputs.q_fp4.dtype == torch.int8 and tuple(inputs.q_fp4.shape) == (5, 1, 64, 64)
    assert inputs.q_sf.dtype == torch.int32 and tuple(inputs.q_sf.shape) == (5, 1, 64)
    _, exps = ref.split_pages(inputs.kv_cache)
    assert int(exps.min()) >= 112 and int(exps.max()) <= 140  # what the writers produce here
    lengths = inputs.seq_lens.tolist()
    assert {0, 150, 128, 64, 1, 63, 65} & set(lengths)
    repeated = ref.make_fp4_inputs(5, 64, 3, 150, seed=3, live_pages="repeated")
    live = [repeated.page_table[b, :-(-n // 64)] for b, n in enumerate(repeated.seq_lens.tolist())]
    assert all(int(row.max()) < 3 for row in live if row.numel())


def test_exact_reference_reads_only_live_pages():
    inputs = ref.make_fp4_inputs(6, 64, 4, 256, seed=5, stale="invalid")
    out = inputs.exact()
    for b, n in enumerate(inputs.seq_lens.tolist()):
        assert torch.isfinite(out[b, :n]).all() and torch.all(out[b, n:] == float("-inf"))


# ---- argument checks: each raises before any launch, naming the problem ----


def _args(**override):
    inputs = ref.make_fp4_inputs(2, 64, 2, 128, seed=8)
    args = dict(q=inputs.q, kv_cache=inputs.kv_cache, weights=inputs.weights,
                context_lens=inputs.seq_lens, block_table=inputs.page_table, schedule_meta=None,
                max_context_len=inputs.max_seq_len, clean_logits=False)
    args.update(override)
    return args


def _q(fp4=None, sf=None):
    inputs = ref.make_fp4_inputs(2, 64, 2, 128, seed=8)
    return (inputs.q_fp4 if fp4 is None else fp4, inputs.q_sf if sf is None else sf)


BAD_ARGS = [
    ({"q": torch.zeros(2, 1, 64, 64, dtype=torch.int8)}, "q must be the pair (q_fp4, q_sf)"),
    ({"q": _q(fp4=torch.zeros(2, 1, 64, 64, dtype=torch.bfloat16))}, "packed e2m1 bytes"),
    ({"q": _q(fp4=torch.zeros(2, 2, 64, 64, dtype=torch.int8))}, "next_n == 1"),
    ({"q": _q(fp4=torch.zeros(2, 1, 64, 128, dtype=torch.int8))}, "64 packed bytes a head"),
    ({"q": _q(fp4=torch.zeros(2, 1, 48, 64, dtype=torch.int8))}, "16, 32, 64 or 128"),
    ({"q": _q(fp4=torch.zeros(2, 1, 64, 128, dtype=torch.int8)[..., ::2])}, "q_fp4 must be contiguous"),
    ({"q": _q(sf=torch.zeros(2, 1, 64, dtype=torch.float32))}, "q_sf must be int32"),
    ({"q": _q(sf=torch.zeros(2, 64, dtype=torch.int32))}, "q_sf must be [B, 1, H]"),
    ({"kv_cache": torch.zeros(4, 64, 1, 132, dtype=torch.uint8)}, "[num_pages, 64, 1, 68]"),
    ({"kv_cache": torch.zeros(4, 64, 1, 68, dtype=torch.int8)}, "uint8 index-K pool"),
    ({"kv_cache": torch.zeros(4, 32, 1, 68, dtype=torch.uint8)}, "page size must be 64"),
    ({"kv_cache": torch.zeros(4, 8448, dtype=torch.uint8)}, "4352 bytes"),
    ({"kv_cache": torch.zeros(0, 64, 1, 68, dtype=torch.uint8)}, "holds no pages"),
    ({"weights": torch.zeros(2, 64, dtype=torch.bfloat16)}, "weights must be float32"),
    ({"weights": torch.zeros(2, 32)}, "weights must be [B, H]"),
    ({"context_lens": torch.zeros(2, dtype=torch.int64)}, "context_lens must be int32"),
    ({"context_lens": torch.zeros(2, 2, dtype=torch.int32)}, "[B] or [B, 1]"),
    ({"block_table": torch.zeros(2, 2, dtype=torch.int64)}, "block_table must be int32"),
    ({"block_table": torch.zeros(2, 0, dtype=torch.int32)}, "P == 0"),
    ({"block_table": torch.zeros(2, 2, dtype=torch.int32).t().contiguous().t()}, "column stride 1"),
    ({"max_context_len": 129}, "[1, P*64] = [1, 128]"),
    ({"max_context_len": True}, "max_context_len must be an int"),
    ({"clean_logits": True}, "clean_logits=True is not supported"),
    ({"logits_dtype": torch.bfloat16}, "logits_dtype must be torch.float32"),
    ({"indices": torch.zeros(2, dtype=torch.int32)}, "indices"),
]


@pytest.mark.parametrize("override,message", BAD_ARGS, ids=[m for _, m in BAD_ARGS])
def test_bad_arguments_raise_clear_errors(override, message):
    with pytest.raises(ValueError) as info:
        k4.fp8_fp4_paged_mqa_logits(**_args(**override))
    assert message in str(info.value)
    assert str(info.value).startswith("fp8_fp4_paged_mqa_logits: ")


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setattr(k4, "_INTERPRET", False)
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        k4.fp8_fp4_paged_mqa_logits(**_args())


def test_mixed_devices_are_refused():
    args = _args()
    args["weights"] = args["weights"].to("meta")
    with pytest.raises(ValueError, match="weights is on meta but q_fp4 is on cpu"):
        k4.fp8_fp4_paged_mqa_logits(**args)
