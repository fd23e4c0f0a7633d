"""The eval's judging against hand-built box results: each hostile result below passed the gate
before (a void measurement, one token's logprob only, a whole needle cell lost inside the overall
share, a quick record for ``auto``...) and must not pass now; the clean result still passes.

The results have ``box_eval.py run``'s shape; no server runs, so these are fast."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsv4kit.quality.checks import Thresholds, judge

POSITIONS, SAMPLES = 80, 4


def _top(j: int, probs=None) -> list:
    """Position ``j``'s top-5, best first: a top-1 of 0.5 to 0.86, the rest shares of what is left."""
    if probs is None:
        first = 0.5 + 0.04 * (j % 10)
        probs = [first] + [(1 - first) * share for share in (0.5, 0.25, 0.12, 0.06)]
    return [[math.log(p), 1000 + 10 * j + r] for r, p in enumerate(probs)]


def _sample(index: int) -> dict:
    tops = [_top(j) for j in range(POSITIONS)]
    out = [t[0][0] + 1e-4 * ((j % 3) - 1) for j, t in enumerate(tops)]  # decode: a kernel's own rounding
    return {"index": index, "prompt_tokens": 512, "output_ids": [t[0][1] for t in tops], "output_logprobs": out,
            "output_top": tops, "reprefill_logprobs": [t[0][0] for t in tops],
            "reprefill_top": copy.deepcopy(tops)}


def _needles(found=lambda context, depth, variant: True, contexts=(4096, 8192)) -> dict:
    cells = []
    for context in contexts:
        for variant in range(2):
            cells.append({"context": context, "variant": variant, "prompt_tokens": context - 64, "needles": [
                {"label": f"n{depth}", "key": "1234567", "depth": depth, "found": found(context, depth, variant)}
                for depth in (0.05, 0.25, 0.5, 0.75, 0.95)]})
    return {"cells": cells}


def _tasks(wrong=(), n=200) -> dict:
    return {"shots": 5, "items": [{"line": 6 + i, "label": i, "pred": i + (i in wrong), "correct": i not in wrong,
                                   "output_tokens": 40} for i in range(n)]}


def arm(**parts) -> dict:
    checks = {"logprob": {"samples": [_sample(i) for i in range(SAMPLES)]}, "needles": _needles(), "tasks": _tasks()}
    checks.update(parts)
    return {"checks": checks, "timings_s": {}}


def ab(b=None, a=None, control=None) -> dict:
    arms = {"A": a or arm(), "B": b or arm()}
    arms["A"]["control"] = {"checks": {"tasks": control or _tasks()}}
    return arms


def outcome(arms: dict, name: str | None = None) -> str:
    result, checks = judge(arms, Thresholds())
    if name is None:
        return result
    return next((c["outcome"] for c in checks if c["check"] == name), "absent")


def _each_sample(result: dict, change) -> dict:
    for s in result["checks"]["logprob"]["samples"]:
        change(s)
    return result


def test_the_clean_result_passes_alone_and_ab():
    assert outcome({"A": arm()}) == "pass"
    assert outcome(ab()) == "pass", judge(ab(), Thresholds())[1]


# ------------------------------------------------------------------------------ distributions
def test_decode_top_k_bent_against_re_prefill_fails_though_the_greedy_token_holds():
    """The argmax and its logprob kept, the rest of the decode's top-k bent by 1.2 nats."""
    def bend(s):
        for pos in s["output_top"]:
            for entry in pos[1:]:
                entry[0] -= 1.2
    arms = ab(b=_each_sample(arm(), bend))
    assert outcome(arms) == "fail" and outcome(arms, "topk_reprefill") == "fail"
    assert outcome(arms, "logprob_kl") == "pass"  # one token's logprob cannot see it


def test_arms_bent_apart_up_to_the_divergence_fail():
    """Same greedy text in both arms, B's second choices moved by 0.5 nats everywhere."""
    def bend(s):
        for pos, pre in zip(s["output_top"], s["reprefill_top"]):
            for entry in (*pos[1:3], *pre[1:3]):
                entry[0] -= 0.5
    arms = ab(b=_each_sample(arm(), bend))
    assert outcome(arms) == "fail" and outcome(arms, "arm_agreement") == "fail"


@pytest.mark.parametrize("gap, expect", [(1.5, "fail"), (0.1, "pass")], ids=["far-from-a-tie", "near-tie"])
def test_arms_may_part_only_at_a_near_tie(gap, expect):
    """B emits A's second choice at position 10 of prompt 0; A has it ``gap`` nats below its first."""
    near = (0.5, 0.5 * math.exp(-gap), 0.02, 0.01, 0.005)
    a, b = arm(), arm()
    for side in (a, b):
        s = side["checks"]["logprob"]["samples"][0]
        s["output_top"][10] = s["reprefill_top"][10] = _top(10, near)
        s["output_logprobs"][10] = s["reprefill_logprobs"][10] = math.log(near[0])
    sb = b["checks"]["logprob"]["samples"][0]
    sb["output_top"][10] = sb["reprefill_top"][10] = [sb["output_top"][10][1], sb["output_top"][10][0],
                                                      *sb["output_top"][10][2:]]
    sb["output_ids"][10] = sb["output_top"][10][0][1]
    sb["output_logprobs"][10] = sb["reprefill_logprobs"][10] = sb["output_top"][10][0][0]
    arms = ab(a=a, b=b)
    assert outcome(arms, "arm_agreement") == expect, judge(arms, Thresholds())[1]


def test_a_greedy_token_that_is_not_the_top_1_of_its_position_fails():
    def second(s):
        s["output_ids"][5] = s["output_top"][5][1][1]
    arms = ab(b=_each_sample(arm(), second))
    assert outcome(arms) == "fail" and outcome(arms, "logprob_validity") == "fail"


# ------------------------------------------------------------------------------ void measurements
def test_a_kl_of_exactly_zero_is_not_a_pass():
    def same(s):
        s["output_logprobs"] = list(s["reprefill_logprobs"])
    arms = ab(a=_each_sample(arm(), same), b=_each_sample(arm(), same))
    assert outcome(arms, "logprob_kl") == "inconclusive" and outcome(arms) != "pass"


def test_logprobs_all_zero_or_all_equal_are_not_a_pass():
    def zero(s):
        s["output_logprobs"] = [0.0] * POSITIONS
        s["reprefill_logprobs"] = [0.0] * POSITIONS
        s["output_top"] = [[[0.0, t]] for t in s["output_ids"]]
        s["reprefill_top"] = copy.deepcopy(s["output_top"])
    arms = ab(a=_each_sample(arm(), zero), b=_each_sample(arm(), zero))
    assert outcome(arms) != "pass" and outcome(arms, "logprob_validity") == "inconclusive"

    def equal(s):
        s["output_logprobs"] = [-0.5] * POSITIONS
        s["reprefill_logprobs"] = [-0.5 + 1e-4] * POSITIONS
    arms = ab(a=_each_sample(arm(), equal), b=_each_sample(arm(), equal))
    assert outcome(arms) != "pass" and outcome(arms, "logprob_validity") == "inconclusive"


@pytest.mark.parametrize("probs", [(0.7, 0.4, 0.07, 0.04, 0.02), (0.7, 0.05, 0.15, 0.04, 0.02)],
                         ids=["sums-above-1", "not-descending"])
def test_a_top_k_that_is_no_distribution_fails(probs):
    def broken(s):
        s["output_top"][3] = _top(3, probs)
    arms = ab(b=_each_sample(arm(), broken))
    assert outcome(arms) == "fail" and outcome(arms, "logprob_validity") == "fail"


def test_a_null_logprob_in_any_answer_fails():
    """A needle answer that carries logprobs with one null in them, the rest of the record clean."""
    b = arm()
    b["checks"]["needles"]["cells"][1]["needles"][2]["output_logprobs"] = [-0.1, None, -0.3]
    arms = ab(b=b)
    assert outcome(arms) == "fail" and outcome(arms, "logprob_validity") == "fail"


def test_nothing_past_the_indexer_threshold_is_not_a_pass():
    short = _needles(contexts=(1024, 2048))
    arms = ab(a=arm(needles=short), b=arm(needles=copy.deepcopy(short)))
    assert outcome(arms, "kernel_reach") == "inconclusive" and outcome(arms) != "pass"


def test_a_needle_cell_that_loses_all_its_needles_fails_whatever_the_share():
    """38 of 40 found (95%), but both needles at depth 0.5 of 8192 lost, in both arms."""
    lost = _needles(found=lambda context, depth, variant: not (context == 8192 and depth == 0.5))
    assert outcome({"A": arm(needles=lost)}, "needles") == "fail"
    arms = ab(a=arm(needles=lost), b=arm(needles=copy.deepcopy(lost)))
    assert outcome(arms, "needles") == "fail"


# ------------------------------------------------------------------------------ tasks and auto
def test_an_accuracy_below_the_floor_is_not_a_pass():
    """GSM8K's floor is 0.95: 0.92 on 200 items passed the old 0.90, in either mode."""
    low = _tasks(wrong=range(0, 200, 12))  # 17 wrong: 0.915
    assert outcome({"A": arm(tasks=low)}, "tasks") != "pass"
    assert outcome(ab(a=arm(tasks=low), b=arm(tasks=copy.deepcopy(low)), control=low), "tasks") != "pass"
    below = _tasks(wrong=range(0, 200, 6))  # 34 wrong: 0.83, significantly below
    assert outcome(ab(a=arm(tasks=below), b=arm(tasks=copy.deepcopy(below)), control=below), "tasks") == "fail"


def test_the_control_flip_rate_stands_beside_mcnemar_and_a_noisy_box_is_inconclusive():
    """A and B flip 6 items each way (balanced, net 0: passed before); A against itself flips 12%."""
    a, b = _tasks(wrong=range(0, 6)), _tasks(wrong=range(6, 12))
    noisy = _tasks(wrong=range(12, 24))
    _, checks = judge(ab(a=arm(tasks=a), b=arm(tasks=b), control=noisy), Thresholds())
    tasks = next(c for c in checks if c["check"] == "tasks")
    assert tasks["outcome"] == "inconclusive" and tasks["control"]["flip_rate"] == pytest.approx(18 / 200)
    assert "control" in tasks["why"] and "McNemar" in tasks["why"]
    _, checks = judge(ab(a=arm(tasks=a), b=arm(tasks=b), control=_tasks(wrong=range(0, 7))), Thresholds())
    assert next(c for c in checks if c["check"] == "tasks")["outcome"] == "pass"


def test_speculative_acceptance_below_the_floor_relative_to_arm_a_fails():
    arms = ab()
    arms["A"]["speculative"] = {"algorithm": "DSPARK", "accept_length": 3.1}
    arms["B"]["speculative"] = {"algorithm": "DSPARK", "accept_length": 2.2}
    assert outcome(arms) == "fail" and outcome(arms, "spec_acceptance") == "fail"
    arms["B"]["speculative"]["accept_length"] = 3.05
    assert outcome(arms) == "pass"


@pytest.fixture
def evidence_host():
    from dsv4kit.core.inventory import Host

    def make(**variables):
        return Host(name="box1", groups=["dsv4_boxes"], source=Path("hosts.yml"), vars={"dsv4_context_length": 8192, "dsv4_sglang_version": "0.5.23",
                                                              **variables})
    return make


def _problems(record, host):
    from dsv4kit.records.quality_evidence import problems
    from dsv4kit.validation.verdict_run import kernels_digest

    return problems(record, host, SimpleNamespace(gpus={}, driver=None), kernels_digest(), {})


def test_what_counts_for_auto(evidence_host):
    from tests.quality_support import quality_record

    host = evidence_host()
    flag = "SGLANG_SM120_MMA_ATTENTION"
    good = quality_record(host, flag, gpu="g", driver="d")
    assert _problems(good, host) == []
    quick = copy.deepcopy(good)
    quick["eval"]["quick"] = True
    assert any("quick record never counts" in p for p in _problems(quick, host))
    tasks = next(c for c in good["checks"] if c["check"] == "tasks")
    few = copy.deepcopy(good)
    next(c for c in few["checks"] if c["check"] == "tasks")["per_arm"]["B"].update(n=50, accuracy=1.0)
    assert any("fewer than the 200" in p for p in _problems(few, host))
    low = copy.deepcopy(good)
    next(c for c in low["checks"] if c["check"] == "tasks")["per_arm"]["B"].update(accuracy=0.93)
    assert any("below the task set's floor 0.95" in p for p in _problems(low, host))
    blind = copy.deepcopy(good)
    next(c for c in blind["checks"] if c["check"] == "tasks")["control"] = None
    assert any("no control run" in p for p in _problems(blind, host))
    # Another task set gets its own floor from the inventory (the tests' generated set, say).
    own = copy.deepcopy(few)
    own["eval"]["tasks_source"]["sha256"] = "ab" * 32
    assert any("fewer than the 200" in p for p in _problems(own, host))
    configured = evidence_host(dsv4_eval_task_floors={"ab" * 32: {"min_accuracy": 0.9, "min_items": 50}})
    assert _problems(own, configured) == [] and tasks["per_arm"]["A"]["n"] == 200
    # A drafter on: the acceptance check is required.
    spec = copy.deepcopy(good)
    spec["arms"]["A"]["speculative_algorithm"] = "DSPARK"
    assert any("spec_acceptance" in p for p in _problems(spec, host))


def test_docs_state_the_thresholds_the_code_judges_with():
    """docs/quality.md's table is generated from ``Thresholds``; the numbers its prose gives follow from them."""
    from dsv4kit.quality.checks import thresholds_markdown

    text = (Path(__file__).resolve().parents[2] / "docs/quality.md").read_text()
    block = text.split("<!-- thresholds:start -->\n")[1].split("\n<!-- thresholds:end -->")[0]
    assert block == thresholds_markdown(), "regenerate the table: dsv4kit.quality.checks.thresholds_markdown()"
    t = Thresholds()
    assert "a drift of 0.1 nats on the greedy token alone" in text and math.expm1(0.1) - 0.1 >= t.max_kl
    assert "(under 2% of probability)" in text and math.exp(t.topk_floor_logprob) < 0.02
    assert "a factor of e in one token's" in text and t.max_topk_nats == 1.0


@pytest.mark.parametrize("quick", [False, True], ids=["default", "quick"])
def test_needles_are_spaced_so_a_lost_page_range_always_holds_one(quick):
    """The indexer losing a range of a few thousand tokens anywhere in any haystack loses a needle."""
    from dsv4kit.quality import prompts, run

    spec = run.spec_for(131072, quick, 42, None, None)["needles"]
    plan = prompts.needle_plan(spec["seed"], spec["contexts"], spec["depths"], spec["variants"],
                               *([spec["spacing"]] if "spacing" in spec else []))
    for haystack in plan:
        at = sorted(n["depth"] * haystack["context"] for n in haystack["needles"])
        gaps = [b - a for a, b in zip([0.0, *at], [*at, haystack["context"]])]
        assert max(gaps) <= 4096, (haystack["context"], max(gaps))
        assert len({n["label"] for n in haystack["needles"]}) == len(haystack["needles"])


def test_the_docs_needle_counts_are_the_plans():
    from dsv4kit.quality import prompts, run

    text = (Path(__file__).resolve().parents[2] / "docs/quality.md").read_text()
    for quick, spacing in ((False, "4,096"), (True, "4,096")):
        spec = run.spec_for(131072, quick, 42, None, None)["needles"]
        total = sum(len(c["needles"]) for c in prompts.needle_plan(spec["seed"], spec["contexts"], spec["depths"],
                                                                   spec["variants"], spec["spacing"]))
        assert f"a needle at most every {spacing} tokens" in text and f"{total} needles at 128K" in text
        assert f"{spec['spacing']:,}" == spacing


# ---------------------------------------------------------------- one rule each (near-copies unified)
def _long_set(bend=None) -> dict:
    samples = []
    for i in range(SAMPLES):
        s = _sample(i)
        s.update(prompt_tokens=3000, max_position=3000 + POSITIONS, kind="continuation")
        if bend is not None and i == 0:
            s["reprefill_top"][0][4][0] -= bend  # one tail token of one position, the order kept
        samples.append(s)
    return {"threshold_tokens": 2048, "samples": samples}


def _check(arms: dict, name: str) -> dict:
    return next(c for c in judge(arms, Thresholds())[1] if c["check"] == name)


def test_the_long_set_judges_top_k_by_topk_reprefills_rule_and_thresholds():
    """One position bent by 1.5 nats: the long set's old mean over every listed token stayed far
    under its 0.1 bound; the shared rule bounds every position by ``max_topk_nats`` too."""
    assert _check({"A": arm(long=_long_set())}, "logprob_kl_long")["outcome"] == "pass"
    bent = _check({"A": arm(long=_long_set(bend=1.5))}, "logprob_kl_long")
    assert bent["outcome"] == "fail" and "(bound 1.0)" in bent["why"], bent["why"]
    assert "max_topk_mean_delta" not in Thresholds.__dataclass_fields__


def test_a_null_logprob_counted_by_the_box_fails_logprob_validity_naming_the_check():
    """The box's ledger sees every request, kept in the record or not; its count is judged by the
    same check and rule as the recorded answers (there is no second check for it)."""
    clean = arm()
    clean["budget"] = {"logprob": {"logprob_values": 900, "bad_logprobs": 0, "missing_logprobs": 0}}
    assert outcome({"A": clean}, "logprob_validity") == "pass"
    broken = arm()
    broken["budget"] = {"long": {"logprob_values": 900, "bad_logprobs": 3, "missing_logprobs": 0}}
    verdict = _check({"A": broken}, "logprob_validity")
    assert verdict["outcome"] == "fail" and "long: 3 null or non-finite value(s)" in verdict["why"], verdict["why"]
    assert outcome({"A": broken}, "logprobs_everywhere") == "absent"
