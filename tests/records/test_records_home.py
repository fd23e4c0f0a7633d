"""The results repository's default is the same from every directory: a record published from one
directory is listed from another, and `$DSV4KIT_RESULTS_REPO` / `--results-repo` move it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dsv4kit.core.paths import default_results_repo, results_repo_or_default
from tests.bench_support import synthetic_record
from tests.records.test_publish_failures import kept_spill

RUN = "lo-ctx4096-20260101T000100Z-dddddd"


def test_the_default_is_in_the_users_data_dir_and_the_variable_and_option_move_it(tmp_path, monkeypatch):
    monkeypatch.delenv("DSV4KIT_RESULTS_REPO")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert default_results_repo() == tmp_path / "home/.local/share/dsv4kit/results"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert results_repo_or_default(None) == tmp_path / "data/dsv4kit/results"
    monkeypatch.setenv("DSV4KIT_RESULTS_REPO", "~/records")
    assert results_repo_or_default(None) == tmp_path / "home/records"
    assert results_repo_or_default("~/given") == tmp_path / "home/given"


def dsv4kit(cwd: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_record_published_from_one_directory_is_listed_from_another(tmp_path):
    """Two commands, two working directories, no --results-repo: the same records."""
    record = synthetic_record(RUN, {1: [100.0, 101.0]})
    record["points"][1]["details_file"] = None
    spill = kept_spill(tmp_path / "spill", record)
    env = {k: v for k, v in os.environ.items() if k not in ("DSV4KIT_RESULTS_REPO", "XDG_DATA_HOME")}
    env["HOME"] = str(tmp_path / "home")
    here, there = tmp_path / "a", tmp_path / "b/deeper"
    here.mkdir()
    there.mkdir(parents=True)
    published = dsv4kit(here, env, "records", "publish", str(spill))
    assert published.returncode == 0, published.stdout + published.stderr
    listed = dsv4kit(there, env, "records", "list", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert RUN in listed.stdout, listed.stdout
    repo = tmp_path / "home/.local/share/dsv4kit/results"
    assert (repo / "records" / RUN / "record.json").is_file()
    assert not any(p.name == "results" for p in (tmp_path / "a").rglob("*")), "written under the working directory"
    # The variable moves it: the same record is not found elsewhere.
    moved = dsv4kit(there, {**env, "DSV4KIT_RESULTS_REPO": str(tmp_path / "elsewhere")}, "records", "list", "--json")
    assert RUN not in moved.stdout, moved.stdout


def test_every_results_repo_option_names_the_same_default():
    from tests.cli_support import cli

    for command in (["bench"], ["eval"], ["provision"], ["rollout", "plan"], ["records", "list"],
                    ["records", "publish"]):
        code, out, _ = cli(*command, "--help", env={"COLUMNS": "400"})
        assert code == 0 and "--results-repo" in out, command
        text = " ".join(out.split())
        assert "~/.local/share/dsv4kit/results" in text and "results/bench" not in text, (command, text)
