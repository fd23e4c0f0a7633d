"""``--dry-run`` of the commands that restart the serving units (bench, eval --ab, profile): the plan
is printed, in order, and the box is never contacted. The inventory names the real loopback sshd,
so a run that connected would show in its log; the same bench without --dry-run does."""

from __future__ import annotations

import json

import pytest

from dsv4kit.core import exitcodes
from tests.bench_support import bench_inventory
from tests.cli_support import cli


@pytest.fixture
def box(tmp_path, loopback_ssh):
    from tests.remote_inventory import box_venv

    model = tmp_path / "model"
    model.mkdir()
    inventory = bench_inventory(tmp_path / "inv", loopback_ssh, venv=box_venv(tmp_path / "venv"), model_path=model,
                                port=30000, context_length=8192)
    return inventory, tmp_path / "repo", loopback_ssh


def _sessions(sshd) -> int:
    return sshd.log.read_text().count("Accepted publickey")


def test_bench_dry_run_prints_the_arms_in_order_and_touches_nothing(box):
    inventory, repo, sshd = box
    before = _sessions(sshd)
    args = ["bench", "--ctx", "4096", "-c", "1", "--input-len", "16", "--output-len", "8", "--repeat", "2",
            "--ab", "SGLANG_SM120_TRITON_INDEXER=0,1", "-i", inventory, "--results-repo", repo]
    code, out, err = cli(*args, "--dry-run")
    assert code == exitcodes.OK, out + err
    lines = out.splitlines()
    assert "the box was not contacted" in lines[0] and "box: lo (127.0.0.1:" in lines[1]
    assert "dsv4-decode.service" in lines[2]
    steps = [line.strip() for line in lines[3:]]
    assert steps[0].startswith("1. before measuring at context length 4096, only if the decode server runs another")
    assert [s.split(":")[0] for s in steps[1:]] == ["2. repetition 1/2, arm A", "3. repetition 1/2, arm B",
                                                   "4. repetition 2/2, arm A", "5. repetition 2/2, arm B"]
    assert "--tags kernel_rollout,sglang_service: dsv4_kernel_flags.SGLANG_SM120_TRITON_INDEXER=0" in steps[1]
    code, out, _ = cli(*args, "--dry-run", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["ok"] and plan["dry_run"] and len(plan["steps"]) == 5
    assert _sessions(sshd) == before and not repo.exists()  # no SSH session, no record
    # The detector can fail: the same run without --dry-run connects (and stops: no server there).
    code, _, err = cli(*args)
    assert code != exitcodes.OK and _sessions(sshd) > before, err


def test_eval_and_profile_dry_runs(box):
    inventory, repo, sshd = box
    before = _sessions(sshd)
    code, out, err = cli("eval", "--ab", "dsv4_fp4_indexer=false,true", "--tasks", "none", "-i", inventory,
                         "--results-repo", repo, "--dry-run")
    assert code == exitcodes.OK, out + err
    assert "1. repetition 1/1, arm A: ansible-playbook --limit lo --tags sglang_service: dsv4_fp4_indexer=False" in out
    assert "2. repetition 1/1, arm B" in out and "dsv4_fp4_indexer=True" in out
    code, out, err = cli("profile", "--ctx", "4096", "--compare-ctx", "8192", "--input-len", "16", "-i", inventory,
                         "--dry-run")
    assert code == exitcodes.OK, out + err
    assert "1. before measuring at context length 4096" in out and "2. before measuring at context length 8192" in out
    code, out, err = cli("bench", "--ctx", "4096", "-c", "1", "--input-len", "16", "--output-len", "8", "--repeat", "3",
                         "--restarts", "2", "--no-restart", "-i", inventory, "--results-repo", repo, "--dry-run")
    assert code == exitcodes.OK, out + err
    assert [line.strip()[:45] for line in out.splitlines()[3:]] == [
        "1. before repetition 2/3 (--restarts 2): syst", "2. before repetition 3/3 (--restarts 2): syst"]
    code, out, _ = cli("profile", "--ctx", "4096", "-i", inventory, "--no-restart", "--dry-run")
    assert code == 0 and "no restart" in out
    assert _sessions(sshd) == before
