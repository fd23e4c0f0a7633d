"""docs/attention.md quotes the committed stock comparison; the table is generated from its JSON."""

import json
import math
from pathlib import Path

from dsv4kit.core import exitcodes
from dsv4kit.validation import bench_attention_stock as stock

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "docs" / "results" / "bench_attention_stock_h200.json"


def _block(doc: str, name: str) -> str:
    start_tag = f"<!-- generated: {name} -->\n"
    start = doc.index(start_tag) + len(start_tag)
    return doc[start:doc.index("<!-- end generated -->", start)]


def test_doc_table_is_generated_from_the_committed_json():
    doc = (ROOT / "docs" / "attention.md").read_text()
    assert _block(doc, "bench_attention_stock_h200") == stock.render(json.loads(RESULT.read_text()))


def test_committed_run_timed_ours_beside_flashmla_triton_and_torch_in_one_process():
    result = json.loads(RESULT.read_text())
    assert result["environment"]["capability"] == "sm_90" and result["command"].startswith("python -m")
    assert result["stock_default"] == "flashmla-sm90"
    assert {"dsv4kit", "flashmla-sm90", "sglang-triton-sm120", "sglang-torch"} <= set(result["implementations"])
    assert result["unavailable"]["flashinfer-sm120"] == "not available: needs sm_120"
    assert {(p["layer"], p["T"]) for p in result["points"]} == {
        (layer, T) for layer in ("c4", "c128") for T in (1, 16, 64)}
    for p in result["points"]:
        assert all(t is not None for t in p["times_us"].values())
        assert all(r <= 1e-2 for r in p["rel"].values() if not math.isnan(r))


def _result(ours, flashmla, triton):
    point = {"layer": "c4", "T": 1, "times_us": {"dsv4kit": ours, "flashmla-sm90": flashmla,
                                                 "sglang-triton-sm120": triton},
             "rel": {"dsv4kit": 2e-3, "flashmla-sm90": 1.7e-3, "sglang-triton-sm120": 2.3e-3},
             "vs_stock_default": ours / flashmla, "speedup_vs_triton": triton / ours}
    return {"command": "python -m dsv4kit.validation.bench_attention_stock", "stock_default": "flashmla-sm90",
            "environment": {"gpu": "test", "capability": "sm_90", "torch": "x", "triton": "y"},
            "implementations": {n: {"origin": "o", "stock_default": n == "flashmla-sm90"}
                                for n in point["times_us"]},
            "unavailable": {"flashinfer-sm120": "not available: needs sm_120"}, "points": [point],
            "targets": {"ours_le_stock_default": {"value": ours / flashmla, "met": ours <= flashmla},
                        "speedup_vs_sglang_triton": {"value": triton / ours, "met": triton / ours >= 100}}}


def test_render_states_misses_plainly():
    text = stock.render(_result(17.0, 12.3, 276.0))
    assert "| c4 | 1 | 17.0 | 12.3 | 276.0 | 1.38 | 16x |" in text
    assert "at every point: NOT met (worst 1.38)" in text and "NOT met (least 16x)" in text
    assert "| flashinfer-sm120 | - | not available: needs sm_120 |" in text
    text = stock.render(_result(10.0, 12.3, 2760.0))
    assert "at every point: met (worst 0.81)" in text and ": met (least 276x)." in text


def test_render_of_a_missing_file_is_a_usage_error(tmp_path):
    assert stock.main(["--render", str(tmp_path / "none.json")]) == exitcodes.USAGE


def test_without_a_gpu_the_bench_exits_with_environment(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert stock.main(["--out", "/nonexistent-not-created"]) == exitcodes.ENVIRONMENT
    assert "needs a CUDA GPU" in capsys.readouterr().err
