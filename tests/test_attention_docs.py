"""docs/attention.md quotes the committed benchmark JSON; its table must be the generated one."""

import json
from pathlib import Path

from dsv4kit.validation.bench_attention import table

ROOT = Path(__file__).resolve().parents[1]


def test_doc_table_is_generated_from_the_committed_json():
    doc = (ROOT / "docs" / "attention.md").read_text()
    start = doc.index("<!-- generated: bench_attention_h200 -->\n") + len("<!-- generated: bench_attention_h200 -->\n")
    end = doc.index("<!-- end generated -->")
    result = json.loads((ROOT / "docs" / "results" / "bench_attention_h200.json").read_text())
    assert doc[start:end] == table(result)


def test_quoted_validation_row_is_in_the_committed_json():
    doc = (ROOT / "docs" / "attention.md").read_text()
    report = json.loads((ROOT / "docs" / "results" / "validation_attention_h200.json").read_text())
    worst = report["suites"]["attention"]["worst"]
    assert report["passed"] and len(report["suites"]["attention"]["rows"]) == 28
    assert f"{worst['case']} rel={worst['rel']:.3e}" in doc
