"""One place for validation reports: `validate` keeps them where `provision` and `rollout plan`
look, from whatever directory each runs, and `$DSV4KIT_RESULTS_DIR` / `--results-dir` move it."""

from __future__ import annotations

import json
from pathlib import Path


from dsv4kit.core import exitcodes, wheelbuild
from dsv4kit.core.paths import default_results_dir
from dsv4kit.rollout import plan as kernel_plan
from tests.remote_inventory import write_inventory
from tests.rollout.test_kernel_plan import ATTENTION, INDEXER, keep, validated_report
from tests.rollout.test_kernel_plan_box import box_python
from tests.cli_support import cli

AUTO = {INDEXER: "auto", ATTENTION: "auto"}


def test_default_is_in_the_home_not_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("DSV4KIT_RESULTS_DIR")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_results_dir() == tmp_path / "home/.local/share/dsv4kit/validation"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_results_dir() == tmp_path / "data/dsv4kit/validation"
    monkeypatch.setenv("DSV4KIT_RESULTS_DIR", "~/reports")
    assert default_results_dir() == tmp_path / "home/reports"


def test_validate_keeps_the_report_where_plan_reads_it_from_another_directory(tmp_path, loopback_ssh,
                                                                             monkeypatch):
    """The quickstart's order with no --results-dir: validate in one directory, plan in another."""
    monkeypatch.delenv("DSV4KIT_RESULTS_DIR")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    box_python(tmp_path / "inv/venv")
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_kernel_flags=AUTO)
    wheel = wheelbuild.build_wheel(tmp_path / "wheel").path
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    code, out, err = cli("validate", "--gpu", "3", "-i", str(inventory), "--interpret", "--cases",
                         "indexer:1x2x100x16", "--wheel", str(wheel))
    assert code == exitcodes.OK, out + err
    kept = kernel_plan.latest_report(tmp_path / "home/.local/share/dsv4kit/validation", "lo")
    assert kept is not None and not (tmp_path / "a/results").exists()
    monkeypatch.chdir(tmp_path / "b")
    code, out, err = cli("rollout", "plan", "-i", str(inventory))
    # Found (and skipped: an interpreter run is no full verdict), not "no validation report".
    assert code == exitcodes.OK, out + err
    assert f"skipping report {kept.name}: it ran on Triton's CPU interpreter" in err, out + err


def test_the_variable_moves_the_reports_and_the_flag_beats_it(tmp_path, loopback_ssh, monkeypatch):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_kernel_flags=AUTO)
    moved = tmp_path / "moved"
    monkeypatch.setenv("DSV4KIT_RESULTS_DIR", str(moved))
    report = validated_report(tmp_path, monkeypatch)
    report["verdict"]["status"] = "skipped"
    kept = keep(moved, report, host="lo")
    code, out, err = cli("rollout", "plan", "-i", str(inventory))
    assert code == exitcodes.OK and f"skipping report {kept.name}: its kernel verdict is skipped" in err, out + err
    code, out, err = cli("rollout", "plan", "-i", str(inventory), "--results-dir", str(tmp_path / "empty"), "--json")
    assert code == exitcodes.OK, out + err
    assert json.loads(out)["decisions"][INDEXER]["source"] == "no report"
    assert f"no full validation report in {tmp_path / 'empty'}" in err
