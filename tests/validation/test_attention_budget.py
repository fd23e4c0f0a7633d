"""The 2x-floor budget analysis: arithmetic on a small synthetic result, and clear errors."""

import pytest

from dsv4kit.validation.attention_budget import budget_rows, budget_table, main


def _bench(num_splits=2):
    return {
        "environment": {"sm_count": 100},
        "rates": {"copy_bytes_per_s": 1e12},
        "points": [{"layer": "c4", "T": 4, "H": 64, "floor_us": 10.0, "floor_mma_us": 10.0,
                    "floor_bandwidth_us": 5.0, "kernel_us": 50.0, "num_splits": num_splits}],
    }


def _sweep():
    wide = {"block_h": 64, "wide": True, "dim_split": False}
    return {"variants": [
        {"name": "default", "correct": True, "config": wide, "num_splits_T64": "auto", "c4_T64_zero_length_us": 8.0},
        {"name": "broken_nosplit", "correct": False, "config": wide, "num_splits_T64": 1,
         "c4_T64_zero_length_us": 1.0},
        {"name": "nosplit", "correct": True, "config": wide, "num_splits_T64": 1, "c4_T64_zero_length_us": 5.0},
    ]}


def test_rows_follow_from_the_two_files():
    split, nosplit, ideal = budget_rows(_bench(), _sweep(), "c4", 4)
    # 2x floor = 20 us; 4 tokens x 1 head block x 2 splits = 8 programs on 100 SMs.
    assert split["variant"] == "default" and split["programs"] == 8
    assert split["loop_budget_us"] == pytest.approx(12.0)
    assert split["loop_mma_us"] == pytest.approx(10.0 * 100 / 8)
    assert split["needed_share_of_matmul_rate"] == pytest.approx(125.0 / 12.0)
    assert nosplit["variant"] == "nosplit" and nosplit["programs"] == 4  # the incorrect row is skipped
    # q + out: 2 * 4 tokens * 64 heads * 512 dims * 2 bytes at 1 TB/s.
    assert ideal["fixed_us"] == pytest.approx(2 * 4 * 64 * 512 * 2 / 1e12 * 1e6)
    assert ideal["loop_mma_us"] == pytest.approx(10.0)


def test_nothing_left_is_reported_as_impossible():
    bench = _bench()
    bench["points"][0]["floor_us"] = 3.0  # 2x floor = 6 us < the 8 us fixed cost
    assert "impossible (nothing left)" in budget_table(bench, _sweep(), "c4", 4)


def test_missing_rows_name_what_is_missing(tmp_path, capsys):
    with pytest.raises(ValueError, match="no c4 T=64 point"):
        budget_rows(_bench(), _sweep())
    sweep = _sweep()
    sweep["variants"] = sweep["variants"][:1]
    with pytest.raises(ValueError, match="unsplit wide BLOCK_H=64"):
        budget_rows(_bench(), sweep, "c4", 4)
    assert main([str(tmp_path / "missing.json"), str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
