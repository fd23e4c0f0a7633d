"""``dsv4kit eval`` end to end over the loopback sshd against the stand-in server and its model
(tests/fake_model.py), which stands in for the truth here: it reads its prompt, finds the pass
keys it can see, answers the generated task items and speaks SGLang 0.5.23's logprob fields.

Each fault the issue names is a broken arm B that must fail the gate while the clean arm passes:
a blind spot past N tokens (needles), logprob drift with unchanged greedy text (KL), flipped task
answers (McNemar), NaN logprobs. The A/B arms' restarts are stood in by the server's test
config (the playbook path runs in the quickstart journey)."""

from __future__ import annotations

import json

import pytest

from tests.bench.test_bench_sweep import dsv4kit, git
from tests.quality_support import make_tasks

pytestmark = pytest.mark.slow
CTX = 8192


@pytest.fixture
def eval_box(bench_box, tmp_path):
    """(server, inventory, tasks file, results repo) with the model serving CTX tokens."""
    server, inventory = bench_box(context_length=CTX, units=True)
    return server, inventory, make_tasks(tmp_path / "tasks.jsonl", n=30), tmp_path / "results"


def _eval(server, inventory, repo, tasks, fault=None, **req):
    """One in-process ``--ab SGLANG_SM120_TRITON_INDEXER=0,1 --quick`` eval; arm B gets ``fault``."""
    from dsv4kit.serving import arms
    from dsv4kit.quality import run

    def apply_arm(inventory_path, host, ctx, ab, arm, progress, timeout):
        server.post("/_test/config", {"model": fault if arm == "B" else {}, "restart": True})

    request = run.EvalRequest(ab="SGLANG_SM120_TRITON_INDEXER=0,1", quick=True, tasks=str(tasks), questions=20,
                              inventory=inventory, results_repo=repo, **req)
    plan = run.plan(request, warn=lambda s: None)
    lines: list[str] = []
    original, arms.default_apply_arm = arms.default_apply_arm, apply_arm
    try:
        outcome = run.execute(plan, progress=lines.append, argv=["dsv4kit", "eval"])
    finally:
        arms.default_apply_arm = original
    return outcome, lines


def _check(record: dict, name: str) -> dict:
    return next(c for c in record["checks"] if c["check"] == name)


def test_a_clean_ab_passes_is_recorded_and_shown(eval_box):
    server, inventory, tasks, repo = eval_box
    outcome, lines = _eval(server, inventory, repo, tasks)
    record = outcome.record
    assert record["outcome"] == "pass" and outcome.exit_code == 0, [(c["check"], c["outcome"], c.get("why")) for c in record["checks"] if c["outcome"] != "pass"]
    assert [c["check"] for c in record["checks"]] == [
        "logprob_validity", "logprob_kl", "topk_reprefill", "arm_agreement", "needles", "tasks",
        "logprob_kl_long", "arm_agreement_long", "tasks_long", "tasks_sampled", "batch_mix", "degeneration",
        "kernel_reach", "api"]
    # The control: arm A's items asked twice, its flips reported beside the A/B's.
    assert _check(record, "tasks")["control"]["paired"] == 20 and not _check(record, "tasks")["control"]["lost"]
    assert _check(record, "topk_reprefill")["per_arm"]["B"]["positions"] >= 256
    # A --quick record is a smoke test: it never counts for 'auto', and the decision says so.
    from types import SimpleNamespace

    from dsv4kit.core.inventory import load_inventory
    from dsv4kit.records.quality_evidence import problems

    host = load_inventory(inventory).host(None)
    found = problems(record, host, SimpleNamespace(gpus={}, driver=None), record["evidence"]["kernels_sha256"], {})
    assert any("quick record never counts" in p for p in found) and any("fewer than the 200" in p for p in found), found
    needles = _check(record, "needles")["per_arm"]["B"]
    # Depths 10, 50, 90% and a needle at most every 4,096 tokens (the quick spacing): 25 and 75% of 8K.
    assert needles["found"] == needles["total"] == 8 and sorted(needles["cells"], key=int) == ["1024", str(CTX)]
    assert sorted(needles["cells"][str(CTX)], key=float) == ["0.1", "0.25", "0.5", "0.75", "0.9"]
    assert _check(record, "tasks")["per_arm"]["A"]["accuracy"] == 1.0
    # What each check drove, in the record: only the long sets pass the indexer's 2,048-token threshold.
    budget = record["arms"]["B"]["budget"]
    assert budget["long"]["crossed_threshold"] and budget["tasks_long"]["prompt_min"] > 2048
    assert not budget["logprob"]["crossed_threshold"] and budget["needles"]["prompt_max"] > 2048
    assert any("ETA" in line for line in lines) and any("arm B:" in line for line in lines)

    # The record sits beside bench records, with its raw answers and one heatmap per arm.
    files = git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
    base = f"records/{record['run_id']}"
    assert {f"{base}/record.json", f"{base}/details/arm-A.json.gz", f"{base}/details/arm-B.json.gz",
            f"{base}/needles-A.png", f"{base}/needles-B.png"} <= set(files)
    assert git(repo, "tag", "--list", "eval/*") == record["tag"]
    assert record["evidence"]["kernels_sha256"] and record["evidence"]["served_config"]["dsv4_context_length"] == CTX
    # What the arms ran with, of the keys that decide with the flag under test (docs/quality.md).
    assert record["evidence"]["ran_with"] == {"dsv4_fp4_indexer": False}
    listed = dsv4kit("records", "list", "--results-repo", str(repo), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [record["run_id"]]
    shown = dsv4kit("records", "show", record["run_id"], "--results-repo", str(repo))
    assert shown.returncode == 0, shown.stderr
    assert "needles" in shown.stdout and "outcome: PASS" in shown.stdout and "A/B: SGLANG_SM120_TRITON_INDEXER" in shown.stdout
    # each arm's GPUs over its checks, and what said so (the box's DCGM exporter; no nvidia-smi here)
    telemetry = record["arms"]["B"]["gpu_telemetry"]
    assert telemetry["gpu_throttle"]["passed"] and telemetry["gpu_throttle"]["sources"] == ["dcgm-exporter"], telemetry
    assert "nvidia-smi not found on PATH" in telemetry["unanswered"]["nvidia-smi"], telemetry
    assert "GPU telemetry (dcgm-exporter (127.0.0.1:" in shown.stdout and "8 GPUs" in shown.stdout, shown.stdout
    # A later run whose arm B lost its long-context sight, compared with this one, arm by arm.
    later, _ = _eval(server, inventory, repo, tasks, fault={"blind_after_tokens": 3000})
    compared = dsv4kit("records", "compare", f"{record['run_id']}@B", f"{later.record['run_id']}@B",
                       "--results-repo", str(repo))
    assert compared.returncode == 1 and "needles" in compared.stdout and "FAIL" in compared.stdout, compared.stdout
    same = dsv4kit("records", "compare", f"{record['run_id']}@A", f"{later.record['run_id']}@A", "--results-repo", str(repo))
    assert same.returncode == 0 and "outcome: PASS" in same.stdout, same.stdout + same.stderr
    unnamed = dsv4kit("records", "compare", record["run_id"], later.record["run_id"], "--results-repo", str(repo))
    assert unnamed.returncode == 2 and "name one arm" in unnamed.stdout + unnamed.stderr


@pytest.mark.parametrize("fault, failing, holding", [
    ({"blind_after_tokens": 3000}, "needles", "logprob_kl"),
    ({"kl_drift": 0.4}, "logprob_kl", "arm_agreement"),
    ({"flip_questions": ["What is 1", "What is 2", "What is 3", "What is 4", "What is 5", "What is 6",
                         "What is 7", "What is 8"]}, "tasks", "needles"),
    ({"nan_once": True}, "logprob_kl", "needles"),
], ids=["blind-past-N", "logprob-drift", "flipped-answers", "nan"])
def test_each_broken_arm_fails_the_gate(eval_box, fault, failing, holding):
    server, inventory, tasks, repo = eval_box
    outcome, _ = _eval(server, inventory, repo, tasks, fault=fault)
    record = outcome.record
    assert record["outcome"] == "fail" and outcome.exit_code == 1
    assert _check(record, failing)["outcome"] == "fail", _check(record, failing)
    assert _check(record, holding)["outcome"] == "pass", _check(record, holding)
    if "kl_drift" in fault:  # greedy text unchanged: only the logprobs tell
        assert _check(record, "arm_agreement")["identical"] == _check(record, "arm_agreement")["prompts"]
    if "blind_after_tokens" in fault:
        lost = _check(record, "needles")["lost"]
        assert lost and all(n["context"] == CTX and n["depth"] * CTX > 3000 for n in lost)
    if "flip_questions" in fault:
        assert _check(record, "tasks")["mcnemar_p"] < 0.05 and not _check(record, "tasks")["gained"]


def test_bad_input_and_a_server_without_logprobs_fail_early_and_clearly(eval_box, tmp_path):
    server, inventory, tasks, repo = eval_box
    bad = tmp_path / "bad.jsonl"
    lines = tasks.read_text().splitlines()
    lines[3] = '{"question": "What is 1 plus 1?", "answer": "two"}'
    bad.write_text("\n".join(lines) + "\n")
    result = dsv4kit("eval", "-i", str(inventory), "--tasks", str(bad), "--results-repo", str(repo), "--json")
    assert result.returncode == 2 and f"{bad}:4" in result.stderr and "####" in result.stderr
    assert "Traceback" not in result.stderr
    result = dsv4kit("eval", "-i", str(inventory), "--ctx", str(2 * CTX), "--tasks", str(tasks), "--results-repo", str(repo))
    assert result.returncode == 2 and str(2 * CTX) in result.stderr
    server.post("/_test/config", {"model": {"no_logprobs": True}})
    result = dsv4kit("eval", "-i", str(inventory), "--quick", "--tasks", str(tasks), "--results-repo", str(repo))
    assert result.returncode == 5 and "logprob" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not repo.exists() or not git(repo, "tag", "--list", "eval/*")


def test_a_context_above_the_served_one_is_refused_before_any_check(bench_box, tmp_path):
    # The inventory says 16K; the server serves 8K: found by the probe, before any long work.
    server, inventory = bench_box(context_length=CTX, inventory_context_length=2 * CTX)
    tasks = make_tasks(tmp_path / "tasks.jsonl", n=10)
    result = dsv4kit("eval", "-i", str(inventory), "--ctx", str(2 * CTX), "--tasks", str(tasks),
                     "--results-repo", str(tmp_path / "results"))
    assert result.returncode == 2, result.stderr
    assert f"above the context length the server serves ({CTX})" in result.stderr
    assert server.stats()["generate_count"] == 1  # the probe's one tiny request, nothing more


def test_an_unreachable_box_is_exit_3(loopback_ssh, tmp_path):
    import socket

    from tests.remote_inventory import write_inventory

    with socket.socket() as probe:  # a port that nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=closed, dsv4_model_path="/models/x",
                                dsv4_router_port=30000, dsv4_context_length=CTX)
    tasks = make_tasks(tmp_path / "tasks.jsonl", n=10)
    result = dsv4kit("eval", "-i", str(inventory), "--tasks", str(tasks), "--results-repo", str(tmp_path / "r"))
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr


def test_the_stand_in_speaks_sglangs_logprob_shapes():
    """What tests/fake_model.py writes, checked against the 0.5.23 source it copies: triples without
    text, the first input position's logprob null."""
    from tests.sglang_wheel import sglang_site

    managers = sglang_site() / "sglang" / "srt" / "managers"
    assert "(logprob, token_id, None)" in (managers / "tokenizer_manager.py").read_text()
    assert "[None] + input_token_logprobs[:-1]" in (managers / "scheduler_components" /
                                                     "logprob_result_processor.py").read_text()
