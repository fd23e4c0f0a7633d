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
