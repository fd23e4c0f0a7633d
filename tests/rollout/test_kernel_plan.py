"""`auto` kernel flags end to end on a CPU, with stand-in timings: `validate` writes the verdict,
`eval` the quality record, `rollout plan` / `provision` resolve them for the host. Evidence that does
not hold keeps a flag stock and says why; only input that is not evidence is exit 2.

The verdict's measurements are stood in (tests/verdict_standins.py); the validation table, the
report files, the inventory, the CLI and the plan are the real ones. The host's GPU, driver and
SGLang (read over SSH in production) are given to the plan; tests/rollout/test_kernel_plan_box.py reads
them over the loopback sshd and runs the real playbook.
"""

from __future__ import annotations

import copy
import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from dsv4kit.core import exitcodes
from dsv4kit.records.quality_evidence import REQUIRED_CHECKS

from dsv4kit.rollout import plan as kernel_plan
from dsv4kit.validate.remote import report_filename
from dsv4kit.validation import harness, verdict_run
from tests import verdict_standins as standins
from dsv4kit.records import quality_evidence
from tests.quality_support import keep_quality, quality_record
from tests.cli_support import cli

INDEXER, ATTENTION = "SGLANG_SM120_TRITON_INDEXER", "SGLANG_SM120_MMA_ATTENTION"
CASES = "indexer:1x2x100x16,attention:c4-T1-H16-ps64-x64-L300"
HOST_FACTS = kernel_plan.HostFacts(gpus={i: standins.GPU for i in range(8)}, driver=standins.DRIVER,
                                   sglang=standins.SGLANG)


def write_inventory(directory: Path, flags: dict | None = None, **host_vars) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    # Reached only through the stood-in probe: no SSH, so no known_hosts to check either.
    host = {"ansible_host": "192.0.2.10", "ansible_connection": "local", "dsv4_venv_dir": "/opt/dsv4/venv",
            "dsv4_context_length": 8192,
            "dsv4_decode_port": 30002, "dsv4_gpu_count": 8, "dsv4_sglang_version": standins.SGLANG,
            "dsv4_kernel_flags": flags or {INDEXER: "auto", ATTENTION: "auto"}, **host_vars}
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"dsv4_boxes": {"hosts": {"box1": host}}}}}))
    return path


_REPORT_CACHE: dict = {}


def validated_report(tmp_path: Path, monkeypatch, *, table=None, cases=CASES, **identity) -> dict:
    """A `dsv4kit validate` report: the real table on the interpreter, the verdict stood in.

    The same arguments give the same report, so it is made once per session (a deep copy each time)."""
    key = (repr(table), cases, tuple(sorted(identity.items())))
    if key not in _REPORT_CACHE:
        _REPORT_CACHE[key] = _validate(tmp_path, monkeypatch, table, cases, identity)
    return copy.deepcopy(_REPORT_CACHE[key])


def _validate(tmp_path, monkeypatch, table, cases, identity) -> dict:
    monkeypatch.setattr(verdict_run, "run", standins.stand_in_run(table, **identity))
    out = tmp_path / f"report-{len(list(tmp_path.glob('report-*.json')))}.json"
    code = harness.run_cli(cases, str(out), True, emit=lambda s: None,
                           verdict=harness.VerdictRequest(8192, (1, 16, 64)))
    assert code == exitcodes.OK
    return json.loads(out.read_text())


def keep(results: Path, report: dict, host: str = "box1", gpu: int = 7, when: str = "20261201T120000Z") -> Path:
    """Keep it the way `validate --host` does: <results>/<host>-gpu<N>-<stamp>.json with a remote section."""
    stamp = datetime.strptime(when, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    report = {**report, "remote": {"host": host, "gpu": gpu, "started_utc": stamp.strftime("%Y-%m-%dT%H:%M:%SZ")},
              # as the box's GPU run says it (the stand-in table ran on this CPU's interpreter)
              "environment": {**report.get("environment", {}), "interpret": False, "device": "cuda"}}
    results.mkdir(parents=True, exist_ok=True)
    path = results / report_filename(host, gpu, stamp)
    path.write_text(json.dumps(report))
    return path


@pytest.fixture
def facts(monkeypatch):
    """The host's GPU, driver and SGLang as the SSH probe would read them (changeable per test)."""
    current = {"facts": HOST_FACTS, "calls": 0}

    def probe(host):
        current["calls"] += 1
        return current["facts"]

    monkeypatch.setattr(kernel_plan, "probe_host", probe)
    return current


@pytest.fixture
def quality_repo(tmp_path, monkeypatch):
    """``keep(flag, **record_kw)``: a passing (by default) eval record of box1 in the results
    repository that `rollout plan` and `provision` read ($DSV4KIT_RESULTS_REPO)."""
    repo = tmp_path / "results-repo"
    monkeypatch.setenv("DSV4KIT_RESULTS_REPO", str(repo))

    def keep_record(flag: str, inventory: Path | None = None, **kw):
        from dsv4kit.core.inventory import load_inventory

        host = load_inventory(inventory or write_inventory(tmp_path / "inv")).host("box1")
        keep_quality(repo, quality_record(host, flag, **{"gpu": standins.GPU, "driver": standins.DRIVER, **kw}))

    return keep_record


# --------------------------------------------------------------------------- the working path
def test_validate_verdict_to_plan_to_provision_extra_vars(tmp_path, monkeypatch, facts, quality_repo):
    report = validated_report(tmp_path, monkeypatch)
    assert report["passed"] and report["verdict"]["status"] == "complete"
    assert report["verdict"]["identity"]["driver"] == standins.DRIVER
    assert report["verdict"]["shapes"] == {"context_length": 8192, "concurrency": [1, 16, 64], "decode_tp": 4,
                                           "attention_backend": "flashinfer"}
    results = tmp_path / "results"
    path = keep(results, report)
    inventory = write_inventory(tmp_path / "inv")

    # The numbers alone are not enough: without a quality record the flag stays stock, saying so.
    code, out, err = cli("rollout", "plan", "-i", str(inventory), "--results-dir", str(results), "--json")
    assert code == exitcodes.OK, err
    attention = json.loads(out)["decisions"][ATTENTION]
    assert attention["value"] == "0" and "no quality record" in attention["why"]
    assert f"dsv4kit eval --ab {ATTENTION}=0,1" in attention["why"]
    quality_repo(ATTENTION)
    code, out, err = cli("rollout", "plan", "-i", str(inventory), "--results-dir", str(results), "--json")
    assert code == exitcodes.OK, err
    plan = json.loads(out)
    assert plan["ok"] and plan["flags"] == {INDEXER: "0", ATTENTION: "1"}
    assert plan["decisions"][ATTENTION]["source"] == "report + quality record"
    assert plan["report"]["name"] == path.name and plan["report"]["gpu_index"] == 7
    indexer = plan["decisions"][INDEXER]
    assert indexer["source"] == "report" and indexer["stock_default"] == "sglang-tilelang"
    short = next(n for n in indexer["numbers"] if n["shape"] == "B=64 ctx=8192 L=2048")
    assert short["outcome"] == "slower" and short["ours_us"] == pytest.approx(19.5) and short["stock_us"] == pytest.approx(3.8)

    code, text, _ = cli("rollout", "plan", "-i", str(inventory), "--results-dir", str(results))
    assert code == exitcodes.OK
    assert f"from report {path}" in text and f"{INDEXER}=0  [report]" in text and f"{ATTENTION}=1  [report + quality record]" in text

    lines = []
    extra = kernel_plan.resolve_for_provision(inventory, results_dir=results, say=lines.append,
                                              quality=quality_evidence.finder())
    assert extra["kernel_rollout_plan"]["box1"]["flags"] == {INDEXER: "0", ATTENTION: "1"}
    decision = extra["kernel_rollout_plan"]["box1"]["decision"]
    assert decision["report"]["name"] == path.name and decision["flags"][ATTENTION]["numbers"]
    assert any("from report" in line for line in lines)
    json.dumps(extra)  # goes to ansible-playbook --extra-vars


def test_the_latest_report_decides(tmp_path, monkeypatch, facts, quality_repo):
    results = tmp_path / "results"
    slow_attention = standins.issue_table()
    slow_attention["attention"][0] = standins.StandIn("attention", "dsv4kit", False, {"*": 45.0})
    keep(results, validated_report(tmp_path, monkeypatch), when="20261201T090000Z")
    newest = keep(results, validated_report(tmp_path, monkeypatch, table=slow_attention), when="20261201T100000Z")
    os.utime(newest, (0, 0))  # an old mtime (a copy): the stamp in the name decides, not mtime
    keep(results, validated_report(tmp_path, monkeypatch), host="box10", when="20261202T000000Z")  # another host
    assert kernel_plan.latest_report(results, "box1") == newest
    plan = kernel_plan.plan_host(kernel_plan_host(tmp_path), results_dir=results)
    assert plan["flags"][ATTENTION] == "0" and plan["report"]["name"] == newest.name
    # A second report in the same second is "-2", newer than the first.
    again = results / newest.name.replace(".json", "-2.json")
    again.write_text(newest.read_text())
    assert kernel_plan.latest_report(results, "box1") == again


def kernel_plan_host(tmp_path, **host_vars):
    from dsv4kit.core.inventory import load_inventory

    return load_inventory(write_inventory(tmp_path / "inv-plan", **host_vars)).host("box1")


def test_no_report_keeps_auto_flags_stock_without_touching_the_host(tmp_path, facts):
    plan = kernel_plan.plan_host(kernel_plan_host(tmp_path), results_dir=tmp_path / "empty")
    assert plan["flags"] == {INDEXER: "0", ATTENTION: "0"} and plan["report"] is None
    assert "no full validation report for box1" in plan["decisions"][INDEXER]["why"]
    assert facts["calls"] == 0  # nothing to match: no SSH


def test_flags_set_by_hand_are_kept_and_need_no_report(tmp_path, facts):
    assert kernel_plan.resolve_for_provision(write_inventory(tmp_path / "inv", {INDEXER: "1", ATTENTION: "0"}),
                                             results_dir=tmp_path) is None
    plan = kernel_plan.plan_host(kernel_plan_host(tmp_path, dsv4_kernel_flags={INDEXER: "1", ATTENTION: "auto"}),
                                 results_dir=tmp_path / "none")
    assert plan["decisions"][INDEXER] == {"value": "1", "source": "inventory", "why": "set in dsv4_kernel_flags"}


def test_from_report_decides_every_flag_even_those_set_by_hand(tmp_path, monkeypatch, facts, quality_repo):
    quality_repo(ATTENTION)
    path = keep(tmp_path / "r", validated_report(tmp_path, monkeypatch))
    inventory = write_inventory(tmp_path / "inv", {INDEXER: "1", ATTENTION: "0"})
    code, out, err = cli("rollout", "plan", "-i", str(inventory), "--from-report", str(path), "--json")
    assert code == exitcodes.OK, err
    assert json.loads(out)["flags"] == {INDEXER: "0", ATTENTION: "1"}


# --------------------------------------------------------------------------- evidence that does not hold: stock
def stock(tmp_path, path: Path) -> str:
    """`rollout plan --from-report PATH`: exit 0, every flag stock, and the reason (returned)."""
    inventory = write_inventory(tmp_path / "inv-stock")
    code, out, err = cli("rollout", "plan", "-i", str(inventory), "--from-report", str(path), "--json")
    assert code == exitcodes.OK, out + err
    summary = json.loads(out)
    assert summary["flags"] == {INDEXER: "0", ATTENTION: "0"}
    assert summary["decisions"][INDEXER]["why"] == summary["decisions"][ATTENTION]["why"]
    return summary["decisions"][INDEXER]["why"]


def refused(tmp_path, path: Path) -> str:
    """Input that is not evidence at all: exit 2 naming why, in the --json summary too."""
    inventory = write_inventory(tmp_path / "inv-refused")
    code, out, err = cli("rollout", "plan", "-i", str(inventory), "--from-report", str(path), "--json")
    assert code == exitcodes.USAGE, out + err
    assert "Traceback" not in err
    summary = json.loads(out)
    assert summary["ok"] is False and summary["exit_code"] == exitcodes.USAGE and summary["error"] in err
    return err


@pytest.mark.parametrize("identity, expect", [
    ({"gpu": "NVIDIA H200"}, "measured on GPU 'NVIDIA H200', box1 has 'NVIDIA RTX PRO 6000"),
    ({"driver": "575.57.08"}, "measured on driver '575.57.08', box1 has '580.95.05'"),
    ({"sglang": "0.5.22"}, "measured with SGLang '0.5.22', box1 has '0.5.23' installed"),
    ({"kernels_sha256": "0" * 64}, "it measured other dsv4kit kernels (sources sha256 000000000000)"),
])
def test_a_report_from_another_gpu_driver_sglang_or_kernels_keeps_the_flags_stock(tmp_path, monkeypatch, facts,
                                                                                 identity, expect):
    path = keep(tmp_path / "r", validated_report(tmp_path, monkeypatch, **identity))
    why = stock(tmp_path, path)
    assert expect in why and f"report {path} is not evidence" in why and "dsv4kit validate --host box1" in why


def test_a_box_with_mixed_gpu_models_is_checked_on_every_serving_gpu(tmp_path, monkeypatch, facts):
    path = keep(tmp_path / "r", validated_report(tmp_path, monkeypatch))
    facts["facts"] = kernel_plan.HostFacts(gpus={**HOST_FACTS.gpus, 2: "NVIDIA RTX PRO 6000 Blackwell Max-Q"},
                                           driver=standins.DRIVER, sglang=standins.SGLANG)
    why = stock(tmp_path, path)
    assert "servers also run on ['NVIDIA RTX PRO 6000 Blackwell Max-Q']" in why


def test_a_host_whose_installed_sglang_or_pin_moved_keeps_the_flags_stock(tmp_path, monkeypatch, facts):
    path = keep(tmp_path / "r", validated_report(tmp_path, monkeypatch))
    facts["facts"] = kernel_plan.HostFacts(gpus=HOST_FACTS.gpus, driver="580.105.08", sglang=None)
    why = stock(tmp_path, path)
    assert "box1 has '580.105.08'" in why and "box1 has 'no SGLang' installed" in why
    facts["facts"] = HOST_FACTS
    host = kernel_plan_host(tmp_path, dsv4_sglang_version="0.5.24")
    plan = kernel_plan.plan_host(host, from_report=path)
    assert "the inventory pins dsv4_sglang_version '0.5.24'" in plan["decisions"][INDEXER]["why"]


def test_a_failed_kernel_is_evidence_stock_with_the_reason_not_exit_2(tmp_path, monkeypatch, facts):
    report = validated_report(tmp_path, monkeypatch)
    report["passed"] = False
    assert "its validation table failed" in stock(tmp_path, keep(tmp_path / "r", report))
    # A verdict that says "on" without its correctness field is not trusted.
    report = validated_report(tmp_path, monkeypatch)
    for c in report["verdict"]["targets"]["attention"]["comparisons"]:
        c.pop("ours_correct", None)
    plan = kernel_plan.plan_host(kernel_plan_host(tmp_path), from_report=keep(tmp_path / "r2", report),
                                 quality=lambda host, flag, facts, served_with=None: {"ok": True, "why": "stand-in", "record": "x"})
    assert plan["flags"][ATTENTION] == "0" and "not shown correct" in plan["decisions"][ATTENTION]["why"]


def test_partial_reports_are_kept_but_skipped_with_a_note(tmp_path, monkeypatch, facts, quality_repo):
    results = tmp_path / "results"
    full = keep(results, validated_report(tmp_path, monkeypatch), when="20261201T090000Z")
    interpreted = validated_report(tmp_path, monkeypatch)
    keep(results, interpreted, when="20261201T100000Z")
    newer = results / "box1-gpu7-20261201T100000Z.json"
    data = json.loads(newer.read_text())
    data["remote"]["interpret"] = True
    newer.write_text(json.dumps(data))
    cases = keep(results, validated_report(tmp_path, monkeypatch), when="20261201T110000Z")
    data = json.loads(cases.read_text())
    data["remote"]["cases"] = "indexer:1x2x100x16"
    cases.write_text(json.dumps(data))
    no_verdict = validated_report(tmp_path, monkeypatch)
    del no_verdict["verdict"]
    keep(results, no_verdict, when="20261201T120000Z")
    (results / "box1-gpu7-20261201T130000Z.json").write_bytes(b"\xff\xfe not utf-8")
    quality_repo(ATTENTION)
    lines: list[str] = []
    plan = kernel_plan.plan_host(kernel_plan_host(tmp_path), results_dir=results, say=lines.append,
                                 quality=quality_evidence.finder())
    assert plan["report"]["name"] == full.name and plan["flags"][ATTENTION] == "1"
    notes = "\n".join(lines)
    assert "interpreter" in notes and "--cases" in notes and "no kernel verdict" in notes and "not UTF-8" in notes
    assert len(plan["skipped_reports"]) == 4


def test_a_non_utf8_report_is_bad_input_without_a_traceback(tmp_path, facts):
    path = tmp_path / "box1-gpu7-20261201T120000Z.json"
    path.write_bytes(b"\xff\xfe{}")
    assert "not UTF-8" in refused(tmp_path, path)


@pytest.mark.parametrize("change, expect", [
    ({"outcome": "fail"}, "did not pass (logprob_kl fail"),
    ({"checks": tuple(c for c in REQUIRED_CHECKS if c != "tasks")}, "ran no tasks check"),
    ({"checks": tuple(c for c in REQUIRED_CHECKS if c != "api")}, "ran no api check"),
    ({"checks": tuple(c for c in REQUIRED_CHECKS if c != "logprob_kl_long")}, "ran no logprob_kl_long check"),
    ({"ctx": 4096}, "needles reached 4096 tokens, not the served 8192"),
    ({"driver": "575.57.08"}, "measured on driver '575.57.08'"),
    ({"gpu": "NVIDIA H200"}, "measured on GPU 'NVIDIA H200'"),
    ({"kernels_sha256": "0" * 64}, "other dsv4kit kernels"),
    ({"served": {"dsv4_max_running_requests": 32}}, "serving configuration changed since (dsv4_max_running_requests)"),
])
def test_a_quality_record_that_does_not_hold_keeps_the_flag_stock(tmp_path, monkeypatch, facts, quality_repo,
                                                                 change, expect):
    path = keep(tmp_path / "r", validated_report(tmp_path, monkeypatch))
    change = dict(change)
    inventory = write_inventory(tmp_path / "inv-q", **(change.pop("served", {})))
    quality_repo(ATTENTION, inventory=inventory, **change)
    code, out, err = cli("rollout", "plan", "-i", str(write_inventory(tmp_path / "inv-now")), "--from-report",
                         str(path), "--json")
    assert code == exitcodes.OK, err
    decision = json.loads(out)["decisions"][ATTENTION]
    assert decision["value"] == "0" and decision["source"] == "quality record missing"
    assert expect in decision["why"], decision["why"]


def test_a_report_without_a_verdict_keeps_the_flags_stock(tmp_path, monkeypatch, facts):
    report = validated_report(tmp_path, monkeypatch)
    del report["verdict"]
    assert "it has no kernel verdict" in stock(tmp_path, keep(tmp_path / "r", report))


def test_a_skipped_or_incomplete_verdict_keeps_the_flags_stock(tmp_path, monkeypatch, facts):
    out = tmp_path / "cpu.json"  # the real interpreter run, no stand-ins: nothing measured
    assert harness.run_cli("indexer:1x2x100x16", str(out), True, emit=lambda s: None,
                           verdict=harness.VerdictRequest(8192, (1,))) == exitcodes.OK
    why = stock(tmp_path, keep(tmp_path / "r", json.loads(out.read_text())))
    assert "its kernel verdict is skipped: no GPU" in why

    def broken(target, device):
        raise ImportError("No module named 'dsv4kit.validation.implementations'")

    monkeypatch.setattr(verdict_run, "run", standins.functools.partial(
        verdict_run.run, provider=broken, builders=standins.BUILDERS, timer=standins.timer,
        identity_fn=standins.identity))
    assert harness.run_cli("indexer:1x2x100x16", str(out), True, emit=lambda s: None,
                           verdict=harness.VerdictRequest(8192, (1,))) == exitcodes.OK
    why = stock(tmp_path, keep(tmp_path / "r2", json.loads(out.read_text())))
    assert "its kernel verdict is incomplete: indexer: the implementations could not be loaded" in why


def test_a_verdict_without_a_target_an_auto_flag_needs_keeps_the_flags_stock(tmp_path, monkeypatch, facts):
    report = validated_report(tmp_path, monkeypatch, cases="indexer:1x2x100x16")
    assert list(report["verdict"]["targets"]) == ["indexer"]
    assert "its verdict has no attention target" in stock(tmp_path, keep(tmp_path / "r", report))


@pytest.mark.parametrize("content, expect", [
    ("{not json", "is not JSON"),
    ('{"kind": "dsv4kit-bench"}', "is not a dsv4kit validation report"),
])
def test_a_file_that_is_not_a_validation_report_is_refused(tmp_path, facts, content, expect):
    path = tmp_path / "box1-gpu7-20261201T120000Z.json"
    path.write_text(content)
    assert expect in refused(tmp_path, path)


def test_a_stale_latest_report_provisions_stock_and_says_why(tmp_path, monkeypatch, facts):
    results = tmp_path / "results"
    keep(results, validated_report(tmp_path, monkeypatch), when="20261201T090000Z")
    keep(results, validated_report(tmp_path, monkeypatch, driver="575.57.08"), when="20261201T100000Z")
    inventory = write_inventory(tmp_path / "inv")
    lines: list[str] = []
    extra = kernel_plan.resolve_for_provision(inventory, results_dir=results, say=lines.append)
    flags = extra["kernel_rollout_plan"]["box1"]
    assert flags["flags"] == {INDEXER: "0", ATTENTION: "0"}
    assert "box1-gpu7-20261201T100000Z.json is not evidence" in flags["decision"]["flags"][ATTENTION]["why"]
    assert any("driver '575.57.08'" in line for line in lines)


def test_auto_for_an_unknown_flag_is_bad_input(tmp_path, facts):
    host = kernel_plan_host(tmp_path, dsv4_kernel_flags={"SGLANG_SOMETHING": "auto"})
    with pytest.raises(kernel_plan.PlanError, match="'auto' is only known for the kernel flags") as exc:
        kernel_plan.plan_host(host, results_dir=tmp_path)
    assert exc.value.exit_code == exitcodes.USAGE


# --------------------------------------------------------------------------- host facts
def test_probe_output_is_parsed():
    facts, notes = kernel_plan.parse_probe(
        "gpu=0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.95.05\n"
        "gpu=1, NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.95.05\nsglang=0.5.23\n")
    assert facts.gpus[1].startswith("NVIDIA RTX") and facts.driver == "580.95.05" and facts.sglang == "0.5.23"
    facts, notes = kernel_plan.parse_probe("gpu=NVIDIA-SMI has failed because it couldn't communicate\nsglang=\n")
    assert not facts.gpus and facts.sglang is None and "couldn't communicate" in notes[0]


# --------------------------------------------------------------------------- validate's options
def test_validate_local_writes_a_verdict_section_and_checks_its_options(tmp_path):
    out = tmp_path / "local.json"
    code, text, err = cli("validate", "--local", "--cases", "indexer:1x2x100x16", "-o", str(out))
    assert code == exitcodes.OK, err
    assert "kernel verdict: not measured (no GPU" in text  # this machine: the interpreter
    verdict = json.loads(out.read_text())["verdict"]
    assert verdict["shapes"] == {"context_length": verdict_run.DEFAULT_CONTEXT,
                                 "concurrency": list(verdict_run.DEFAULT_CONCURRENCY), "decode_tp": 4,
                                 "attention_backend": "flashinfer"}
    code, _, err = cli("validate", "--local", "--cases", "indexer:1x2x100x16", "--concurrency", "0,4")
    assert code == exitcodes.USAGE and "--concurrency '0,4'" in err
    code, _, err = cli("validate", "--local", "--cases", "indexer:1x2x100x16", "--no-verdict", "-o", str(out))
    assert code == exitcodes.OK and "verdict" not in json.loads(out.read_text())


def test_validate_remote_checks_concurrency_before_connecting(tmp_path):
    inventory = write_inventory(tmp_path / "inv", ansible_port=1)  # nothing listens: would be exit 3
    code, _, err = cli("validate", "--host", "box1", "--gpu", "0", "-i", str(inventory), "--installed",
                       "--concurrency", "x")
    assert code == exitcodes.USAGE and "--concurrency 'x'" in err


@pytest.mark.parametrize("tags, skip, runs", [
    (None, None, True), (["kernel_rollout"], None, True), (["sglang_venv,kernel_rollout"], None, True),
    (["all"], None, True), (["nvidia_driver"], None, False), (["sglang_service", "host_tuning"], None, False),
    (None, ["kernel_rollout"], False), (["nvidia_*"], None, True),
])
def test_only_a_run_with_the_kernel_rollout_stage_resolves_auto(tmp_path, monkeypatch, facts, tags, skip, runs):
    results = tmp_path / "results"
    keep(results, validated_report(tmp_path, monkeypatch, driver="575.57.08"))  # stale after a driver upgrade
    inventory = write_inventory(tmp_path / "inv")
    if runs:
        extra = kernel_plan.resolve_for_provision(inventory, results_dir=results, tags=tags, skip_tags=skip)
        assert "driver '575.57.08'" in extra["kernel_rollout_plan"]["box1"]["decision"]["flags"][INDEXER]["why"]
    else:  # e.g. the driver upgrade itself: not stopped by the report it makes stale
        assert kernel_plan.resolve_for_provision(inventory, results_dir=results, tags=tags, skip_tags=skip) is None
        assert facts["calls"] == 0
