"""`auto` kernel flags against the loopback box: real SSH, the real validate path, real Ansible.

* `validate --gpu N --interpret` over SSH keeps a report whose verdict is skipped (no GPU timings):
  `rollout plan` refuses it, without connecting.
* A usable report makes `rollout plan` read the host's GPU and driver over SSH: this machine has
  no NVIDIA driver, so it stops with exit 5 naming what it could not read.
* `dsv4kit provision --tags kernel_rollout` with 'auto' flags (the host's facts given, as this box
  has no GPU): the flags file and the decision file follow the latest report, and
  `dsv4kit rollout status` shows which report decided each flag and its numbers.
* The playbook run without `dsv4kit provision` stops at an unresolved 'auto'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4kit.core import exitcodes

from dsv4kit.rollout import plan as kernel_plan

from dsv4kit.core import wheelbuild
from dsv4kit.provision.playbook import run_playbook
from tests.provision_inventory import write_loopback_inventory
from tests.remote_inventory import write_inventory
from tests.rollout.test_kernel_plan import ATTENTION, HOST_FACTS, INDEXER, keep, validated_report
from tests.cli_support import cli

AUTO = {INDEXER: "auto", ATTENTION: "auto"}


def box_python(venv: Path) -> None:
    """The box venv's python runs this interpreter as itself (a symlink out of a venv would lose
    the venv's packages)."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "bin/python").chmod(0o755)


def test_a_remote_interpreter_run_keeps_a_skipped_verdict_that_plan_skips(tmp_path, loopback_ssh):
    box_python(tmp_path / "inv/venv")
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_kernel_flags=AUTO, dsv4_prefill_gpus=[0, 1, 2, 3, 4, 5],
                                dsv4_decode_gpus=[6, 7])
    results = tmp_path / "results"
    wheel = wheelbuild.build_wheel(tmp_path / "wheel").path
    code, out, err = cli("validate", "--gpu", "3", "-i", str(inventory), "--interpret", "--cases",
                         "indexer:1x2x100x16", "--wheel", str(wheel), "--results-dir", str(results))
    assert code == exitcodes.OK, out + err
    assert "kernel verdict: not measured (no GPU" in out
    kept = kernel_plan.latest_report(results, "lo")
    report = json.loads(kept.read_text())
    assert report["verdict"]["status"] == "skipped"
    # the host's: its context, and the heads of its decode server (TP 2: 32 a GPU) under SGLang's default backend
    assert report["verdict"]["shapes"] == {"context_length": 8192, "concurrency": [1, 16, 64], "decode_tp": 2,
                                           "attention_backend": "flashinfer"}
    code, out, err = cli("rollout", "plan", "-i", str(inventory), "--results-dir", str(results))
    assert code == exitcodes.OK and f"skipping report {kept.name}: it ran on Triton's CPU interpreter" in err


def test_plan_reads_the_hosts_gpu_over_ssh_and_names_what_is_missing(tmp_path, loopback_ssh, monkeypatch):
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_kernel_flags=AUTO)
    results = tmp_path / "results"
    keep(results, validated_report(tmp_path, monkeypatch), host="lo")
    code, out, err = cli("rollout", "plan", "-i", str(inventory), "--results-dir", str(results))
    assert code == exitcodes.ENVIRONMENT, out + err
    assert "cannot tell lo's GPU model and driver (nvidia-smi not found)" in err


@pytest.fixture
def box(loopback_ssh, tmp_path, monkeypatch):
    """A loopback box with a venv (as sglang_venv leaves it) and 'auto' kernel flags."""
    if os.geteuid() != 0:
        pytest.skip("the loopback box is provisioned as root (file ownership)")
    prefix = tmp_path / "prefix"
    inventory = write_loopback_inventory(tmp_path / "inv", loopback_ssh, prefix,
                                         overrides={"dsv4_kernel_flags": AUTO})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path / "ansible-tmp"))
    # The venv of these pins, where the real sglang_venv stage puts it (a versioned venv).
    code, out, err = cli("provision", "-i", str(inventory), "--tags", "sglang_venv")
    assert code == exitcodes.OK, (out + err)[-4000:]
    return inventory, prefix


def test_provision_takes_auto_flags_from_the_latest_report_and_status_shows_it(box, tmp_path, monkeypatch):
    inventory, prefix = box
    results = tmp_path / "results"
    keep(results, validated_report(tmp_path, monkeypatch, driver="575.57.08"), host="loop", when="20261130T000000Z")
    latest = keep(results, validated_report(tmp_path, monkeypatch), host="loop", when="20261201T000000Z")
    monkeypatch.setattr(kernel_plan, "probe_host", lambda host: HOST_FACTS)  # this box has no GPU to read
    # The answers too: a passing `eval --ab ATTENTION=0,1` of this box (docs/quality.md).
    from dsv4kit.core.inventory import load_inventory
    from tests.quality_support import keep_quality, quality_record

    monkeypatch.setenv("DSV4KIT_RESULTS_REPO", str(tmp_path / "results-repo"))
    host = load_inventory(inventory).host("loop")
    keep_quality(tmp_path / "results-repo", quality_record(host, ATTENTION, gpu=HOST_FACTS.gpus[7],
                                                           driver=HOST_FACTS.driver))
    code, out, err = cli("provision", "-i", str(inventory), "--tags", "kernel_rollout", "--results-dir",
                         str(results), "--json")
    assert code == exitcodes.OK, (out + err)[-6000:]
    assert f"from report {latest}" in err
    etc = prefix / "etc/dsv4kit"
    flags = (etc / "kernel-flags.env").read_text()
    assert f"{INDEXER}=0" in flags and f"{ATTENTION}=1" in flags and "auto" not in flags
    decision = json.loads((etc / "kernel-decision.json").read_text())
    assert decision["report"]["name"] == latest.name
    assert decision["flags"][ATTENTION]["source"] == "report + quality record" and decision["flags"][ATTENTION]["numbers"]
    assert "quality record loop-eval-ctx" in decision["flags"][ATTENTION]["why"]

    env = {INDEXER: "0", ATTENTION: "1"}  # the server's environment, from the flags file
    # The venv of these pins (dsv4_venv_dir links to it once sglang_service switched; not run here).
    (python,) = (prefix / "opt/dsv4").glob("venv-*/bin/python")
    code, out, err = cli("rollout", "status", "--python", str(python), "--decision",
                         str(etc / "kernel-decision.json"), env=env)
    assert code == exitcodes.ENVIRONMENT  # this venv has no SGLang; the decision is shown all the same
    assert f"decided by report {latest.name} (loop GPU 7" in out
    assert "c4 T=64 ctx=8192 H=16: dsv4kit 20.0 us, flashinfer-sm120 30.0 us: faster" in out
    assert "B=64 ctx=8192 L=2048: dsv4kit 19.5 us, sglang-tilelang 3.8 us: slower" in out
    code, out, _ = cli("rollout", "status", "--python", str(python), "--decision",
                       str(etc / "kernel-decision.json"), "--json", env={INDEXER: "1", ATTENTION: "1"})
    report = json.loads(out)
    assert report["decision"]["flags"][INDEXER]["value"] == "0"
    assert any(f"{INDEXER} is '1' here but was decided '0'" in w for w in report["decision"]["warnings"])


def test_the_playbook_alone_stops_at_an_unresolved_auto(box):
    inventory, prefix = box
    lines: list = []
    summary = run_playbook(inventory, tags=["kernel_rollout"], progress=lines.append)
    assert summary.exit_code == exitcodes.TOOL_FAILED
    assert [f.task for f in summary.failures] == ["kernel_rollout : Check no kernel flag is left 'auto'"]
    assert "resolved by `dsv4kit provision`" in "\n".join(lines)
    assert not (prefix / "etc/dsv4kit/kernel-flags.env").exists()
