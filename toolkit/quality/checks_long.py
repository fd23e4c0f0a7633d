"""Judging the long set: decode against re-prefill and arm against arm past the indexer's
threshold, degenerate repetition in every output, and the task sets asked after a long context or
sampled (docs/quality.md, *What the defaults ask*).

The long set is judged on its own, never averaged into the short set: a kernel that is read only
past the threshold (the DSA indexer, docs/sglang-contract.md §2.6) shows nowhere else.
"""

from __future__ import annotations

from typing import Iterator, Optional

from dsv4kit.quality.stats import approx_kl, finite, topk_agreement
from dsv4kit.quality.topk_rule import topk_bound_problem, topk_reprefill_of

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
#: A loop: the output's last tokens repeat with a period of at most this many tokens ...
MAX_PERIOD = 256
#: ... over at least this many tokens and this share of the output.
MIN_LOOP_TOKENS = 128
MIN_LOOP_SHARE = 0.2


def _worst(outcomes) -> str:
    rank = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2}
    return max(outcomes, key=rank.__getitem__, default=INCONCLUSIVE)


# ------------------------------------------------------------------------------ degeneration
def degenerate(ids, max_period: int = MAX_PERIOD, min_tokens: int = MIN_LOOP_TOKENS,
               min_share: float = MIN_LOOP_SHARE) -> Optional[dict]:
    """``{"period", "tokens"}`` when the output ends in an exact loop: its last ``tokens`` tokens
    repeat with ``period`` (at least three periods, ``min_tokens`` and ``min_share`` of the
    output); else None."""
    n = len(ids)
    need = max(min_tokens, int(min_share * n))
    if n < need:
        return None
    for period in range(1, min(max_period, n // 3) + 1):
        run = 0
        for i in range(n - 1, period - 1, -1):
            if ids[i] != ids[i - period]:
                break
            run += 1
        tokens = run + period
        if tokens >= max(need, 3 * period):
            return {"period": period, "tokens": tokens}
    return None


def outputs(result: dict) -> Iterator[tuple[str, str, list, bool]]:
    """Every output of one arm: (check, which, output ids, prompted). ``prompted`` is False for
    continuations of filler prose forced with ``ignore_eos``, where a loop is the prose's own."""
    checks = result.get("checks") or {}
    for s in (checks.get("logprob") or {}).get("samples") or []:
        yield "logprob", f"sample {s['index']}", s.get("output_ids") or [], False
    for cell in (checks.get("needles") or {}).get("cells") or []:
        for n in cell["needles"]:
            yield "needles", f"{n['label']} at {cell['context']}", n.get("output_ids") or [], True
    for s in (checks.get("long") or {}).get("samples") or []:
        yield "long", f"{s['kind']} {s['index']}", s.get("output_ids") or [], s["kind"] == "generation"
    for name in ("tasks", "tasks_long", "tasks_sampled"):
        for item in (checks.get(name) or {}).get("items") or []:
            yield name, f"line {item['line']}", item.get("output_ids") or [], True
    for r in (checks.get("batch") or {}).get("requests") or []:
        for side in ("alone", "mixed"):
            yield "batch", f"request {r['index']} {side}", r[side].get("output_ids") or [], False


def degeneration_check(arms: dict) -> dict:
    """A loop in a prompted answer fails alone; with ``--ab``, a loop in arm B where arm A has none
    fails (the same loop in both arms is the model's, not the kernel's)."""
    found = {arm: {(c, w): dict(d, check=c, output=w) for c, w, ids, prompted in outputs(r)
                   if (d := degenerate(ids)) is not None and (prompted or "B" in arms)}
             for arm, r in arms.items()}
    counted = {arm: sum(1 for _ in outputs(r)) for arm, r in arms.items()}
    numbers = {"outputs": counted, "degenerate": {arm: list(v.values())[:10] for arm, v in found.items()},
               "max_period": MAX_PERIOD, "min_loop_tokens": MIN_LOOP_TOKENS}
    if "B" in arms:
        new = [v for k, v in found["B"].items() if k not in found["A"]]
        if new:
            where = ", ".join(f"{v['check']} {v['output']} (period {v['period']})" for v in new[:5])
            return {"check": "degeneration", "outcome": FAIL, "why": f"arm B loops where arm A does not: {where}",
                    **numbers}
        return {"check": "degeneration", "outcome": PASS, **numbers,
                "why": f"no loop in arm B that arm A lacks ({counted['B']} outputs)"}
    if found["A"]:
        where = ", ".join(f"{v['check']} {v['output']} (period {v['period']})" for v in list(found["A"].values())[:5])
        return {"check": "degeneration", "outcome": FAIL, "why": f"answers that loop: {where}", **numbers}
    return {"check": "degeneration", "outcome": PASS, "why": f"no answer loops ({counted['A']} outputs)", **numbers}


# ------------------------------------------------------------------------------ the long set
def long_numbers(result: dict, t) -> dict:
    long = (result.get("checks") or {}).get("long") or {}
    threshold = long.get("threshold_tokens")
    per, nan, tokens, reaching = [], [], 0, []
    for s in long.get("samples") or []:
        out, pre = s.get("output_logprobs") or [], s.get("reprefill_logprobs") or []
        value = approx_kl(pre, out) if out and all(finite(v) for v in out) else None
        if value is None:
            nan.append(s["index"])
            continue
        per.append(value)
        tokens += len(out)
        if threshold is not None and s["max_position"] > threshold:
            reaching.append(s["index"])
    samples = long.get("samples") or []
    return {"samples": len(samples), "threshold_tokens": threshold, "reaching_threshold": len(reaching),
            "max_position": max((s["max_position"] for s in samples), default=0),
            "prompt_tokens": sorted({s["prompt_tokens"] for s in samples}),
            "kl_mean": (sum(per) / len(per)) if per else None, "kl_max": max(per) if per else None,
            "tokens": tokens, "nan_samples": nan, "topk": topk_reprefill_of(result, t, "long")}


def _long_verdict(n: dict, t) -> tuple[str, str]:
    if n["nan_samples"]:
        return FAIL, f"NaN or missing logprobs on long sample(s) {n['nan_samples']}"
    if not n["reaching_threshold"]:
        return INCONCLUSIVE, (f"no sample passed the indexer's threshold ({n['threshold_tokens']} tokens; the "
                              f"furthest reached {n['max_position']})")
    if n["tokens"] < t.min_kl_tokens:
        return INCONCLUSIVE, f"{n['tokens']} tokens compared, fewer than {t.min_kl_tokens}"
    if n["kl_mean"] > t.max_kl:
        return FAIL, f"mean KL {n['kl_mean']:.2e} > {t.max_kl:.1e} past {n['threshold_tokens']} tokens"
    problem = topk_bound_problem(n["topk"], t)
    if problem:
        return FAIL, f"{problem}, decode against re-prefill past {n['threshold_tokens']} tokens"
    return PASS, (f"mean KL {n['kl_mean']:.2e} <= {t.max_kl:.1e} over {n['tokens']} tokens of {n['reaching_threshold']} "
                  f"sample(s) past {n['threshold_tokens']} tokens (furthest {n['max_position']})")


def long_kl_check(arms: dict, t) -> dict:
    per_arm = {arm: long_numbers(r, t) for arm, r in arms.items()}
    verdicts = {arm: _long_verdict(n, t) for arm, n in per_arm.items()}
    if "B" in arms and verdicts["A"][0] == verdicts["B"][0] == FAIL and not per_arm["B"]["nan_samples"]:
        outcome, why = INCONCLUSIVE, (f"both arms fail (A: {verdicts['A'][1]}; B: {verdicts['B'][1]}): the "
                                      f"threshold does not fit this box's stock path")
    else:
        outcome = _worst(v[0] for v in verdicts.values())
        why = "; ".join(f"{arm}: {v[1]}" for arm, v in verdicts.items())
    return {"check": "logprob_kl_long", "outcome": outcome, "why": why, "per_arm": per_arm}


def long_agreement_check(arms: dict) -> dict:
    """Arm B against arm A on the long samples, by the short set's rule (stats.topk_agreement)."""
    a = {s["index"]: s for s in arms["A"]["checks"]["long"]["samples"]}
    b = {s["index"]: s for s in arms["B"]["checks"]["long"]["samples"]}
    rows = []
    for index in sorted(set(a) & set(b)):
        row = topk_agreement(a[index]["output_ids"], a[index]["output_top"], b[index]["output_ids"], b[index]["output_top"])
        rows.append({"index": index, "kind": a[index]["kind"], "max_position": a[index]["max_position"], **row})
    broken = [r["index"] for r in rows if not r["contained"]]
    numbers = {"samples": len(rows), "identical": sum(1 for r in rows if r["first_divergence"] is None),
               "first_divergence": {r["index"]: r["first_divergence"] for r in rows if r["first_divergence"] is not None},
               "not_contained": broken}
    if not rows:
        return {"check": "arm_agreement_long", "outcome": INCONCLUSIVE, "why": "no long sample in both arms", **numbers}
    if broken:
        return {"check": "arm_agreement_long", "outcome": FAIL, **numbers,
                "why": f"on long sample(s) {broken} an arm's greedy token is outside the other arm's top-k"}
    return {"check": "arm_agreement_long", "outcome": PASS, **numbers,
            "why": f"{numbers['identical']} of {len(rows)} long outputs identical; every token up to the first "
                   f"divergence is in the other arm's top-k"}


# ------------------------------------------------------------------------------ task sets
def task_set_check(arms: dict, t, key: str, task_check) -> dict:
    """``tasks_long`` / ``tasks_sampled`` by the rule of ``tasks`` (alone: the accuracy floor; with
    ``--ab``: exact McNemar), reported on their own; ``task_check`` is ``checks.task_check``."""

    view = {arm: {"checks": {"tasks": r["checks"][key]}} for arm, r in arms.items()}
    result = task_check(view, t)
    items = [i for r in arms.values() for i in r["checks"][key].get("items") or []]
    lengths = [i.get("prompt_tokens") for i in items if isinstance(i.get("prompt_tokens"), int)]
    return {**result, "check": key, "sampling": arms["A"]["checks"][key].get("sampling"),
            "prompt_tokens": [min(lengths), max(lengths)] if lengths else None}
