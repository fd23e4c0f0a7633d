"""The prefill benchmarks' committed results, the tables docs/indexer.md shows from them, and the
summary rules (CPU only: the GPU runs are committed JSON)."""

import json
import re
from pathlib import Path

from dsv4kit.validation import bench_indexer_breakdown as breakdown
from dsv4kit.validation import bench_indexer_prefill as prefill

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
DOC = ROOT / "docs" / "indexer.md"
COMMITTED = {  # generated block -> (result file, renderer, kind)
    "prefill": ("bench_indexer_prefill_h100.json", prefill.render, prefill.KIND),
    "fp4_prefill": ("bench_indexer_fp4_prefill_h100.json", prefill.render, prefill.KIND_FP4),
    "prefill_breakdown": ("bench_indexer_breakdown_h100.json", breakdown.render, breakdown.KIND),
}


def _block(name: str) -> str:
    match = re.search(rf"<!-- generated:{name} -->\n(.*?)<!-- /generated -->", DOC.read_text(), re.S)
    assert match, name
    return match.group(1).strip()


def test_each_doc_table_is_the_render_of_its_committed_gpu_result():
    for block, (name, render, kind) in COMMITTED.items():
        payload = json.loads((RESULTS / name).read_text())
        assert payload["kind"] == kind, name
        assert payload["command"].startswith("python -m dsv4kit.validation."), name
        assert "H100" in payload["environment"]["gpu"], name
        assert _block(block) == render(payload).strip(), f"re-render {name} into docs/indexer.md"


def test_the_committed_runs_checked_every_implementation_and_time_the_launch_floor():
    for name in ("bench_indexer_prefill_h100.json", "bench_indexer_fp4_prefill_h100.json"):
        payload = json.loads((RESULTS / name).read_text())
        assert payload["launch_floor_us"] > 0
        for p in payload["points"]:
            assert p["checks"] and all(c["pattern_ok"] for c in p["checks"].values()), p["name"]
            assert len(p["times_us_passes"]) == prefill.PASSES
    fp4 = json.loads((RESULTS / "bench_indexer_fp4_prefill_h100.json").read_text())
    assert {p["kind"] for p in fp4["points"]} == {"prefill", "verify"}
    assert set(fp4["points"][0]["times_us"]) == {prefill.OURS_FP4, prefill.PER_ROW_FP4}


def test_fp4_shapes_are_the_prefill_and_verify_shapes_without_decode():
    fp8 = prefill.shapes()
    fp4 = prefill.shapes(fp4=True)
    assert fp4 == [s for s in fp8 if s["kind"] != "decode"]
    assert any(s["kind"] == "decode" for s in fp8)


def _point(prefix, ours, per_row):
    return {"kind": "prefill", "prefix": prefix, "vs_per_row": ours / per_row}


def test_the_fp4_summary_says_no_when_row_tiles_lose_at_a_long_prefix():
    good = prefill.summarise_fp4([_point(0, 10, 10), _point(32768, 6, 10), _point(126976, 7, 10)])
    assert good["tiles_faster_long"] and good["worst_vs_per_row_long"] == 0.7
    bad = prefill.summarise_fp4([_point(32768, 6, 10), _point(126976, 11, 10)])
    assert not bad["tiles_faster_long"]


def _decode(kernel, spread):
    return {"kind": "decode", "entry_kernel": kernel, "decode_met": kernel == "per row",
            "pass_spread": spread}


def test_the_decode_verdict_is_which_kernel_the_entry_launches_not_a_timing_margin():
    # Identical launches differ between passes by more than any fixed margin on a 3 us call; the
    # verdict is the dispatch state, and a row-tile launch at a decode shape fails it whatever the
    # times say.
    same = prefill.summarise([_decode("per row", 0.06), _decode("per row", 0.01)])
    assert same["decode_is_per_row_kernel"] and same["decode_pass_spread"] == 0.06
    assert not prefill.summarise([_decode("per row", 0.0), _decode("row tiles", 0.0)])[
        "decode_is_per_row_kernel"]
    assert not prefill.summarise([])["decode_is_per_row_kernel"]


def test_every_decode_and_verify_shape_of_the_bench_is_below_the_row_tile_thresholds():
    from dsv4kit.kernels import indexer

    for s in prefill.shapes():
        if s["kind"] == "decode":
            assert not indexer.uses_row_tiles(s["batch"], 131072 // 4), s["name"]
        if s["kind"] == "verify":
            rows = sum(r for _, r in s["requests"])
            assert not indexer.uses_row_tiles(rows, 131072 // 4), s["name"]
        if s["kind"] == "prefill" and s["prefix"]:
            rows = sum(r for _, r in s["requests"])
            assert indexer.uses_row_tiles(rows, (s["prefix"] + rows) // 4), s["name"]


def test_the_launch_floor_row_and_the_below_launch_line_follow_the_payload():
    payload = json.loads((RESULTS / "bench_indexer_prefill_h100.json").read_text())
    table = prefill.render(payload)
    assert "| empty kernel (launch floor) |" in table
    tiny = dict(payload, launch_floor_us=1e6)
    assert "Below the launch floor: at R=1024 prefix=0K" in prefill.render(tiny)


def test_the_ncu_excerpt_is_copied_from_the_committed_report():
    section = DOC.read_text().split("### Where the time above the floor goes", 1)[1]
    excerpt = re.search(r"```\n(.*?)```", section, re.S).group(1).strip().splitlines()
    report = [line.strip() for line in (RESULTS / "ncu_indexer_tiles_h100.txt").read_text().splitlines()]
    assert excerpt and all(line.strip() in report for line in excerpt)


def test_the_breakdowns_fp16_head_sum_computes_the_logits():
    """The `fp16 head sum` row (a second, fp16 product) is timed as a real alternative, so it must
    compute the real result: through Triton's interpreter (right for an fp16 tl.dot, not a bf16
    one) against float64, at a chunk whose second tile is partial and whose rows end mid-page."""
    import torch

    from dsv4kit.kernels import indexer_reference as ref

    inputs = ref.make_prefill_inputs([(300, 7)], 64, seed=2)
    exact = ref.exact_logits_f64(*inputs.args()[:5], inputs.max_seq_len)
    for name in ("full", "fp16 head sum"):
        out = breakdown.launch_variant(torch, inputs, breakdown.VARIANTS[name])
        stats = ref.compare(out, exact, inputs.seq_lens, tail="page")
        assert stats["pattern_ok"] and stats["compared"] > 0, name
        assert stats["rel"] < (1e-6 if name == "full" else 2e-3), (name, stats["rel"])
