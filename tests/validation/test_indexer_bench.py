"""The indexer benchmark's grid, floor and reporting (the timing itself needs a GPU), and the
docs table being generated from the committed GPU result."""

import json
from pathlib import Path

from dsv4kit.core import exitcodes
from dsv4kit.validation import bench_indexer as bench

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "docs" / "results" / "bench_indexer_h200.json"
VALIDATION = ROOT / "docs" / "results" / "validation_indexer_h200.json"
TUNING = ROOT / "docs" / "results" / "bench_indexer_h200_tune.json"  # a --tune run of this kernel


def test_max_seq_len_follows_sglang():
    assert [bench.table_pages(c) * 64 for c in (8192, 131072, 1048576)] == [2112, 32832, 262208]


def test_grid_skips_lengths_beyond_the_context():
    points = bench.grid_points(quick=False)
    assert len(points) == 3 * 7
    assert all(p["tokens"] <= p["context"] and p["c4_len"] == p["tokens"] // 4 for p in points)
    assert {(p["batch"], p["context"], p["tokens"]) for p in points} >= {(64, 131072, 2048),
                                                                          (1, 1048576, 131072)}


def test_read_floor_is_136_bytes_per_position():
    point = {"batch": 2, "c4_len": 65, "max_seq_len": 2112}
    assert bench.floor_bytes(point) == 2 * 65 * 136


def _point(batch, tokens, context, ours, tilelang, fallback, floor_us):
    times = {bench.OURS: ours, bench.EXACT_NAME: ours, bench.TILELANG_NAME: tilelang,
             bench.TORCH_NAME: fallback}
    applies = tokens >= bench.FLOOR_MIN_TOKENS
    return {"batch": batch, "heads": 64, "tokens": tokens, "c4_len": tokens // 4, "context": context,
            "pages": bench.table_pages(context), "max_seq_len": bench.table_pages(context) * 64,
            "times_us": times, "rel": {n: 1e-4 for n in times}, "max_abs": {n: 1e-3 for n in times},
            "pattern_ok": {n: True for n in times},
            "skipped": {} if fallback is not None else {bench.TORCH_NAME: "over budget"},
            "kernel_us": ours, "floor_us": floor_us, "kernel_vs_floor": ours / floor_us,
            "floor_target_applies": applies,
            "floor_target_met": (ours <= bench.FLOOR_FACTOR * floor_us) if applies else None,
            "vs_tilelang": None if tilelang is None else ours / tilelang,
            "tilelang_target_met": None if tilelang is None else ours <= tilelang,
            "speedup": None if fallback is None else fallback / ours}


def _payload(points):
    return {"command": "python -m dsv4kit.validation.bench_indexer", "points": points,
            "environment": {"gpu": "test", "capability": "sm_90", "torch": "x", "triton": "y"},
            "bandwidth": {"copy_GBps": 4000.0, "fill_GBps": 4000.0, "method": "m",
                          "graph_node_floor_us": 1.5},
            "implementations": {bench.OURS: {"origin": "dsv4kit"},
                                bench.TILELANG_NAME: {"origin": "wheel:/x"}},
            "unavailable": {"flashinfer-sm120": "not available: needs sm_120"},
            "summary": bench.summarise(points)}


def test_summary_reports_missed_targets_honestly():
    points = [_point(64, 2048, 131072, 3.0, 3.5, 1200.0, 1.0),
              _point(16, 32768, 131072, 6.0, 5.0, 800.0, 4.0),
              _point(1, 131072, 1048576, 3.0, 3.5, 400.0, 1.0)]
    summary = bench.summarise(points)
    assert summary["tilelang_target_met"] == 2
    assert summary["tilelang_target_missed"] == ["B=16 len=32K ctx=128K"]
    assert summary["floor_points"] == 2 and summary["floor_target_met"] == 0
    assert summary["floor_target_missed"] == ["B=16 len=32K ctx=128K", "B=1 len=128K ctx=1M"]
    assert summary["speedup_target"]["speedup"] == 400.0 and summary["speedup_target"]["met"]
    assert not summary["all_targets_met"]
    text = bench.render_summary(_payload(points)) + "\n" + bench.render_table(_payload(points))
    assert "met at 2 of 3 points; missed at B=16 len=32K ctx=128K." in text
    assert "| NO |" in text and "400x, met" in text


def test_a_point_without_tilelang_counts_as_not_measured():
    summary = bench.summarise([_point(64, 2048, 131072, 3.0, None, 1200.0, 1.0)])
    assert summary["tilelang_not_measured"] == ["B=64 len=2K ctx=128K"]
    assert not summary["all_targets_met"]


def test_skipped_fallback_renders_as_skipped():
    table = bench.render_table(_payload([_point(64, 2048, 1048576, 3.0, 3.5, None, 1.0)]))
    assert "| skipped |" in table


def test_error_table_names_every_implementation_and_the_unavailable_ones():
    text = bench.render_errors(_payload([_point(64, 2048, 131072, 3.0, 3.5, 1200.0, 1.0)]))
    assert "| dsv4kit | dsv4kit | 1.00e-04 |" in text
    assert "| sglang-tilelang | wheel | 1.00e-04 |" in text  # the run's directory is left out
    assert "| flashinfer-sm120 | - | not available: needs sm_120 |" in text


def test_plot_writes_a_png(tmp_path):  # matplotlib is in the test extra
    points = [_point(1, 2048, c, 5.0, 6.0, 50.0 * c / 8192, 2.0) for c in bench.CONTEXTS_TOKENS]
    path = bench.plot(_payload(points), str(tmp_path / "p.png"), print)
    assert path and Path(path).read_bytes()[:4] == b"\x89PNG"


def test_without_a_gpu_the_bench_exits_with_environment(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", "/nonexistent-not-created"]) == exitcodes.ENVIRONMENT
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_render_of_a_missing_file_is_a_usage_error(tmp_path):
    assert bench.main(["--render", str(tmp_path / "none.json")]) == exitcodes.USAGE


def test_docs_table_is_generated_from_the_committed_result():
    payload = json.loads(RESULT.read_text())
    doc = (ROOT / "docs" / "indexer.md").read_text()
    assert bench.render_table(payload) in doc
    assert bench.render_summary(payload) in doc
    tuning = json.loads(TUNING.read_text())
    assert bench.render_tuning(tuning) in doc
    assert bench.render_errors(payload) in doc
    # TileLang was timed at every grid point in the same run (whether ours met it is in the doc).
    assert payload["summary"]["tilelang_points"] == 21 and not payload["summary"]["tilelang_not_measured"]
    assert {"dsv4kit", "sglang-tilelang", "sglang-torch"} <= set(payload["implementations"])
    assert payload["environment"]["gpu"] and payload["command"].startswith("python -m dsv4kit")


def test_docs_quote_the_committed_gpu_validation():
    from dsv4kit.validation import indexer_suite

    payload = json.loads(VALIDATION.read_text())
    assert payload["passed"] and payload["environment"]["device"] == "cuda"
    impls = {row["impl"] for row in payload["suites"]["indexer"]["rows"]}
    assert {"kernel", "dsv4kit", "fallback", "sglang-tilelang", "sglang-torch", "graph-replay",
            "determinism"} <= impls
    doc = (ROOT / "docs" / "indexer.md").read_text()
    assert indexer_suite.report_lines(payload) in doc


def test_update_doc_regenerates_only_the_marked_blocks(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("intro 1.5\n<!-- generated:table -->\nstale\n<!-- /generated -->\n"
                   "<!-- generated:other -->\nkept\n<!-- /generated -->\nend\n")
    payload = _payload([_point(1, 2048, 8192, 2.0, 2.5, 30.0, 1.0)])
    bench.update_doc(str(doc), payload, None)
    text = doc.read_text()
    assert "stale" not in text and bench.render_table(payload) in text
    assert text.startswith("intro 1.5\n") and "kept" in text and text.endswith("end\n")
    bench.update_doc(str(doc), payload, None)
    assert doc.read_text() == text  # idempotent


def test_documented_update_doc_command_leaves_the_page_unchanged(tmp_path):
    page = tmp_path / "indexer.md"
    page.write_text((ROOT / "docs" / "indexer.md").read_text())
    assert bench.main(["--update-doc", str(page), "--bench-json", str(RESULT), "--validation-json",
                       str(VALIDATION), "--tuning-json", str(TUNING)]) == exitcodes.OK
    from dsv4kit.validation import bench_indexer_fp4

    assert bench_indexer_fp4.main(["--update-doc", str(page), "--fp4-json",
                                   str(ROOT / "docs" / "results" / "bench_indexer_fp4_h200.json")]) == exitcodes.OK
    assert page.read_text() == (ROOT / "docs" / "indexer.md").read_text()
