import json

import pytest

from dsv4kit.validation import harness, rows


def test_unknown_suite_is_named():
    with pytest.raises(ValueError, match="unknown suite 'indexr'"):
        harness.parse_cases("indexr")


def test_empty_selection_is_refused():
    with pytest.raises(ValueError, match="selects nothing"):
        harness.parse_cases(" , ")


def test_report_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "report.json"

    class Unserialisable:
        def __str__(self):
            raise KeyboardInterrupt  # as if the run were interrupted mid-write

    with pytest.raises(KeyboardInterrupt):
        rows.write_json_atomic(str(path), {"a": Unserialisable()})
    assert list(tmp_path.iterdir()) == []

    rows.write_json_atomic(str(path), {"rel": float("nan"), "dtype": object})
    data = json.loads(path.read_text())
    assert data["rel"] != data["rel"] and data["dtype"].startswith("<class")
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
