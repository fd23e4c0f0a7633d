"""The committed GPU results that docs quote are real harness output, and the quotes match them."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def test_full_gpu_validation_report_passed_on_cuda():
    payload = json.loads((RESULTS / "validation_h200.json").read_text())
    assert payload["kind"] == "dsv4kit-validation" and payload["passed"]
    assert payload["environment"]["device"] == "cuda" and payload["environment"]["gpu"]
    assert set(payload["suites"]) == {"indexer", "attention"}
    for suite in payload["suites"].values():
        impls = {row["impl"] for row in suite["rows"]}
        assert {"kernel", "graph-replay", "determinism"} <= impls


def test_attention_profile_excerpt_is_copied_from_the_committed_report():
    doc = (ROOT / "docs" / "attention.md").read_text()
    section = doc.split("### Profile (Nsight Compute", 1)[1]
    excerpt = re.search(r"```\n(.*?)```", section, re.S).group(1).strip().splitlines()
    report = [line.strip() for line in (RESULTS / "ncu_attention_c4_t64.txt").read_text().splitlines()]
    assert excerpt and all(line.strip() in report for line in excerpt)
