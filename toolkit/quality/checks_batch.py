"""Judging the batch mix and the logprobs of every answer (docs/quality.md).

* ``batch_mix``: each short request run at the serving concurrency beside long prefills must give
  the answer it gave alone; a divergence counts only at a near-tie (the alone run's logprobs of
  the two tokens within ``near_tie_nats``). No request in flight beside a long prefill: inconclusive.

Every request asks for logprobs with top-k, and the box's ledger counts null, non-finite and missing
ones over all of them; ``logprob_validity`` (``checks.validity_check``) judges those counts with the
recorded answers, under one rule (``box_eval.finite``).
"""

from __future__ import annotations

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
#: A greedy divergence between two runs of one request is a near-tie when the first run's
#: logprobs of the two tokens differ by at most this much.
NEAR_TIE_NATS = 0.3


def _overlaps(span, others) -> bool:
    return any(span[0] < o[1] and o[0] < span[1] for o in others)


def divergence(alone: dict, mixed: dict) -> dict:
    """Where the mixed run's greedy output first leaves the alone run's, and the alone run's
    logprob gap between the two tokens there (None: the mixed token is outside its top-k)."""
    a, m = alone["output_ids"], mixed["output_ids"]
    n = min(len(a), len(m))
    first = next((i for i in range(n) if a[i] != m[i]), None)
    if first is None:
        return {"first": None if len(a) == len(m) else n, "gap": None if len(a) != len(m) else 0.0}
    top = {e[1]: e[0] for e in (alone["output_top"][first] if first < len(alone["output_top"]) else []) or []}
    gap = (top[a[first]] - top[m[first]]) if a[first] in top and m[first] in top else None
    return {"first": first, "gap": gap}


def batch_numbers(result: dict, near_tie: float) -> dict:
    batch = (result.get("checks") or {}).get("batch") or {}
    longs = [x["span"] for x in batch.get("long") or []]
    rows = []
    for r in batch.get("requests") or []:
        d = divergence(r["alone"], r["mixed"])
        rows.append({"index": r["index"], "beside_long": _overlaps(r["mixed"]["span"], longs), **d,
                     "near_tie": d["first"] is None or (d["gap"] is not None and abs(d["gap"]) <= near_tie)})
    return {"requests": len(rows), "concurrency": batch.get("concurrency"),
            "long_prefills": [x["prompt_tokens"] for x in batch.get("long") or []],
            "beside_long": sum(1 for r in rows if r["beside_long"]),
            "identical": sum(1 for r in rows if r["first"] is None),
            "broken": [{"index": r["index"], "first": r["first"], "gap": r["gap"]} for r in rows if not r["near_tie"]]}


def batch_check(arms: dict, t) -> dict:
    near_tie = getattr(t, "near_tie_nats", NEAR_TIE_NATS)
    per_arm = {arm: batch_numbers(r, near_tie) for arm, r in arms.items()}
    verdicts = {}
    for arm, n in per_arm.items():
        if n["broken"]:
            where = ", ".join(f"request {b['index']} at token {b['first']}" + (f" (gap {b['gap']:.2f} nats)"
                              if b["gap"] is not None else " (outside the top-k)") for b in n["broken"][:5])
            verdicts[arm] = (FAIL, f"{len(n['broken'])} answer(s) changed beside long prefills beyond a near-tie "
                                   f"({near_tie} nats): {where}")
        elif not n["beside_long"]:
            verdicts[arm] = (INCONCLUSIVE, "no request was in flight beside a long prefill")
        else:
            verdicts[arm] = (PASS, f"{n['requests']} answers at concurrency {n['concurrency']} ({n['beside_long']} beside "
                                   f"long prefills of {n['long_prefills']} tokens) match the same requests alone, "
                                   f"{n['identical']} identical, the rest diverging at near-ties")
    rank = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2}
    outcome = max((v[0] for v in verdicts.values()), key=rank.__getitem__)
    return {"check": "batch_mix", "outcome": outcome, "near_tie_nats": near_tie, "per_arm": per_arm,
            "why": "; ".join(f"{arm}: {v[1]}" for arm, v in verdicts.items())}


def judge_shapes(arms: dict, t, task_check) -> list[dict]:
    """The checks of the long set, the batch mix and the extra task sets,
    for whatever every arm ran (``checks.judge`` appends them, and hands in its ``task_check``)."""
    from dsv4kit.quality import checks_long

    def has(key):
        return all(key in (r.get("checks") or {}) for r in arms.values())

    out = []
    if has("long"):
        out.append(checks_long.long_kl_check(arms, t))
        if "B" in arms:
            out.append(checks_long.long_agreement_check(arms))
    for key in ("tasks_long", "tasks_sampled"):
        if has(key):
            out.append(checks_long.task_set_check(arms, t, key, task_check))
    if has("batch"):
        out.append(batch_check(arms, t))
    if all(r.get("checks") for r in arms.values()):
        out.append(checks_long.degeneration_check(arms))
    return out
