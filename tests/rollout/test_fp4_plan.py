"""``dsv4_fp4_indexer: auto`` resolved by the plan: true only with the report's ``indexer_fp4`` verdict
(the FP4 indexer SGLang would call correct and fastest at every shape) AND a passing ``eval --ab
dsv4_fp4_indexer=false,true`` record; each missing piece keeps it false, saying which. The verdict
section is made by the real ``verdict.decide`` from stood-in measurements; report, inventory, quality
records, plan and provision extra vars are the product's own."""

from __future__ import annotations

import json

import pytest

from dsv4kit.records import quality_evidence
from dsv4kit.rollout import plan as kernel_plan
from dsv4kit.validation import verdict as v
from dsv4kit.validation import verdict_run
from tests.rollout.test_kernel_plan import (ATTENTION, INDEXER, facts, keep, kernel_plan_host,  # noqa: F401
                                            quality_repo, validated_report, write_inventory)

SETTING = "dsv4_fp4_indexer"
SHAPES = [s.label for s in verdict_run.decode_shapes("indexer_fp4", 8192, (1, 16, 64))]
JITTER = (-0.02, -0.01, 0.0, 0.01, 0.02)


def fp4_target(us: dict | None = None, wrong_at: str | None = None, deepgemm: bool = False) -> dict:
    """The report's ``indexer_fp4`` target: ``us`` gives each implementation's µs (default: dsv4kit's
    FP4 fastest everywhere); ``wrong_at``: a shape where dsv4kit's FP4 misses the bar."""
    us = us or {"dsv4kit": 5.0, "dsv4kit-fp8": 9.0, "sglang-tilelang": 8.0}
    rows = []
    for impl, base in us.items():
        for shape in SHAPES:
            value = base(shape) if callable(base) else base
            rel = 1.0 if (impl == "dsv4kit" and shape == wrong_at) else 1e-4
            rows.append(v.Measurement("indexer_fp4", impl, impl == "deepgemm-fp4", shape, rel, 2e-3,
                                      tuple(value * (1 + d) for d in JITTER)))
    unavailable = {} if deepgemm else {"deepgemm-fp4": "not available: ModuleNotFoundError: deep_gemm"}
    return v.decide("indexer_fp4", rows, unavailable, shapes=SHAPES).to_dict()


def report_with(tmp_path, monkeypatch, target: dict | None, **identity):
    report = validated_report(tmp_path, monkeypatch, **identity)
    if target is not None:
        report["verdict"]["targets"]["indexer_fp4"] = target
    return keep(tmp_path / "results", report)


def decide(tmp_path, path, indexer="1", fp4="auto") -> dict:
    host = kernel_plan_host(tmp_path, dsv4_kernel_flags={INDEXER: indexer, ATTENTION: "0"}, dsv4_fp4_indexer=fp4)
    return kernel_plan.plan_host(host, from_report=path, quality=quality_evidence.finder())


def keep_quality(quality_repo, tmp_path, fp4="auto", **kw):
    quality_repo(SETTING, write_inventory(tmp_path / "inv-plan", {INDEXER: "1", ATTENTION: "0"},
                                          dsv4_fp4_indexer=fp4), **kw)


def test_both_pieces_of_evidence_turn_it_on(tmp_path, monkeypatch, facts, quality_repo):
    path = report_with(tmp_path, monkeypatch, fp4_target())
    keep_quality(quality_repo, tmp_path)
    decision = decide(tmp_path, path)["settings"][SETTING]
    assert decision["value"] is True and decision["source"] == "report + quality record"
    assert decision["serving"] == "dsv4kit" and decision["report"] == path.name
    assert "correct and the fastest correct indexer at every shape" in decision["why"]
    assert decision["quality_record"].startswith("box1-eval-")


def test_the_record_holds_across_the_settings_own_value(tmp_path, monkeypatch, facts, quality_repo):
    """The A/B key is left out of the record's fingerprint: made while the inventory said false, it
    still counts once the inventory says auto; another served context does not."""
    path = report_with(tmp_path, monkeypatch, fp4_target())
    keep_quality(quality_repo, tmp_path, fp4=False)
    assert decide(tmp_path, path)["settings"][SETTING]["value"] is True
    quality_repo(SETTING, write_inventory(tmp_path / "inv-other", {INDEXER: "1", ATTENTION: "0"},
                                          dsv4_fp4_indexer="auto", dsv4_context_length=4096),
                 when="20261201T150000Z-cccccc")
    decision = decide(tmp_path, path)["settings"][SETTING]
    assert decision["value"] is False and "the serving configuration changed since (dsv4_context_length)" in decision["why"]


def test_without_a_quality_record_it_stays_off_naming_the_command(tmp_path, monkeypatch, facts, quality_repo):
    path = report_with(tmp_path, monkeypatch, fp4_target())
    decision = decide(tmp_path, path)["settings"][SETTING]
    assert decision["value"] is False and decision["source"] == "quality record missing"
    assert "no quality record" in decision["why"] and "dsv4kit eval --ab dsv4_fp4_indexer=false,true" in decision["why"]


def test_a_kernel_flag_record_is_not_evidence_for_the_setting(tmp_path, monkeypatch, facts, quality_repo):
    path = report_with(tmp_path, monkeypatch, fp4_target())
    quality_repo(INDEXER)
    assert "no quality record" in decide(tmp_path, path)["settings"][SETTING]["why"]


@pytest.mark.parametrize("target, indexer, words", [
    (None, "1", "has no indexer_fp4 verdict"),
    (fp4_target(wrong_at=SHAPES[1]), "1", f"dsv4kit is not shown correct at {SHAPES[1]}"),
    (fp4_target({"dsv4kit": lambda s: 3.0 if s == SHAPES[0] else 5.0, "dsv4kit-fp8": 4.0, "sglang-tilelang": 8.0}),
     "1", "dsv4kit is not the fastest correct indexer at"),
    (fp4_target(), "0", "deepgemm-fp4, the FP4 indexer SGLang would call, was not measured (not available"),
    (fp4_target({"deepgemm-fp4": 5.0, "dsv4kit": 2.0, "sglang-tilelang": 8.0}, deepgemm=True), "0",
     "deepgemm-fp4 is not the fastest correct indexer at"),
])
def test_numbers_that_do_not_show_it_keep_it_off(tmp_path, monkeypatch, facts, quality_repo, target, indexer, words):
    path = report_with(tmp_path, monkeypatch, target)
    keep_quality(quality_repo, tmp_path)
    decision = decide(tmp_path, path, indexer=indexer)["settings"][SETTING]
    assert decision["value"] is False and decision["source"] == "report" and words in decision["why"]


def test_no_report_or_one_from_another_driver_keeps_it_off(tmp_path, monkeypatch, facts, quality_repo):
    host = kernel_plan_host(tmp_path, dsv4_fp4_indexer="auto", dsv4_kernel_flags={INDEXER: "1"})
    decision = kernel_plan.plan_host(host, results_dir=tmp_path / "none")["settings"][SETTING]
    assert decision == {"value": False, "source": "no report", "why": decision["why"]}
    assert "no full validation report for box1" in decision["why"]
    path = report_with(tmp_path, monkeypatch, fp4_target(), driver="575.57.08")
    keep_quality(quality_repo, tmp_path)
    decision = decide(tmp_path, path)["settings"][SETTING]
    assert decision["value"] is False and "driver '575.57.08'" in decision["why"]


def test_a_set_value_is_the_inventorys(tmp_path, facts):
    plan = kernel_plan.plan_host(kernel_plan_host(tmp_path, dsv4_fp4_indexer=True, dsv4_kernel_flags={INDEXER: "1"}))
    assert plan["settings"][SETTING] == {"value": True, "source": "inventory", "why": "set in dsv4_fp4_indexer"}
    assert facts["calls"] == 0


@pytest.mark.parametrize("tags, planned", [(None, True), (["sglang_service"], True), (["kernel_rollout"], True),
                                           (["nvidia_driver"], False), (["sglang_venv"], False)])
def test_provision_passes_the_resolved_value_to_the_serving_role(tmp_path, monkeypatch, facts, quality_repo,
                                                                 tags, planned):
    path = report_with(tmp_path, monkeypatch, fp4_target())
    inventory = write_inventory(tmp_path / "inv-plan", {INDEXER: "1", ATTENTION: "0"}, dsv4_fp4_indexer="auto")
    keep_quality(quality_repo, tmp_path)
    lines = []
    extra = kernel_plan.resolve_for_provision(inventory, results_dir=path.parent, tags=tags, say=lines.append,
                                              quality=quality_evidence.finder())
    if not planned:
        assert extra is None and facts["calls"] == 0
        return
    assert extra[kernel_plan.FP4_PLAN_VAR] == {"box1": True}
    decision = extra["kernel_rollout_plan"]["box1"]["decision"]
    assert decision["settings"][SETTING]["value"] is True
    assert any(line.startswith(f"  {SETTING}=true  [report + quality record]") for line in lines)
    json.dumps(extra)


def test_provision_leaves_a_host_without_auto_alone(tmp_path, facts):
    inventory = write_inventory(tmp_path / "inv", {INDEXER: "1", ATTENTION: "0"}, dsv4_fp4_indexer=False)
    assert kernel_plan.resolve_for_provision(inventory, results_dir=tmp_path) is None


def test_rollout_status_shows_the_decided_setting(tmp_path, monkeypatch, facts, quality_repo):
    from dsv4kit.rollout import status

    path = report_with(tmp_path, monkeypatch, fp4_target())
    keep_quality(quality_repo, tmp_path)
    inventory = write_inventory(tmp_path / "inv-plan", {INDEXER: "1", ATTENTION: "0"}, dsv4_fp4_indexer="auto")
    extra = kernel_plan.resolve_for_provision(inventory, results_dir=path.parent, quality=quality_evidence.finder())
    decision_file = tmp_path / "kernel-decision.json"  # as kernel_rollout writes it (to_nice_json)
    decision_file.write_text(json.dumps(extra["kernel_rollout_plan"]["box1"]["decision"], indent=4))
    report = status.status_report(environ={INDEXER: "1"}, decision_path=str(decision_file))
    assert report["decision"]["settings"][SETTING]["value"] is True
    assert f"Setting {SETTING}: on (decided by report + quality record: " in status.render(report)


def test_a_record_with_the_arms_reversed_is_not_the_fp8_against_fp4_ab(tmp_path, monkeypatch, facts, quality_repo):
    from dsv4kit.core.inventory import load_inventory
    from tests import quality_support, verdict_standins as standins

    path = report_with(tmp_path, monkeypatch, fp4_target())
    host = load_inventory(write_inventory(tmp_path / "inv-plan", {INDEXER: "1", ATTENTION: "0"},
                                          dsv4_fp4_indexer="auto")).host("box1")
    record = quality_support.quality_record(host, SETTING, gpu=standins.GPU, driver=standins.DRIVER)
    assert record["ab"] == {"key": SETTING, "kind": "setting", "values": {"A": "false", "B": "true"}}
    record["ab"]["values"] = {"A": "true", "B": "false"}
    quality_support.keep_quality(tmp_path / "results-repo", record)  # where quality_repo points the lookup
    assert "no quality record" in decide(tmp_path, path)["settings"][SETTING]["why"]


# --------------------------------------------------------------- the indexer flag and the FP4 cache
def coupled_report(tmp_path, monkeypatch):
    """A full report where dsv4kit's FP8 indexer wins every shape and its FP4 indexer too."""
    from tests import verdict_standins as standins

    table = standins.issue_table()
    table["indexer"][0] = standins.StandIn("indexer", "dsv4kit", False, {"*": 1.0})
    report = validated_report(tmp_path, monkeypatch, table=table)
    report["verdict"]["targets"]["indexer_fp4"] = fp4_target()
    return keep(tmp_path / "results", report)


def coupled_plan(tmp_path, quality_repo, path, indexer_ran_with, fp4_arms_indexer) -> dict:
    """Both auto: the indexer flag's record (what its arms ran of the FP4 cache: ``indexer_ran_with``,
    None: not recorded) and the setting's (the indexer flag its arms' servers ran)."""
    inventory = write_inventory(tmp_path / "inv-plan", {INDEXER: "auto", ATTENTION: "0"}, dsv4_fp4_indexer="auto")
    quality_repo(INDEXER, inventory, when="20261201T130000Z-aaaaaa",
                 **({} if indexer_ran_with is None else {"ran_with": indexer_ran_with}))
    quality_repo(SETTING, inventory, when="20261201T140000Z-bbbbbb",
                 arm_flags={INDEXER: fp4_arms_indexer, ATTENTION: "0"})
    host = kernel_plan_host(tmp_path, dsv4_kernel_flags={INDEXER: "auto", ATTENTION: "0"}, dsv4_fp4_indexer="auto")
    return kernel_plan.plan_host(host, from_report=path, quality=quality_evidence.finder())


def test_records_that_ran_with_each_other_turn_both_on(tmp_path, monkeypatch, facts, quality_repo):
    path = coupled_report(tmp_path, monkeypatch)
    plan = coupled_plan(tmp_path, quality_repo, path, {SETTING: True}, "1")
    assert plan["flags"][INDEXER] == "1" and plan["settings"][SETTING]["value"] is True, plan


def test_an_indexer_record_made_with_the_fp8_cache_does_not_turn_the_fp4_cache_on(tmp_path, monkeypatch, facts,
                                                                                   quality_repo):
    """The flag's record says nothing of the FP4 entry it would route: with the FP4 cache on, the
    flag has no record, so the FP4 cache stays off and the flag keeps its FP8 record."""
    path = coupled_report(tmp_path, monkeypatch)
    plan = coupled_plan(tmp_path, quality_repo, path, {SETTING: False}, "1")
    assert plan["flags"][INDEXER] == "1" and plan["decisions"][INDEXER]["source"] == "report + quality record"
    fp4 = plan["settings"][SETTING]
    assert fp4["value"] is False, fp4
    assert f"with the FP4 cache on, {INDEXER} would be 0" in fp4["why"]
    assert "its arms ran with dsv4_fp4_indexer=false, and box1 would serve dsv4_fp4_indexer=true" in fp4["why"]


def test_an_fp4_record_made_with_another_indexer_does_not_count(tmp_path, monkeypatch, facts, quality_repo):
    """The setting's record ran DeepGEMM's FP4 indexer (flag 0); served with flag 1 it would be ours."""
    path = coupled_report(tmp_path, monkeypatch)
    plan = coupled_plan(tmp_path, quality_repo, path, {SETTING: True}, "0")
    fp4 = plan["settings"][SETTING]
    assert fp4["value"] is False
    assert f"its arms ran with {INDEXER}=0, and box1 would serve {INDEXER}=1" in fp4["why"]
    # The flag's only record ran with the FP4 cache on, which is not served: stock, saying so.
    assert plan["flags"][INDEXER] == "0"
    assert "its arms ran with dsv4_fp4_indexer=true, and box1 would serve dsv4_fp4_indexer=false" in \
        plan["decisions"][INDEXER]["why"]


def test_a_record_that_does_not_say_what_it_ran_with_does_not_count_under_auto(tmp_path, monkeypatch, facts,
                                                                                quality_repo):
    path = coupled_report(tmp_path, monkeypatch)
    plan = coupled_plan(tmp_path, quality_repo, path, None, "1")
    assert plan["flags"][INDEXER] == "0" and plan["settings"][SETTING]["value"] is False
    assert "does not show which dsv4_fp4_indexer its arms ran with" in plan["decisions"][INDEXER]["why"]


def test_rollout_plan_from_a_report_plans_the_fp4_setting_too(tmp_path, monkeypatch, facts, quality_repo):
    """--from-report decides what 'auto' would, the FP4 setting included, even where it is set."""
    from tests.cli_support import invoke


    path = report_with(tmp_path, monkeypatch, fp4_target())
    inventory = write_inventory(tmp_path / "inv-cli", {INDEXER: "1", ATTENTION: "0"}, dsv4_fp4_indexer=False)
    result = invoke(["rollout", "plan", "-i", str(inventory), "--from-report", str(path), "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    decision = json.loads(result.stdout)["settings"][SETTING]
    assert decision["source"] != "inventory" and decision["report"] == path.name, decision


@pytest.mark.parametrize("record, key, expected", [
    ({"evidence": {"ran_with": {SETTING: True}}}, SETTING, (True, True)),
    ({"evidence": {"ran_with": {SETTING: None}}}, SETTING, (False, None)),  # the arms differed
    ({"evidence": {"served_config": {SETTING: False}}}, SETTING, (True, False)),  # older: a literal
    ({"evidence": {"served_config": {}}}, SETTING, (True, False)),  # older: unset is the role's false
    ({"evidence": {"served_config": {SETTING: "auto"}}}, SETTING, (False, None)),
    ({"evidence": {}, "arms": {"A": {"software": {"kernel_flags": {INDEXER: "1"}}},
                               "B": {"software": {"kernel_flags": {INDEXER: "1"}}}}}, INDEXER, (True, "1")),
    ({"evidence": {}, "arms": {"A": {"software": {"kernel_flags": {INDEXER: "1"}}},
                               "B": {"software": {"kernel_flags": None}}}}, INDEXER, (False, None)),
])
def test_what_a_record_ran_with_is_read_from_what_it_kept(record, key, expected):
    assert quality_evidence.ran_value(record, key) == expected
