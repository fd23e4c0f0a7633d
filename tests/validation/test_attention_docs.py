"""docs/attention.md quotes the committed benchmark JSON; its tables must be the generated ones."""

import json
from pathlib import Path

import pytest

from dsv4kit.validation.bench_attention import comparison_table, render

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _block(doc: str, name: str) -> str:
    start_tag = f"<!-- generated: {name} -->\n"
    start = doc.index(start_tag) + len(start_tag)
    return doc[start:doc.index("<!-- end generated -->", start)]


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


@pytest.mark.parametrize("block, source", [
    ("bench_attention_h200", "bench_attention_h200.json"),
    ("bench_attention_sweep_h200", "bench_attention_sweep_h200.json"),
    ("bench_attention_sweep_h200_run1", "bench_attention_sweep_h200_run1.json"),
    ("bench_attention_sweep_h200_run3", "bench_attention_sweep_h200_run3.json"),
    ("bench_attention_sweep_h200_run4", "bench_attention_sweep_h200_run4.json"),
    ("bench_attention_sweep_h200_mma_sync", "bench_attention_sweep_h200_mma_sync.json"),
    ("bench_attention_sweep_h200_run5", "bench_attention_sweep_h200_run5.json"),
])
def test_doc_tables_are_generated_from_the_committed_json(block, source):
    doc = (ROOT / "docs" / "attention.md").read_text()
    assert _block(doc, block) == render(_load(source))


def test_doc_budget_is_generated_from_the_committed_json():
    from dsv4kit.validation.attention_budget import budget_table

    doc = (ROOT / "docs" / "attention.md").read_text()
    expected = budget_table(_load("bench_attention_h200_h64.json"), _load("bench_attention_sweep_h200_run5.json"))
    assert _block(doc, "attention_budget_c4_t64") == expected


def test_doc_comparison_is_generated_from_the_committed_json():
    doc = (ROOT / "docs" / "attention.md").read_text()
    expected = comparison_table(_load("bench_attention_h200_before.json"), _load("bench_attention_h200_h64.json"))
    assert _block(doc, "bench_attention_h200_compare") == expected


def test_benchmark_ran_with_what_is_now_the_sm90_default():
    from dsv4kit.kernels.sparse_mla_decode import DecodeConfig, default_config

    # Fields added after that run take their defaults.
    assert DecodeConfig(**_load("bench_attention_h200_h64.json")["default_config"]) == default_config(64, (9, 0))
    assert DecodeConfig(**_load("bench_attention_h200.json")["default_config"]) == default_config(16, (9, 0))


def test_the_main_benchmark_times_the_decode_servers_heads():
    """docs/attention.md's main table is at the heads one GPU of the inventory's TP4 decode server gets."""
    from dsv4kit.validation.attention_heads import kernel_heads

    main, stock = _load("bench_attention_h200.json"), _load("bench_attention_stock_h200.json")
    assert "--decode-tp 4" in main["command"] and "--decode-tp 4" in stock["command"]
    assert {p["H"] for p in main["points"]} == {kernel_heads(4, 64)[1]} == {16}
    assert {(p["H"], p["padded_heads"]) for p in stock["points"]} == {kernel_heads(4, 1)}


def test_quoted_validation_row_is_in_the_committed_json():
    doc = (ROOT / "docs" / "attention.md").read_text()
    report = _load("validation_attention_h200.json")
    worst = report["suites"]["attention"]["worst"]
    assert report["passed"] and len(report["suites"]["attention"]["rows"]) == 28
    assert f"{worst['case']} rel={worst['rel']:.3e}" in doc


def test_fp8_q_table_is_generated_from_the_committed_json():
    from dsv4kit.validation.attention_fp8_q import table

    doc = (ROOT / "docs" / "attention.md").read_text()
    result = _load("attention_fp8_q_cpu.json")
    assert _block(doc, "attention_fp8_q_cpu") == table(result)
    # What the doc concludes from it: single e4m3 q fails the bar, the hi + lo pair passes.
    assert all(not r["within_bar"] for r in result["rows"] if r["mode"] != "hi_lo")
    assert all(r["within_bar"] for r in result["rows"] if r["mode"] == "hi_lo")


def test_mma_sync_sweep_compiled_mma_sync_only():
    result = _load("bench_attention_sweep_h200_mma_sync.json")
    assert "--mma-sync" in result["command"]
    assert result["compiled_mma_kinds"] == {"mma.sync": True, "wgmma": False}
