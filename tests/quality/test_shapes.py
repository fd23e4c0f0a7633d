"""The checks that reach the kernels at the shapes the box serves (docs/quality.md, *What the
defaults ask*), against the stand-in model's planted faults (tests/fake_model.py).

``box_eval.py run`` runs as on the box (a subprocess) against the stand-in server; the answers are
judged by ``checks.judge``. Each fault passes every check the gate had before (``logprob_kl``,
``arm_agreement``, ``needles``, ``tasks``: the gate of today's main would turn the flag on) and
fails the check made for it, alone and as arm B of an A/B; the clean stand-in passes every check.
Small contexts: the indexer's threshold stays 2,048 tokens, the served context is 8K."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.quality_support import make_tasks

pytestmark = pytest.mark.slow
CTX = 8192
BEFORE = ("logprob_kl", "arm_agreement", "needles", "tasks")
BOX_EVAL = Path(__file__).resolve().parents[2] / "toolkit" / "quality" / "box_eval.py"
CHECK_SETS = ("logprob", "needles", "long", "tasks", "tasks_long", "tasks_sampled", "batch", "api")


@pytest.fixture(scope="module")
def stand_in(tokenizer_dir, tmp_path_factory):
    """``ask(fault, ctx=CTX) -> box_eval result``: one quick eval's answers from the stand-in with ``fault``."""
    from dsv4kit.quality.run import spec_for
    from tests.bench_support import FakeServer

    work = tmp_path_factory.mktemp("shapes")
    server = FakeServer(work / "server", tokenizer_dir, context_length=CTX).start()
    tasks = make_tasks(work / "tasks.jsonl", n=30)

    def ask(fault: dict, ctx: int = CTX, batch: dict | None = None) -> dict:
        server.post("/_test/config", {"model": fault, "restart": True})
        spec = spec_for(ctx, True, 42, str(tasks), 20)
        if batch is not None:  # the batch mix alone, with these settings
            spec = {k: v for k, v in spec.items() if k not in CHECK_SETS} | {"batch": {**spec["batch"], **batch}}
        spec.update(url=f"http://127.0.0.1:{server.port}", model_path=str(tokenizer_dir), parallel=16)
        (work / "spec.json").write_text(json.dumps(spec))
        done = subprocess.run([sys.executable, str(BOX_EVAL), "run", "--spec", str(work / "spec.json"),
                               "--out", str(work / "out.json")], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads((work / "out.json").read_text())

    cache: dict = {}

    def cached(fault: dict, ctx: int = CTX, batch: dict | None = None) -> dict:  # arm A's clean answers serve every fault's A/B
        key = json.dumps([fault, ctx, batch], sort_keys=True)
        if key not in cache:
            cache[key] = ask(fault, ctx, batch)
        return cache[key]

    yield cached
    server.stop()


def _judge(arms: dict) -> dict:
    from dsv4kit.quality.checks import Thresholds, judge

    outcome, checks = judge(arms, Thresholds())
    return {"outcome": outcome, **{c["check"]: c for c in checks}}


def test_the_clean_stand_in_passes_every_check_and_the_budget_says_what_each_drove(stand_in):
    clean = stand_in({})
    for arms in ({"A": clean}, {"A": clean, "B": stand_in({"prefill_us_per_token": 60})}):
        judged = _judge(arms)
        assert judged["outcome"] == "pass", {k: v["why"] for k, v in judged.items() if k != "outcome"}
    budget = clean["budget"]
    assert set(budget) == {"logprob", "needles", "long", "tasks", "tasks_long", "tasks_sampled", "batch"}
    assert budget["long"]["crossed_threshold"] and budget["long"]["max_position"] > 2048
    assert budget["tasks_long"]["prompt_min"] > 2048 and budget["batch"]["prompt_max"] > 2048
    assert not budget["logprob"]["crossed_threshold"] and not budget["tasks"]["crossed_threshold"]
    assert all(e["requests"] and e["logprob_values"] and not e["bad_logprobs"] for e in budget.values())
    judged = _judge({"A": clean})
    assert judged["batch_mix"]["per_arm"]["A"]["beside_long"] > 0
    assert clean["checks"]["batch"]["attempts"] == 1


def test_a_mixed_phase_with_no_overlap_runs_again_and_then_says_so(stand_in):
    # The shorts sent 3 s after the longs, which the stand-in prefills in at most 1 s: no short
    # request is ever in flight beside a long one, so every phase is run and none is judged.
    from dsv4kit.quality.checks import Thresholds
    from dsv4kit.quality.checks_batch import batch_check

    late = stand_in({}, batch={"stagger_s": 3.0})
    assert late["checks"]["batch"]["attempts"] == 3
    verdict = batch_check({"A": late}, Thresholds())
    assert verdict["outcome"] == "inconclusive" and "no request was in flight" in verdict["why"], verdict


@pytest.mark.parametrize("fault, check", [
    ({"kl_drift": 0.4, "drift_past_tokens": 2048}, "logprob_kl_long"),
    ({"bend_topk": 0.5}, "logprob_kl_long"),
    ({"flip_past_tokens": 2048}, "tasks_long"),
    ({"degenerate_after": 300}, "degeneration"),
    ({"wrong_beside_long": True, "prefill_us_per_token": 100}, "batch_mix"),
    ({"sampled_wrong": True}, "tasks_sampled"),
    ({"null_logprob_past": 2048}, "logprob_validity"),
], ids=["logits-wrong-past-2048", "top-k-bent-argmax-kept", "wrong-after-long-context", "long-generation-loops",
        "wrong-beside-long-prefill", "wrong-when-sampled", "null-logprobs-past-2048"])
def test_each_fault_fails_its_check(stand_in, fault, check):
    # Each of these faults passed the four checks of the gate before round two (measured on that
    # code); the short-set top-k rules may now catch some of them too, which is fine.
    broken = stand_in(fault)
    paired = _judge({"A": stand_in({}), "B": broken})
    assert paired[check]["outcome"] == "fail" and paired["outcome"] == "fail", paired[check]
    alone = _judge({"A": broken})
    assert alone[check]["outcome"] == "fail", alone[check]


def test_nothing_past_the_threshold_is_inconclusive_never_a_pass(stand_in):
    small = stand_in({}, ctx=2048)  # every prompt and output stays under the indexer's 2,048 tokens
    judged = _judge({"A": small})
    assert judged["logprob_kl_long"]["outcome"] == "inconclusive", judged["logprob_kl_long"]
    assert "threshold" in judged["logprob_kl_long"]["why"]
    assert "tasks_long" not in small["checks"] and not small["budget"]["long"]["crossed_threshold"]


def test_the_loop_detector_finds_exact_loops_only():
    import random

    from dsv4kit.quality.checks_long import degenerate

    rng = random.Random(3)
    free = [rng.randrange(5000) for _ in range(4096)]
    assert degenerate(free) is None
    looped = free[:1000] + free[1000:1040] * 60  # a 40-token loop to the end
    assert degenerate(looped) == {"period": 40, "tokens": 2400}
    assert degenerate(free[:100] + [7] * 60) is None  # too short a tail to call a loop
    assert degenerate(free[:3000] + free[:300] * 4) is None  # a period longer than 256 is text, not a loop
