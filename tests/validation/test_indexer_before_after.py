"""The before/after indexer benchmark: loading the earlier kernels, its errors, verdict and table
(CPU; the GPU run is committed JSON)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4kit.validation import bench_indexer_before_after as ba

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "docs" / "results" / "bench_indexer_before_after_h100.json"
DOC = ROOT / "docs" / "indexer.md"


def _copy_kernels(dest: Path, indexer_text: str | None = None) -> Path:
    dest.mkdir()
    (dest / "indexer.py").write_text(indexer_text if indexer_text is not None
                                     else (ROOT / "kernels" / "indexer.py").read_text())
    (dest / "indexer_tiles.py").write_text((ROOT / "kernels" / "indexer_tiles.py").read_text())
    return dest


def test_the_earlier_entry_runs_the_earlier_row_tile_kernel(tmp_path):
    before = ba.load_before(str(_copy_kernels(tmp_path / "k")))
    assert before.fp8_paged_mqa_logits_for_sglang is not None
    tiles = sys.modules[ba.BEFORE_TILES]
    assert tiles.__file__ == str(tmp_path / "k" / "indexer_tiles.py")
    # The swap happened in the code the entry runs: the function that launches the row tiles
    # imports the earlier module, and nothing in it imports today's.
    from dsv4kit.kernels import indexer_tiles as current

    assert tiles._shared_rows_kernel is not current._shared_rows_kernel
    names = before.fp8_paged_mqa_logits.__code__.co_names
    assert ba.BEFORE_TILES in names and "dsv4kit.kernels" not in names


@pytest.mark.parametrize("case, why", [
    ("missing", "missing"),
    ("no tiles import", "does not import its row-tile kernel"),
    ("broken", "does not load: SyntaxError"),
])
def test_a_before_directory_that_cannot_serve_is_named_in_one_line(tmp_path, case, why):
    if case == "missing":
        (tmp_path / "k").mkdir()
        (tmp_path / "k" / "indexer.py").write_text("")
    else:
        text = (ROOT / "kernels" / "indexer.py").read_text()
        text = text.replace(ba.TILES_IMPORT, "pass") if case == "no tiles import" else text + "\ndef (:\n"
        _copy_kernels(tmp_path / "k", text)
    out = subprocess.run([sys.executable, "-m", "dsv4kit.validation.bench_indexer_before_after",
                          "--before", str(tmp_path / "k")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and why in out.stderr and "Traceback" not in out.stderr, out.stderr


def _point(kind, ratios):
    return {"name": kind, "kind": kind, "checks": {"after": {"pattern_ok": True, "rel": 1e-4}},
            **ba.paired([10.0] * len(ratios), [10.0 * r for r in ratios])}


def test_the_verdict_needs_the_passes_to_agree_before_it_says_slower():
    # One slow pass does not decide it; "NO" needs a decode shape beyond the bar in every pass,
    # and passes that disagree about the bar leave it open.
    assert ba.summarise([_point("decode", [0.99, 1.2, 1.0]), _point("prefill", [2.0] * 3)])[
        "decode_not_slower"] == "yes"
    slow = ba.summarise([_point("decode", [1.04, 1.05, 1.06])])
    assert slow["decode_not_slower"] == "NO" and slow["worst_decode_ratio"] == pytest.approx(1.05)
    assert ba.summarise([_point("decode", [1.0, 1.05, 1.04])])["decode_not_slower"] == "inconclusive"
    assert ba.summarise([_point("prefill", [1.0])])["decode_not_slower"] == "not measured"


def test_the_doc_table_is_the_render_of_the_committed_gpu_result():
    payload = json.loads(RESULT.read_text())
    assert payload["kind"] == ba.KIND and "H100" in payload["environment"]["gpu"]
    assert payload["command"].startswith("python -m dsv4kit.validation.bench_indexer_before_after")
    assert {p["kind"] for p in payload["points"]} == {"decode", "verify", "prefill"}
    assert all(len(p["ratios"]) == ba.PASSES for p in payload["points"])
    block = DOC.read_text().split("<!-- generated:before_after -->\n", 1)[1].split("<!-- /generated -->")[0]
    assert block.strip() == ba.render(payload).strip()
