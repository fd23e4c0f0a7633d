"""The indexer kernel against the float64 reference through Triton's CPU interpreter, plus the
host-side argument checks (each error message) and the references' own sanity."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4kit.kernels import indexer
from dsv4kit.kernels import indexer_reference as ref

WORKER = Path(__file__).resolve().parents[1] / "indexer_interp_worker.py"
REL_BAR = 5e-4


@pytest.fixture(scope="module")
def interp_results():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["name"]: r for r in json.loads(out.stdout)}


KERNEL_CASES = ["1x8x512xh64", "16x8x512xh64", "3x1x64xh64", "12x5x300xh64-seq_lens_2d",
                "64x2x128xh64", "4x4x256xh32", "2x3x192xh16", "8x3x192xh64-stale",
                "prefetch=False", "prefetch=True", "max_seq_len=200<P*64", "seq_lens clamped"]


@pytest.mark.parametrize("name", KERNEL_CASES)
def test_kernel_matches_float64(interp_results, name):
    r = interp_results[name]
    assert r["pattern_ok"], f"{name}: -inf pattern differs"
    assert r["rel"] <= REL_BAR, f"{name}: rel {r['rel']:.3e}"
    assert r["dtype"] == "torch.float32" and r["contiguous"]
    assert r["compared"] > 0


def test_output_shape_is_b_by_max_seq_len(interp_results):
    assert interp_results["1x8x512xh64"]["shape"] == [1, 512]
    assert interp_results["max_seq_len=200<P*64"]["shape"] == [5, 200]
    assert interp_results["empty batch"]["shape"] == [0, 128]


@pytest.mark.parametrize("progs", [1, 5])
def test_skip_tail_writes_nothing_past_the_page_holding_l(interp_results, progs):
    skip, exact = interp_results[f"tail=skip R={progs}"], interp_results[f"tail=exact R={progs}"]
    assert skip["past_page_cells"] > 0
    assert skip["past_page_untouched"] and skip["page_tail"] and skip["rel"] <= REL_BAR
    assert not skip["pattern_ok"]  # the exact check sees the untouched sentinel
    assert exact["pattern_ok"] and not exact["past_page_untouched"] and exact["rel"] <= REL_BAR


def test_the_sglang_entry_point_uses_the_skip_policy(interp_results, monkeypatch):
    assert interp_results["plugin call"]["pattern_ok"] and interp_results["plugin call"]["rel"] <= REL_BAR
    seen = {}
    monkeypatch.setattr(indexer, "fp8_paged_mqa_logits",
                        lambda *args, **kwargs: seen.update(kwargs))
    indexer.fp8_paged_mqa_logits_for_sglang(*range(7), False)
    assert seen == {"tail": "skip"}
    from dsv4kit.rollout.targets import TARGETS

    kernels = {t.key: t.kernel for t in TARGETS}
    assert kernels["indexer"] == kernels["indexer_tilelang"] == \
        "dsv4kit.kernels.indexer:fp8_paged_mqa_logits_for_sglang"


def test_an_unknown_tail_policy_is_refused():
    with pytest.raises(ValueError, match="tail must be one of"):
        indexer.fp8_paged_mqa_logits(**_args(), tail="none")


def test_corrupt_page_ids_are_never_dereferenced(interp_results):
    r = interp_results["corrupt page ids"]
    assert r["corrupt_positions_inf"] and r["other_positions_finite"]


def test_fallback_is_bf16_accurate(interp_results):
    r = interp_results["fallback"]
    assert r["pattern_ok"]
    assert 1e-4 < r["rel"] < 5e-3  # bf16 per-head scores: about 1e-3, never exact


# ---- references and generator (plain torch, in-process) ----


def test_generator_builds_the_real_page_layout():
    inputs = ref.make_indexer_inputs(8, 64, 4, 200, seed=3)
    assert inputs.kvcache.dtype == torch.uint8 and tuple(inputs.kvcache.shape[1:]) == (64, 1, 132)
    flat = inputs.kvcache.view(-1, 8448)
    scales = flat[:, 8192:].contiguous().view(torch.float32)
    values = flat[:, :8192].contiguous().view(torch.float8_e4m3fn).float().view(-1, 64, 128)
    # s_k = max(amax, 1e-4)/448: the largest stored fp8 value of each position is about 448.
    assert torch.all(scales > 0)
    assert torch.allclose(values.abs().amax(-1), torch.full_like(scales, 448.0), rtol=0.07)
    lengths = inputs.seq_lens.tolist()
    assert {0, 200, 192, 64, 1, 63, 65} <= set(lengths)  # zero, full, exact page multiples, edges
    assert inputs.max_seq_len == 256 and inputs.page_table.dtype == torch.int32


def test_stale_entries_are_random_valid_ids_past_each_length():
    inputs = ref.make_indexer_inputs(8, 64, 6, 384, seed=4)
    num_pages = inputs.kvcache.shape[0]
    table = inputs.page_table
    assert int(table.min()) >= 0 and int(table.max()) < num_pages
    live = [table[b, : -(-n // 64)].tolist() for b, n in enumerate(inputs.seq_lens.tolist())]
    flat = [p for row in live for p in row]
    assert len(flat) == len(set(flat))  # live pages are distinct (shuffled pool pages)
    invalid = ref.make_indexer_inputs(8, 64, 6, 384, seed=4, stale="invalid")
    for b, n in enumerate(invalid.seq_lens.tolist()):
        stale = invalid.page_table[b, -(-n // 64):]
        assert stale.numel() == 0 or int(stale.min()) >= 2 ** 30


def test_exact_reference_reads_only_live_pages():
    inputs = ref.make_indexer_inputs(6, 64, 4, 256, seed=5, stale="invalid")
    out = ref.exact_logits_f64(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                               inputs.page_table, inputs.max_seq_len)
    for b, n in enumerate(inputs.seq_lens.tolist()):
        assert torch.isfinite(out[b, :n]).all() and torch.all(out[b, n:] == float("-inf"))


def test_fallback_matches_float64_within_bf16_and_ignores_nothing_past_length():
    inputs = ref.make_indexer_inputs(8, 64, 4, 256, seed=6, seq_lens_2d=True)
    exact = ref.exact_logits_f64(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                                 inputs.page_table, inputs.max_seq_len)
    stats = ref.compare(ref.fallback_logits(*inputs.args()), exact, inputs.seq_lens)
    assert stats["pattern_ok"] and stats["rel"] < 5e-3
    chunked = ref.fallback_logits(*inputs.args(), row_chunk=3)
    assert torch.equal(chunked, ref.fallback_logits(*inputs.args()))


def test_compare_flags_a_broken_pattern():
    inputs = ref.make_indexer_inputs(3, 64, 2, 128, seed=7, lengths=[100, 0, 128])
    exact = ref.exact_logits_f64(inputs.q_fp8, inputs.kvcache, inputs.weight, inputs.seq_lens,
                                 inputs.page_table, inputs.max_seq_len)
    broken = exact.clone().float()
    broken[0, 120] = 0.0  # a tail position that is not -inf
    assert not ref.compare(broken, exact, inputs.seq_lens)["pattern_ok"]
    assert ref.compare(exact.float(), exact, inputs.seq_lens)["pattern_ok"]


# ---- argument checks: every one raises before any launch, naming the problem ----


def _args(**override):
    inputs = ref.make_indexer_inputs(2, 64, 2, 128, seed=8)
    args = dict(q_fp8=inputs.q_fp8, kvcache=inputs.kvcache, weight=inputs.weight,
                seq_lens=inputs.seq_lens, page_table=inputs.page_table, deep_gemm_metadata=None,
                max_seq_len=inputs.max_seq_len, clean_logits=False)
    args.update(override)
    return args


def _q(**kw):
    return torch.zeros(kw.get("shape", (2, 1, 64, 128))).to(kw.get("dtype", torch.float8_e4m3fn))


BAD_ARGS = [
    ({"q_fp8": _q(dtype=torch.bfloat16)}, "q_fp8 must be torch.float8_e4m3fn"),
    ({"q_fp8": _q(shape=(2, 2, 64, 128))}, "next_n == 1"),
    ({"q_fp8": _q(shape=(2, 1, 64, 64))}, "head_dim must be 128"),
    ({"q_fp8": _q(shape=(2, 1, 48, 128))}, "index heads must be 16, 32, 64 or 128"),
    ({"q_fp8": _q(shape=(2, 1, 64, 256))[..., ::2]}, "q_fp8 must be contiguous"),
    ({"kvcache": torch.zeros(4, 64, 1, 132, dtype=torch.int8)}, "kvcache must be the uint8"),
    ({"kvcache": torch.zeros(4, 32, 1, 132, dtype=torch.uint8)}, "page size must be 64"),
    ({"kvcache": torch.zeros(4, 64, 1, 130, dtype=torch.uint8)}, "[num_pages, 64, 1, 132]"),
    ({"kvcache": torch.zeros(4, 4224, dtype=torch.uint8)}, "8448 bytes"),
    ({"kvcache": torch.zeros(4, 64, 132, dtype=torch.uint8)}, "kvcache must be [num_pages"),
    ({"kvcache": torch.zeros(4, 64, 1, 264, dtype=torch.uint8)[..., ::2]}, "kvcache must be contiguous"),
    ({"kvcache": torch.zeros(0, 64, 1, 132, dtype=torch.uint8)}, "kvcache holds no pages"),
    ({"kvcache": torch.zeros(4 * 8448 + 2, dtype=torch.uint8)[2:].view(4, 8448)}, "4-byte aligned"),
    ({"weight": torch.zeros(2, 64, dtype=torch.bfloat16)}, "weight must be float32"),
    ({"weight": torch.zeros(2, 32)}, "weight must be [B, H]"),
    ({"weight": torch.zeros(64, 2).t()}, "weight must be contiguous"),
    ({"seq_lens": torch.zeros(2, dtype=torch.int64)}, "seq_lens must be int32"),
    ({"seq_lens": torch.zeros(3, dtype=torch.int32)}, "seq_lens must be [B] or [B, 1]"),
    ({"seq_lens": torch.zeros(2, 2, dtype=torch.int32)}, "seq_lens must be [B] or [B, 1]"),
    ({"page_table": torch.zeros(2, 2, dtype=torch.int64)}, "page_table must be int32"),
    ({"page_table": torch.zeros(3, 2, dtype=torch.int32)}, "page_table must be [B, P]"),
    ({"page_table": torch.zeros(2, 0, dtype=torch.int32)}, "P == 0"),
    ({"page_table": torch.zeros(2, 2, dtype=torch.int32).t().contiguous().t()}, "column stride 1"),
    ({"max_seq_len": 129}, "max_seq_len must be in [1, P*64] = [1, 128]"),
    ({"max_seq_len": 0}, "max_seq_len must be in [1, P*64]"),
    ({"max_seq_len": 128.0}, "max_seq_len must be an int"),
    ({"max_seq_len": True}, "max_seq_len must be an int"),
    ({"clean_logits": True}, "clean_logits=True is not supported"),
    ({"weight": [0.0] * 64}, "weight must be a torch.Tensor"),
]


@pytest.mark.parametrize("override,message", BAD_ARGS, ids=[m for _, m in BAD_ARGS])
def test_bad_arguments_raise_clear_errors(override, message):
    with pytest.raises(ValueError) as info:
        indexer.fp8_paged_mqa_logits(**_args(**override))
    assert message in str(info.value)
    assert str(info.value).startswith("fp8_paged_mqa_logits: ")


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setattr(indexer, "_INTERPRET", False)
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        indexer.fp8_paged_mqa_logits(**_args())


def test_mixed_devices_are_refused():
    args = _args()
    args["weight"] = args["weight"].to("meta")
    with pytest.raises(ValueError, match="weight is on meta but q_fp8 is on cpu"):
        indexer.fp8_paged_mqa_logits(**args)


def test_seq_lens_b1_is_accepted_and_squeezed(monkeypatch):
    monkeypatch.setattr(indexer, "_INTERPRET", True)
    args = _args(seq_lens=torch.tensor([[5], [0]], dtype=torch.int32))
    checked = indexer.check_args(args["q_fp8"], args["kvcache"], args["weight"], args["seq_lens"],
                                 args["page_table"], args["max_seq_len"], False)
    assert tuple(checked[4].shape) == (2,)


def test_grid_depends_only_on_batch_and_table_width():
    cpu = torch.device("cpu")
    assert indexer.programs_per_row(1, 4097, cpu) == indexer.programs_per_row(1, 4097, cpu)
    assert indexer.programs_per_row(64, 2, cpu) == 1
    assert 1 <= indexer.programs_per_row(1, 4097, cpu) <= 4097
    assert indexer.programs_per_row(1, 3, cpu) <= 3
    # The exact tail bounds each program's share of it; the skip policy needs no tail programs.
    assert indexer.programs_per_row(64, 4097, cpu, tail="exact") >= 4097 * 64 // 4096
    assert indexer.programs_per_row(64, 4097, cpu, tail="skip") == 1
