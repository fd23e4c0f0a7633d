"""``dsv4kit bench``: what must fail before connecting, and what happens at the commit point.

The inventories point at a closed port of the loopback sshd's address: a check that lets a run
through ends with exit 3 (unreachable), so exit 2 or 5 with the message proves the check ran
before any connection. The results repositories are real git repositories.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli_support import invoke

from dsv4kit.core import exitcodes

from dsv4kit.records import results_repo
from dsv4kit.records.record import comparability_key, dumps
from tests.bench_support import publish_record, synthetic_record
from tests.remote_inventory import closed_port, write_inventory

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--input-len", "16", "--output-len", "8", "--num-prompts", "8"]
C = ["--concurrency", "1,4"]
BASE = {1: [100.0, 101.0, 99.0], 4: [300.0, 303.0, 297.0]}


def dsv4kit(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT, env={**os.environ, **(env or {})})


def unreachable_inventory(tmp_path: Path, sshd, **overrides) -> Path:
    """One host "lo" nobody answers for (exit 3 once connected), shaped like the synthetic records."""
    values = dict(ansible_port=closed_port(), dsv4_context_length=4096, dsv4_model_revision="r1",
                  dsv4_model_path="/models/DeepSeek-V4-Flash")
    values.update(overrides)
    return write_inventory(tmp_path / "inv", sshd, **values)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


def untouched(repo: Path) -> None:
    assert not repo.exists() or [p.name for p in repo.iterdir() if p.name != ".git"] == []


# ------------------------------------------------------------------------ 1. the results repository
def test_a_results_repo_that_cannot_be_written_is_refused_before_connecting(tmp_path, loopback_ssh, unwritable_dir):
    inventory = unreachable_inventory(tmp_path, loopback_ssh)
    (tmp_path / "a-file").write_text("x")
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "-i", str(inventory),
                   "--results-repo", str(tmp_path / "a-file" / "results"))
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert "--results-repo" in proc.stderr and "a-file' is a file, not a directory" in proc.stderr
    no_traceback(proc)
    where = unwritable_dir / "dsv4kit-results"
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "-i", str(inventory), "--results-repo", str(where))
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert "cannot create the results repository" in proc.stderr and "is not writable" in proc.stderr
    no_traceback(proc)


def test_no_git_is_an_environment_error_before_connecting(tmp_path, loopback_ssh):
    inventory = unreachable_inventory(tmp_path, loopback_ssh)
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "-i", str(inventory), "--results-repo",
                   str(tmp_path / "results"), env={"PATH": str(empty_path)})
    assert proc.returncode == exitcodes.ENVIRONMENT, proc.stderr
    assert "git not found" in proc.stderr
    no_traceback(proc)
    untouched(tmp_path / "results")


def _fake_git(directory: Path, body: str) -> Path:
    directory.mkdir()
    git = directory / "git"
    git.write_text(body)
    git.chmod(git.stat().st_mode | stat.S_IXUSR)
    return directory


def test_git_that_cannot_start_or_hangs_is_a_results_repo_error(tmp_path, monkeypatch):
    # A git whose interpreter is missing: starting it fails with an OSError.
    monkeypatch.setenv("PATH", str(_fake_git(tmp_path / "broken", "#!/nonexistent/interpreter\n")))
    with pytest.raises(results_repo.ResultsRepoError, match="could not run git"):
        results_repo.publish(tmp_path / "r1", run_id="x", tag="bench/x", files={"a": b"a"}, message="m")
    # A git that never answers: stopped at the timeout.
    monkeypatch.setenv("PATH", str(_fake_git(tmp_path / "slow", "#!/bin/sh\nexec /bin/sleep 30\n")))
    monkeypatch.setattr(results_repo, "GIT_TIMEOUT_S", 1)
    with pytest.raises(results_repo.ResultsRepoError, match="did not finish within 1 s"):
        results_repo.publish(tmp_path / "r2", run_id="x", tag="bench/x", files={"a": b"a"}, message="m")


# ------------------------------------------------------------------------ 2. the restart needs ansible
def test_a_likely_restart_without_the_playbook_is_a_warning_before_connecting(tmp_path, loopback_ssh):
    # The server may already run at --ctx (an earlier bench restarted it with -e): only a warning;
    # a restart that is really needed fails (BenchAbort, below) before the sweep starts.
    inventory = unreachable_inventory(tmp_path, loopback_ssh, dsv4_context_length=8192)
    missing = {"DSV4KIT_PLAYBOOK": str(tmp_path / "no-such-site.yml")}
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "-i", str(inventory), "--results-repo",
                   str(tmp_path / "results"), env=missing)
    assert proc.returncode == exitcodes.UNREACHABLE, proc.stderr
    assert "warning:" in proc.stderr and "no-such-site.yml' not found" in proc.stderr
    no_traceback(proc)
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "--no-restart", "-i", str(inventory), "--results-repo",
                   str(tmp_path / "results"), env=missing)
    assert proc.returncode == exitcodes.UNREACHABLE, proc.stderr
    assert "warning:" not in proc.stderr
    untouched(tmp_path / "results")


def test_the_restart_turns_a_missing_playbook_into_a_bench_abort(tmp_path, loopback_ssh, monkeypatch):
    from dsv4kit.bench.sweep import BenchAbort, default_restart
    from dsv4kit.core.inventory import load_inventory

    inventory = unreachable_inventory(tmp_path, loopback_ssh)
    monkeypatch.setenv("DSV4KIT_PLAYBOOK", str(tmp_path / "no-such-site.yml"))
    with pytest.raises(BenchAbort) as info:
        default_restart(inventory, load_inventory(inventory).host(), 8192, lambda line: None, 60.0)
    assert info.value.exit_code == exitcodes.ENVIRONMENT
    assert "cannot restart the serving units with context length 8192" in str(info.value)


# ------------------------------------------------------------------------ 3. the baseline, up front
def test_a_baseline_that_cannot_be_compared_fails_before_connecting(tmp_path, loopback_ssh):
    repo = tmp_path / "results"
    publish_record(repo, synthetic_record("lo-ctx8192-20260101T000000Z", BASE, context_length=8192))
    inventory = unreachable_inventory(tmp_path, loopback_ssh)
    before = subprocess.run(["git", "-C", str(repo), "rev-list", "--all"], capture_output=True, text=True).stdout
    # Default lengths follow --ctx (ISL = ctx - 1024): never comparable across context lengths.
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1,4", "--num-prompts", "8", "--baseline-ctx", "8192",
                   "-i", str(inventory), "--results-repo", str(repo))
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert "not comparable with this sweep, so nothing was run" in proc.stderr
    assert "input_len 16 there, 3072 here" in proc.stderr and "output_len 8 there, 512 here" in proc.stderr
    assert "--input-len and --output-len" in proc.stderr
    # --baseline (no --ctx difference allowed): the context length is named as well.
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1,16", *SMALL[:4], "--num-prompts", "16",
                   "--seed", "7", "--baseline", "lo-ctx8192-20260101T000000Z", "-i", str(inventory),
                   "--results-repo", str(repo))
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    for words in ("context_length 8192 there, 4096 here", "seed 42 there, 7 here", "concurrency [1, 4] there",
                  "num_prompts"):
        assert words in proc.stderr, words
    # Everything known beforehand matches: the run goes on (and meets the closed port).
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1,4", *SMALL, "--baseline-ctx", "8192",
                   "-i", str(inventory), "--results-repo", str(repo))
    assert proc.returncode == exitcodes.UNREACHABLE, proc.stderr
    after = subprocess.run(["git", "-C", str(repo), "rev-list", "--all"], capture_output=True, text=True).stdout
    assert before == after


def test_the_planned_record_has_the_key_the_record_gets():
    from types import SimpleNamespace

    from dsv4kit.bench.sweep import BOX_KEY_FIELDS, SweepConfig, client_section, planned_record
    from dsv4kit.records.provenance import sections

    values = {"dsv4_model_path": "/m/DeepSeek-V4-Flash/", "dsv4_model_revision": "r9", "dsv4_gpu_count": 8,
              "dsv4_decode_gpus": [4, 5], "dsv4_prefill_gpus": [0, 1]}
    host = SimpleNamespace(name="lo", get=values.get)
    cfg = SweepConfig(context_length=8192, concurrency=[16, 1], input_len=512, output_len=128, num_prompts=20)
    record = {**sections(host=host, probe={}, server_info={}, context_length=8192, restarted=False),
              "client": client_section(cfg, tool_version="0.5.23", base_url="http://x"),
              "sweep": {"concurrency": cfg.concurrency, "gates": cfg.gates.to_dict()}}
    full = comparability_key(json.loads(dumps(record)))
    planned = {k: v for k, v in comparability_key(planned_record(cfg, host)).items() if k not in BOX_KEY_FIELDS}
    assert set(planned) == set(full) - set(BOX_KEY_FIELDS)
    assert planned == {k: full[k] for k in planned}
    assert planned["model"] == "DeepSeek-V4-Flash" and planned["gpu_count"] == 4


# ------------------------------------------------------------------------ smaller checks
def test_missing_model_path_and_too_few_prompts_fail_before_connecting(tmp_path, loopback_ssh):
    inventory = unreachable_inventory(tmp_path, loopback_ssh, dsv4_model_path=None)
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "-i", str(inventory), "--results-repo", str(tmp_path / "r"))
    assert proc.returncode == exitcodes.USAGE and "has no dsv4_model_path" in proc.stderr, proc.stderr
    inventory = unreachable_inventory(tmp_path / "2", loopback_ssh)
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1,16,64", *SMALL, "-i", str(inventory),
                   "--results-repo", str(tmp_path / "r"))
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert "--num-prompts 8 is too few for --concurrency 16, 64" in proc.stderr and "at least 52" in proc.stderr
    # The gate's own threshold decides: at ratio 0.5, 8 prompts can load C=16.
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1,16", *SMALL, "--min-concurrency-ratio", "0.5",
                   "-i", str(inventory), "--results-repo", str(tmp_path / "r"))
    assert proc.returncode == exitcodes.UNREACHABLE, proc.stderr


def test_server_env_is_the_decode_process_environment():
    from types import SimpleNamespace

    from dsv4kit.records.provenance import sections

    host = SimpleNamespace(name="lo", get={"dsv4_decode_port": 30002, "dsv4_gpu_count": 8}.get)
    venv = "/opt/venv/bin/python"
    processes = [
        {"pid": 10, "argv": [venv, "-m", "sglang.launch_server", "--tp", "4", "--port", "30002"],
         "env": {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "SGLANG_X": "1"}},
        {"pid": 11, "argv": [venv, "-m", "sglang.launch_server", "--tp", "4", "--port", "30001"],
         "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SGLANG_X": "1"}},
        {"pid": 12, "argv": [venv, "-m", "sglang_router.launch_router", "--decode", "http://127.0.0.1:30002",
                             "--port", "30000"], "env": None, "env_reason": "cannot read /proc/12/environ"},
    ]
    out = sections(host=host, probe={"processes": processes}, server_info={}, context_length=4096, restarted=False)
    software, server = out["software"], out["server"]
    assert software["server_env"] == {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "SGLANG_X": "1"}
    assert "decode server (/proc/10/environ)" in software["server_env_source"]
    assert [p["env"] for p in server["processes"]] == [p["env"] for p in processes]
    assert server["processes"][2]["env_reason"] == "cannot read /proc/12/environ"
    # No decode process among them: no merged guess, the reason says so.
    out = sections(host=host, probe={"processes": processes[1:]}, server_info={}, context_length=4096,
                   restarted=False)
    assert out["software"]["server_env"] is None
    assert "none of the 2 serving process(es) is the decode server" in out["software"]["server_env_reason"]


# ------------------------------------------------------------------------ 5. the commit point
def _publish_interrupted_after_commit(monkeypatch):
    """Make the work-tree update (after the update-ref transaction) receive a real SIGINT."""
    real = results_repo._git

    def interrupted(repo_, *args, **kw):
        if args[:1] == ("read-tree",) and "-u" in args:
            os.kill(os.getpid(), signal.SIGINT)
        return real(repo_, *args, **kw)

    monkeypatch.setattr(results_repo, "_git", interrupted)


def test_ctrl_c_after_the_transaction_finishes_the_publish(tmp_path, monkeypatch):
    repo = tmp_path / "results"
    first = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    publish_record(repo, first)
    _publish_interrupted_after_commit(monkeypatch)
    rec = synthetic_record("lo-ctx4096-20260101T000500Z", BASE)
    published = results_repo.publish(repo, run_id=rec["run_id"], tag=rec["tag"],
                                     files={f"records/{rec['run_id']}/record.json": dumps(rec).encode()}, message="x")
    assert published.interrupted and published.worktree_warning is None
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True).stdout.strip()
    assert git("rev-parse", "HEAD") == published.commit
    assert git("rev-parse", f"{rec['tag']}^{{commit}}") == published.commit
    assert git("status", "--porcelain", "--untracked-files=all") == ""  # the work tree followed
    assert (repo / "records" / rec["run_id"] / "record.json").is_file()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def _fake_sweep(monkeypatch, record: dict) -> None:
    """Replace only the sweep itself (the box side is covered by test_bench_sweep.py) by a finished one."""
    from dsv4kit.bench import sweep as bench
    from dsv4kit.bench.sweep import SweepResult

    monkeypatch.setattr(bench, "run_sweep", lambda cfg, **kw: SweepResult(record=record, details={}))


def test_bench_reports_a_ctrl_c_after_the_commit_as_published(tmp_path, loopback_ssh, monkeypatch):

    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_model_path="/models/DeepSeek-V4-Flash")
    repo = tmp_path / "results"
    rec = synthetic_record("lo-ctx8192-20260101T000500Z", BASE, context_length=8192, isl=16, osl=8)
    _fake_sweep(monkeypatch, rec)
    _publish_interrupted_after_commit(monkeypatch)
    result = invoke(["bench", "--ctx", "8192", *C, *SMALL,
                     "-i", str(inventory), "--results-repo", str(repo)])
    assert result.exit_code == exitcodes.INTERRUPTED, result.output
    assert "interrupted after the record was committed: it is published and complete" in result.stderr
    assert f"recorded {rec['run_id']}" in result.stderr and "nothing was recorded" not in result.stderr
    assert results_repo.read_record(repo, rec["tag"])["run_id"] == rec["run_id"]


def test_a_baseline_found_different_on_the_box_does_not_mask_invalid_points(tmp_path, loopback_ssh, monkeypatch):

    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_model_path="/models/DeepSeek-V4-Flash",
                                dsv4_model_revision="r1")
    repo = tmp_path / "results"
    publish_record(repo, synthetic_record("lo-ctx8192-20260101T000000Z", BASE, context_length=8192))
    # The new sweep ran on other GPUs (only the box could tell) and has an invalid point.
    rec = synthetic_record("lo-ctx8192-20260101T000500Z", BASE, context_length=8192, gpu_model="NVIDIA H200",
                           invalid=((4, 1),))
    rec["comparability_key"] = comparability_key(rec)
    _fake_sweep(monkeypatch, rec)
    result = invoke(["bench", "--ctx", "8192", *C, *SMALL, "--baseline-ctx",
                     "8192", "-i", str(inventory), "--results-repo", str(repo), "--json"])
    assert result.exit_code == exitcodes.CHECK_FAILED, result.output
    out = json.loads(result.stdout)
    assert out["exit_code"] == 1 and out["validity_passed"] is False
    assert out["comparison"]["comparable"] is False
    assert out["comparison"]["differences"] == [{"field": "gpu_model", "old": "NVIDIA RTX PRO 6000 Blackwell",
                                                 "new": "NVIDIA H200"}]


# ------------------------------------------------------------------------ 5. --ab, up front
def test_ab_input_is_checked_before_connecting(tmp_path, loopback_ssh):
    inventory = unreachable_inventory(tmp_path, loopback_ssh)
    results = ["-i", str(inventory), "--results-repo", str(tmp_path / "results")]
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "--ab", "SGLANG_X=1", *results)
    assert proc.returncode == exitcodes.USAGE and "exactly two comma-separated values" in proc.stderr
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "--ab", "SGLANG_X=0,1", "--baseline", "x", *results)
    assert proc.returncode == exitcodes.USAGE and "takes no --baseline" in proc.stderr
    # every arm restarts the units through the playbook: without it, exit 5 before connecting
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "--ab", "SGLANG_X=0,1", *results,
                   env={"DSV4KIT_PLAYBOOK": str(tmp_path / "no-such-site.yml")})
    assert proc.returncode == exitcodes.ENVIRONMENT and "--ab restarts the serving units" in proc.stderr
    no_traceback(proc)
    untouched(tmp_path / "results")


def test_an_invalid_record_is_refused_as_a_baseline(tmp_path, loopback_ssh):
    repo = tmp_path / "results"
    bad = synthetic_record("lo-ctx4096-20260101T000000Z", BASE, invalid=((1, 0),))
    publish_record(repo, bad)
    inventory = unreachable_inventory(tmp_path, loopback_ssh)
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "--baseline", bad["run_id"], "-i", str(inventory),
                   "--results-repo", str(repo))
    assert proc.returncode == exitcodes.USAGE and "only valid records serve as baselines" in proc.stderr
    proc = dsv4kit("bench", "--ctx", "4096", *C, *SMALL, "--baseline-ctx", "4096", "-i", str(inventory),
                   "--results-repo", str(repo))
    assert proc.returncode == exitcodes.USAGE and "no valid record" in proc.stderr
