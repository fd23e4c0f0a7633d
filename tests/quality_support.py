"""Test support for ``dsv4kit eval``: a small generated task set in GSM8K's JSONL format.

No third-party data: items are arithmetic questions the stand-in model (tests/fake_model.py)
can answer, written in GSM8K's shape (``answer`` ends ``#### N``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TASK_WORDS = "What is plus minus times ?"


def make_tasks(path: Path, n: int = 30, seed: int = 7) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randrange(2, 90), rng.randrange(2, 30)
        op = rng.choice(("plus", "minus", "times"))
        result = {"plus": a + b, "minus": a - b, "times": a * b}[op]
        lines.append(json.dumps({"question": f"What is {a} {op} {b}?", "answer": f"{a} {op} {b} is {result}. #### {result}"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def quality_record(host, flag: str, *, gpu: str, driver: str, outcome: str = "pass", ctx: int | None = None,
                   checks=("logprob_kl", "arm_agreement", "needles", "tasks", "api"), when: str = "20261201T130000Z-aaaaaa",
                   arm_flags: dict | None = None, **evidence) -> dict:
    """An eval record of ``--ab FLAG=0,1`` on ``host`` (an inventory Host) with the product's own
    evidence fields (served configuration, kernels digest), as ``dsv4kit eval`` writes it.
    ``arm_flags``: the kernel flags the arms' servers ran (default: the inventory's; the flag under
    test is each arm's own value)."""
    from dsv4kit.records import eval_record
    from dsv4kit.records.record import sha256_json
    from dsv4kit.validation.verdict_run import kernels_digest

    setting = flag in eval_record.SETTING_KEYS  # an inventory setting's A/B: arms false/true, left out of the fingerprint
    served = eval_record.served_config(host, without_var=flag if setting else None)
    # What the arms ran with, as the servers would have it: the inventory's value where it is literal.
    from dsv4kit.records import quality_evidence as qe

    if qe.FP4_SETTING in qe.coupled(flag):
        evidence.setdefault("ran_with", {qe.FP4_SETTING: qe.normalise(qe.FP4_SETTING, host.get(qe.FP4_SETTING))})
    ran_flags = dict(host.get("dsv4_kernel_flags") or {}) if arm_flags is None else dict(arm_flags)
    arms = {arm: {"software": {"kernel_flags": {**ran_flags, **({} if setting else {flag: value})}}}
            for arm, value in (("A", "0"), ("B", "1"))}
    record = {
        "schema_version": eval_record.SCHEMA_VERSION, "kind": eval_record.KIND,
        "run_id": f"{host.name}-eval-ctx{ctx or host.get('dsv4_context_length')}-{when}",
        "tag": f"eval/{host.name}/{ctx or host.get('dsv4_context_length')}/{when}", "created_at_utc": when,
        "host": {"name": host.name}, "gpus": {"model": gpu, "driver": driver},
        "eval": {"context_length": ctx or host.get("dsv4_context_length"), "thresholds": {}},
        "ab": {"key": flag, "kind": "setting" if setting else "env",
               "values": {"A": "false", "B": "true"} if setting else {"A": "0", "B": "1"}},
        "arms": arms, "outcome": outcome,
        "checks": [{"check": c, "outcome": outcome if i == 0 else "pass", "why": f"{c} {outcome}"}
                   for i, c in enumerate(checks)],
        "evidence": {"kernels_sha256": kernels_digest(), "served_config": served,
                     "served_config_sha256": sha256_json(served), "gpu_model": gpu, "driver": driver, **evidence},
        "comparability_key": {}, "notes": [],
    }
    return record


def keep_quality(repo: Path, record: dict) -> None:
    from dsv4kit.records import results_repo
    from dsv4kit.records.record import dumps

    results_repo.publish(repo, run_id=record["run_id"], tag=record["tag"],
                         files={f"records/{record['run_id']}/record.json": dumps(record).encode()},
                         message=f"eval {record['run_id']}")
