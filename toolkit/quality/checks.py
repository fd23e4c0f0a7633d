"""Judging what the box answered: each check passes, fails or is inconclusive (docs/quality.md).

``judge(arms, thresholds)`` takes ``{"A": box_eval result, "B": ...}`` (one arm without ``--ab``)
and returns the checks in order, each ``{"check", "outcome", "why", ...numbers}``; ``outcome``
of the whole eval is the worst of them (fail > inconclusive > pass). Why each threshold is what
it is: docs/quality.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from dsv4kit.quality.stats import approx_kl, finite, mcnemar_exact, topk_agreement, wilson

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
_RANK = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2}


@dataclass(frozen=True)
class Thresholds:
    #: Mean approximate KL of decode against re-prefill, per arm (SGLang's KL kits' order of size).
    max_kl: float = 0.005
    #: Fewer generated tokens than this compared in the KL check: inconclusive.
    min_kl_tokens: int = 256
    #: A served configuration alone: the share of needles found.
    min_needle_score: float = 0.95
    #: A served configuration alone: task accuracy (GSM8K 5-shot; public V4-Flash runs score ~0.95).
    min_task_accuracy: float = 0.90
    #: A/B tasks: B loses significantly at this level of the exact McNemar test: fail.
    alpha: float = 0.05
    #: A/B tasks: B may lose this share of items net (losses - gains) and pass; more, not
    #: significant: inconclusive.
    max_net_task_loss: float = 0.01

    def to_dict(self) -> dict:
        return asdict(self)


def worst(outcomes) -> str:
    outcomes = list(outcomes)
    return max(outcomes, key=_RANK.__getitem__) if outcomes else INCONCLUSIVE


# ------------------------------------------------------------------------------ per arm
def kl_of(result: dict) -> dict:
    """One arm's decode-against-re-prefill numbers: per-sample KL, the mean, NaN samples."""
    samples = ((result.get("checks") or {}).get("logprob") or {}).get("samples") or []
    per, nan, tokens = [], [], 0
    for s in samples:
        out, pre = s.get("output_logprobs") or [], s.get("reprefill_logprobs") or []
        if not out or not all(finite(v) for v in out) or not all(finite(v) for v in pre):
            nan.append(s["index"])
            continue
        value = approx_kl(pre, out)
        if value is None:
            nan.append(s["index"])
            continue
        per.append(value)
        tokens += len(out)
    return {"samples": len(samples), "kl_mean": (sum(per) / len(per)) if per else None,
            "kl_max": max(per) if per else None, "tokens": tokens, "nan_samples": nan}


def _kl_verdict(numbers: dict, t: Thresholds) -> tuple[str, str]:
    if numbers["nan_samples"]:
        return FAIL, f"NaN or missing logprobs on prompt(s) {numbers['nan_samples']}"
    if numbers["kl_mean"] is None or numbers["tokens"] < t.min_kl_tokens:
        return INCONCLUSIVE, f"{numbers['tokens']} tokens compared, fewer than {t.min_kl_tokens}"
    if numbers["kl_mean"] > t.max_kl:
        return FAIL, f"mean KL {numbers['kl_mean']:.2e} > {t.max_kl:.1e}"
    return PASS, f"mean KL {numbers['kl_mean']:.2e} <= {t.max_kl:.1e} over {numbers['tokens']} tokens"


def needle_table(result: dict) -> dict:
    """``{"found", "total", "score", "cells": {"<context>": {"<depth>": [found, total]}}}``."""
    cells: dict = {}
    found = total = 0
    for cell in ((result.get("checks") or {}).get("needles") or {}).get("cells") or []:
        for needle in cell["needles"]:
            slot = cells.setdefault(str(cell["context"]), {}).setdefault(f"{needle['depth']:g}", [0, 0])
            slot[0] += bool(needle["found"])
            slot[1] += 1
            found += bool(needle["found"])
            total += 1
    return {"found": found, "total": total, "score": (found / total) if total else None, "cells": cells}


def task_numbers(result: dict) -> dict:
    items = ((result.get("checks") or {}).get("tasks") or {}).get("items") or []
    right = sum(1 for i in items if i["correct"])
    interval = wilson(right, len(items))
    return {"n": len(items), "correct": right, "accuracy": (right / len(items)) if items else None,
            "wilson95": list(interval) if interval else None,
            "invalid": sum(1 for i in items if i["pred"] is None)}


# ------------------------------------------------------------------------------ the checks
def _has(arms: dict, check: str) -> bool:
    return all(check in (r.get("checks") or {}) for r in arms.values())


def logprob_check(arms: dict, t: Thresholds) -> dict:
    per_arm = {arm: kl_of(r) for arm, r in arms.items()}
    verdicts = {arm: _kl_verdict(n, t) for arm, n in per_arm.items()}
    if "B" not in arms:
        outcome, why = verdicts["A"]
    elif verdicts["B"][0] == FAIL and verdicts["A"][0] == FAIL and not per_arm["B"]["nan_samples"]:
        outcome, why = INCONCLUSIVE, (f"both arms exceed the KL threshold (A: {verdicts['A'][1]}; B: "
                                      f"{verdicts['B'][1]}): the threshold does not fit this box's stock path")
    else:
        outcome = worst(v[0] for v in verdicts.values())
        why = "; ".join(f"{arm}: {v[1]}" for arm, v in verdicts.items())
    return {"check": "logprob_kl", "outcome": outcome, "why": why, "per_arm": per_arm}


def agreement_check(arms: dict) -> dict:
    """Arm B against arm A on the same greedy prompts (the logprob check's decodes)."""
    a = {s["index"]: s for s in arms["A"]["checks"]["logprob"]["samples"]}
    b = {s["index"]: s for s in arms["B"]["checks"]["logprob"]["samples"]}
    rows, compared, agree, positions = [], 0, 0, 0
    for index in sorted(set(a) & set(b)):
        row = topk_agreement(a[index]["output_ids"], a[index]["output_top"], b[index]["output_ids"],
                             b[index]["output_top"])
        rows.append({"index": index, **row})
        compared += row["compared"]
        agree += row["agree"]
        positions += min(len(a[index]["output_ids"]), len(b[index]["output_ids"]))
    broken = [r["index"] for r in rows if not r["contained"]]
    diverged = [r for r in rows if r["first_divergence"] is not None]
    numbers = {"prompts": len(rows), "identical": len(rows) - len(diverged),
               "top1_agreement": (agree / compared) if compared else None,
               "first_divergence": sorted(r["first_divergence"] for r in diverged), "not_contained": broken,
               "top_k": max((len(p) for s in b.values() for p in s["output_top"] if p), default=None)}
    if not rows:
        return {"check": "arm_agreement", "outcome": INCONCLUSIVE, "why": "no prompt in both arms", **numbers}
    if broken:
        return {"check": "arm_agreement", "outcome": FAIL, **numbers,
                "why": f"on prompt(s) {broken} an arm's greedy token is outside the other arm's top-{numbers['top_k']}"}
    return {"check": "arm_agreement", "outcome": PASS, **numbers,
            "why": f"{numbers['identical']} of {len(rows)} outputs identical; every token up to the first "
                   f"divergence is in the other arm's top-{numbers['top_k']}"}


def needle_check(arms: dict, t: Thresholds) -> dict:
    tables = {arm: needle_table(r) for arm, r in arms.items()}
    if "B" not in arms:
        score = tables["A"]["score"]
        if score is None:
            return {"check": "needles", "outcome": INCONCLUSIVE, "why": "no needle was asked", "per_arm": tables}
        outcome = PASS if score >= t.min_needle_score else FAIL
        return {"check": "needles", "outcome": outcome, "per_arm": tables,
                "why": f"{tables['A']['found']}/{tables['A']['total']} found "
                       f"({'>=' if outcome == PASS else '<'} {t.min_needle_score:.0%})"}
    lost, gained = _needle_flips(arms)
    outcome = FAIL if lost else PASS
    where = ", ".join(f"{n['label']} at depth {n['depth']:g} of {n['context']}" for n in lost[:6])
    why = (f"arm B lost {len(lost)} needle(s) arm A found: {where}" if lost else
           f"arm B found every needle arm A found ({tables['B']['found']}/{tables['B']['total']}, "
           f"A {tables['A']['found']}/{tables['A']['total']})")
    return {"check": "needles", "outcome": outcome, "why": why, "per_arm": tables,
            "lost": lost, "gained": gained}


def _needle_flips(arms: dict) -> tuple[list, list]:
    def found(result):
        return {(c["context"], c["variant"], n["label"]): (n, bool(n["found"]))
                for c in result["checks"]["needles"]["cells"] for n in c["needles"]}

    a, b = found(arms["A"]), found(arms["B"])
    lost, gained = [], []
    for key in sorted(set(a) & set(b), key=str):
        needle = {"context": key[0], "variant": key[1], "label": key[2], "depth": a[key][0]["depth"]}
        if a[key][1] and not b[key][1]:
            lost.append(needle)
        elif b[key][1] and not a[key][1]:
            gained.append(needle)
    return lost, gained


def task_check(arms: dict, t: Thresholds) -> dict:
    per_arm = {arm: task_numbers(r) for arm, r in arms.items()}
    if "B" not in arms:
        n = per_arm["A"]
        if not n["n"]:
            return {"check": "tasks", "outcome": INCONCLUSIVE, "why": "no task item was asked", "per_arm": per_arm}
        low, high = n["wilson95"]
        outcome = PASS if n["accuracy"] >= t.min_task_accuracy else (FAIL if high < t.min_task_accuracy
                                                                   else INCONCLUSIVE)
        return {"check": "tasks", "outcome": outcome, "per_arm": per_arm,
                "why": f"accuracy {n['accuracy']:.3f} (95% {low:.3f}-{high:.3f}) against {t.min_task_accuracy:.2f}"}
    a = {i["line"]: i["correct"] for i in arms["A"]["checks"]["tasks"]["items"]}
    b = {i["line"]: i["correct"] for i in arms["B"]["checks"]["tasks"]["items"]}
    lines = sorted(set(a) & set(b))
    lost = [line for line in lines if a[line] and not b[line]]
    gained = [line for line in lines if b[line] and not a[line]]
    p = mcnemar_exact(len(lost), len(gained))
    net = (len(lost) - len(gained)) / len(lines) if lines else 0.0
    numbers = {"per_arm": per_arm, "paired": len(lines), "lost": lost, "gained": gained, "mcnemar_p": p,
               "net_loss": net}
    flips = f"B wrong where A right on {len(lost)} item(s), right where A wrong on {len(gained)}; McNemar p={p:.3g}"
    if not lines:
        return {"check": "tasks", "outcome": INCONCLUSIVE, "why": "no task item in both arms", **numbers}
    if len(lost) > len(gained) and p < t.alpha:
        return {"check": "tasks", "outcome": FAIL, "why": f"{flips} < {t.alpha}", **numbers}
    if net <= t.max_net_task_loss:
        return {"check": "tasks", "outcome": PASS, "why": f"{flips}; net loss {net:.1%} <= {t.max_net_task_loss:.0%}",
                **numbers}
    return {"check": "tasks", "outcome": INCONCLUSIVE,
            "why": f"{flips}; net loss {net:.1%} > {t.max_net_task_loss:.0%} but not significant: run more items",
            **numbers}


def judge(arms: dict, t: Thresholds, served_names=()) -> tuple[str, list[dict]]:
    """(outcome, checks) for the arms' results; only checks every arm ran are judged."""
    checks = []
    if _has(arms, "logprob"):
        checks.append(logprob_check(arms, t))
        if "B" in arms:
            checks.append(agreement_check(arms))
    if _has(arms, "needles"):
        checks.append(needle_check(arms, t))
    if _has(arms, "tasks"):
        checks.append(task_check(arms, t))
    if _has(arms, "api"):
        from dsv4kit.quality.api_check import api_check

        checks.append(api_check(arms, served_names, t.alpha))
    return worst(c["outcome"] for c in checks), checks


def outcome_exit_code(outcome: Optional[str]) -> int:
    from dsv4kit.core import exitcodes

    return {PASS: exitcodes.OK, FAIL: exitcodes.CHECK_FAILED}.get(outcome, exitcodes.INCONCLUSIVE)
