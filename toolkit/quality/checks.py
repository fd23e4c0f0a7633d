"""Judging what the box answered: each check passes, fails or is inconclusive (docs/quality.md).

``judge(arms, thresholds)`` takes ``{"A": box_eval result, "B": ...}`` (one arm without ``--ab``)
and returns the checks in order, each ``{"check", "outcome", "why", ...numbers}``; ``outcome``
of the whole eval is the worst of them (fail > inconclusive > pass). Why each threshold is what
it is: docs/quality.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Iterator, Optional

from dsv4kit.quality.checks_batch import judge_shapes
from dsv4kit.quality.topk_rule import topk_bound_problem, topk_reprefill_of
from dsv4kit.quality.stats import (approx_kl, finite, mcnemar_exact, tie_gap, topk_agreement, topk_distance,
                                   topk_problems, wilson)
from dsv4kit.records.task_floors import DEFAULT_MIN_ACCURACY, DEFAULT_MIN_ITEMS, floor_for

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
    #: Every arm's task accuracy: the floor of the task set (GSM8K 5-shot: SGLang's own release gate for
    #: DeepSeek-V4 is 0.95 on 200 items). Another set's floor: ``dsv4_eval_task_floors``.
    min_task_accuracy: float = DEFAULT_MIN_ACCURACY
    #: Fewer task items than this: the floor is not shown, and the record does not count for ``auto``.
    min_task_items: int = DEFAULT_MIN_ITEMS
    #: A/B tasks: B loses significantly at this level of the exact McNemar test: fail.
    alpha: float = 0.05
    #: A/B tasks: B may lose this share of items net (losses - gains) and pass; more, not
    #: significant: inconclusive.
    max_net_task_loss: float = 0.01
    #: A/B tasks: arm A is asked twice (the control); more than this share of items flipping between
    #: the two runs of one configuration: the box's own noise is too large to judge a kernel by.
    max_control_flip_rate: float = 0.05
    #: Top-k logprobs, decode against re-prefill and arm against arm: the mean over positions of the
    #: largest difference at a position, in nats.
    max_topk_mean_nats: float = 0.1
    #: Top-k logprobs, as above: the largest difference at any one position, in nats.
    max_topk_nats: float = 1.0
    #: Top-k entries below this logprob are not compared (a tail of a few percent or less).
    topk_floor_logprob: float = -4.0
    #: Two arms' greedy outputs may part only at a near-tie: both tokens within this gap in both arms.
    near_tie_nats: float = 0.25
    #: Rounding allowed in a top-k list (a logprob above 0, an inversion, a sum above 1) and between
    #: an emitted greedy token's logprob and the top-1's.
    logprob_slack: float = 1e-3
    #: The indexer reads its logits only past 512 c4 positions (docs/sglang-contract.md §2.6): a
    #: record none of whose requests is longer never ran the indexer kernel.
    indexer_threshold_tokens: int = 2048
    #: Speculative decoding: arm B's acceptance length at least this share of arm A's.
    min_acceptance_ratio: float = 0.95

    def to_dict(self) -> dict:
        return asdict(self)


def thresholds_markdown() -> str:
    """The table of docs/quality.md: each threshold, its default and its ``#:`` comment above."""
    import inspect

    rows, comment = [], []
    for line in inspect.getsource(Thresholds).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            comment.append(text[2:].strip())
        elif ":" in text and "=" in text and comment and not text.startswith(("def ", "return")):
            name = text.split(":")[0]
            rows.append(f"| `{name}` | {getattr(Thresholds(), name)!r} | {' '.join(comment)} |")
            comment = []
    return "\n".join(["| threshold | default | meaning |", "|---|---|---|", *rows]).replace("``", "`")


def task_floor(t: Thresholds, sha256: Optional[str], floors: Optional[dict]) -> Thresholds:
    """``t`` with the accuracy floor of the task set ``sha256`` (``dsv4kit.records.task_floors``)."""
    accuracy, items = floor_for(floors or {}, sha256)
    return replace(t, min_task_accuracy=accuracy, min_task_items=items)


def worst(outcomes) -> str:
    outcomes = list(outcomes)
    return max(outcomes, key=_RANK.__getitem__) if outcomes else INCONCLUSIVE


# ------------------------------------------------------------------------------ per arm
def kl_of(result: dict, source: str = "logprob") -> dict:
    """One arm's decode-against-re-prefill numbers: per-sample KL, the mean, NaN samples."""
    samples = ((result.get("checks") or {}).get(source) or {}).get("samples") or []
    per, nan, tokens, moved = [], [], 0, False
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
        moved = moved or any(p != d for p, d in zip(pre, out))
    return {"samples": len(samples), "kl_mean": (sum(per) / len(per)) if per else None,
            "kl_max": max(per) if per else None, "tokens": tokens, "nan_samples": nan,
            "identical": bool(per) and not moved}


def _kl_verdict(numbers: dict, t: Thresholds) -> tuple[str, str]:
    if numbers["nan_samples"]:
        return FAIL, f"NaN or missing logprobs on prompt(s) {numbers['nan_samples']}"
    if numbers["kl_mean"] is None or numbers["tokens"] < t.min_kl_tokens:
        return INCONCLUSIVE, f"{numbers['tokens']} tokens compared, fewer than {t.min_kl_tokens}"
    if numbers.get("identical"):
        return INCONCLUSIVE, (f"decode and re-prefill gave bit-identical logprobs on all {numbers['tokens']} tokens "
                              f"(KL exactly 0): two kernels never agree that well, so one side was not computed")
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


def logprob_check(arms: dict, t: Thresholds, source: str = "logprob", name: str = "logprob_kl") -> dict:
    """Decode against re-prefill, per arm, on the samples of the box check ``source`` (another
    set of samples in the same shape is judged on its own under its own ``name``)."""
    per_arm = {arm: kl_of(r, source) for arm, r in arms.items()}
    verdicts = {arm: _kl_verdict(n, t) for arm, n in per_arm.items()}
    if "B" not in arms:
        outcome, why = verdicts["A"]
    elif verdicts["B"][0] == FAIL and verdicts["A"][0] == FAIL and not per_arm["B"]["nan_samples"]:
        outcome, why = INCONCLUSIVE, (f"both arms exceed the KL threshold (A: {verdicts['A'][1]}; B: "
                                      f"{verdicts['B'][1]}): the threshold does not fit this box's stock path")
    else:
        outcome = worst(v[0] for v in verdicts.values())
        why = "; ".join(f"{arm}: {v[1]}" for arm, v in verdicts.items())
    return {"check": name, "outcome": outcome, "why": why, "per_arm": per_arm}


def agreement_check(arms: dict, t: Thresholds, source: str = "logprob", name: str = "arm_agreement") -> dict:
    """Arm B against arm A on the same greedy prompts (the logprob check's decodes): up to and
    including the first divergence, the two arms' top-k logprobs within the bounds in nats
    (``max_topk_mean_nats``, ``max_topk_nats``), and the divergence only at a near-tie: both
    tokens in both arms' top-k, within ``near_tie_nats`` of each other in each."""
    a = {s["index"]: s for s in arms["A"]["checks"][source]["samples"]}
    b = {s["index"]: s for s in arms["B"]["checks"][source]["samples"]}
    rows, compared, agree, distances, far, not_tie = [], 0, 0, [], [], []
    for index in sorted(set(a) & set(b)):
        sa, sb = a[index], b[index]
        row = topk_agreement(sa["output_ids"], sa["output_top"], sb["output_ids"], sb["output_top"])
        rows.append({"index": index, **row})
        compared += row["compared"]
        agree += row["agree"]
        for j in range(min(row["compared"], len(sa["output_top"]), len(sb["output_top"]))):
            d = topk_distance(sa["output_top"][j], sb["output_top"][j], t.topk_floor_logprob)
            if d is not None:
                distances.append(d)
                if d > t.max_topk_nats:
                    far.append({"index": index, "position": j, "nats": round(d, 4)})
        j = row["first_divergence"]
        if j is not None and j < min(len(sa["output_ids"]), len(sb["output_ids"])):
            ta, tb = sa["output_ids"][j], sb["output_ids"][j]
            gaps = [tie_gap(top[j] if j < len(top) else None, ta, tb) for top in (sa["output_top"], sb["output_top"])]
            if any(g is None or g > t.near_tie_nats for g in gaps):
                not_tie.append({"index": index, "position": j,
                                "gaps_nats": [None if g is None else round(g, 4) for g in gaps]})
    diverged = [r for r in rows if r["first_divergence"] is not None]
    mean = (sum(distances) / len(distances)) if distances else None
    numbers = {"prompts": len(rows), "identical": len(rows) - len(diverged),
               "top1_agreement": (agree / compared) if compared else None,
               "first_divergence": sorted(r["first_divergence"] for r in diverged),
               "not_contained": [r["index"] for r in rows if not r["contained"]], "not_near_tie": not_tie,
               "topk_positions": len(distances), "topk_mean_nats": mean,
               "topk_max_nats": max(distances) if distances else None, "topk_far": far[:10],
               "top_k": max((len(p) for s in b.values() for p in s["output_top"] if p), default=None)}
    check = name
    if not rows:
        return {"check": check, "outcome": INCONCLUSIVE, "why": "no prompt in both arms", **numbers}
    if not distances:
        return {"check": check, "outcome": INCONCLUSIVE, "why": "the arms returned no top-k logprobs to compare",
                **numbers}
    if not_tie:
        where = ", ".join(f"prompt {n['index']} position {n['position']} (gaps {n['gaps_nats']})" for n in not_tie[:5])
        return {"check": check, "outcome": FAIL, **numbers,
                "why": f"the arms' greedy outputs part where the two tokens are not a near-tie "
                       f"(within {t.near_tie_nats} nats in both arms' top-{numbers['top_k']}): {where}"}
    if far or mean > t.max_topk_mean_nats:
        return {"check": check, "outcome": FAIL, **numbers,
                "why": f"up to the first divergence the arms' top-k logprobs differ by {mean:.3f} nats on average "
                       f"(bound {t.max_topk_mean_nats}) and at most {numbers['topk_max_nats']:.3f} (bound "
                       f"{t.max_topk_nats})"}
    return {"check": check, "outcome": PASS, **numbers,
            "why": f"{numbers['identical']} of {len(rows)} outputs identical, every divergence at a near-tie "
                   f"(<= {t.near_tie_nats} nats); top-k logprobs up to it within {mean:.3f} nats on average "
                   f"(<= {t.max_topk_mean_nats}), {numbers['topk_max_nats']:.3f} at most (<= {t.max_topk_nats}) "
                   f"over {len(distances)} positions"}


def topk_reprefill_check(arms: dict, t: Thresholds, source: str = "logprob", name: str = "topk_reprefill") -> dict:
    per_arm = {arm: topk_reprefill_of(r, t, source) for arm, r in arms.items()}
    verdicts = {}
    for arm, n in per_arm.items():
        if n["missing"] or not n["positions"]:
            verdicts[arm] = (INCONCLUSIVE, f"no re-prefill top-k for prompt(s) {n['missing'] or 'any'}")
        elif n["positions"] < t.min_kl_tokens:
            verdicts[arm] = (INCONCLUSIVE, f"{n['positions']} positions compared, fewer than {t.min_kl_tokens}")
        elif topk_bound_problem(n, t):
            verdicts[arm] = (FAIL, topk_bound_problem(n, t))
        else:
            verdicts[arm] = (PASS, f"top-k within {n['mean_nats']:.3f} nats on average, {n['max_nats']:.3f} at most "
                                   f"over {n['positions']} positions")
    if "B" in arms and all(v[0] == FAIL for v in verdicts.values()):
        outcome, why = INCONCLUSIVE, ("both arms exceed the top-k bound (" + "; ".join(
            f"{arm}: {v[1]}" for arm, v in verdicts.items()) + "): the bound does not fit this box's stock path")
    else:
        outcome = worst(v[0] for v in verdicts.values())
        why = "; ".join(f"{arm}: {v[1]}" for arm, v in verdicts.items())
    return {"check": name, "outcome": outcome, "why": why, "per_arm": per_arm}


# ------------------------------------------------------------------------------ void measurements
def _is_logprob_field(key: str) -> bool:
    return "logprob" in key or key.endswith("_top")


def responses(result: dict) -> Iterator[tuple[str, dict]]:
    """(check, answer) for every answer in a box result (its control run's too) that carries a logprob field."""
    def walk(check, node):
        if isinstance(node, dict):
            if any(_is_logprob_field(k) for k in node):
                yield check, node
            for k, v in node.items():
                if not _is_logprob_field(k):
                    yield from walk(check, v)
        elif isinstance(node, list):
            for v in node:
                yield from walk(check, v)

    for check, body in ((result.get("checks") or {}).items()):
        if check == "api":  # OpenAI chat objects (logprobs null unless asked), judged by the api check
            continue
        yield from walk(check, body)
    for check, body in ((((result.get("control") or {}).get("checks")) or {}).items()):
        yield from walk(f"{check} (control)", body)


def _logprob_values(node) -> Iterator:
    """The logprobs in a field: numbers, ``[logprob, id, ...]`` entries, or lists of either (top-k)."""
    if isinstance(node, (list, tuple)):
        if len(node) >= 2 and not isinstance(node[0], (list, tuple)) and isinstance(node[1], int) \
                and not isinstance(node[1], bool) and (node[0] is None or isinstance(node[0], float)):
            yield node[0]  # one [logprob, id, text] entry
            return
        for v in node:
            yield from _logprob_values(v)
    else:
        yield node


def validity_of(result: dict, t: Thresholds) -> dict:
    """One arm's logprobs, every answer: null or non-finite anywhere, top-k lists that are no
    distribution, a greedy token that is not its position's top-1, and a void arm (no logprob,
    all equal, all zero)."""
    nonfinite, malformed, not_top1, values, answers, positions = [], [], [], {}, 0, 0
    for check, answer in responses(result):
        answers += 1
        where = f"{check} #{answer.get('index', answer.get('line', answers))}"
        for key, field in answer.items():
            if not _is_logprob_field(key):
                continue
            leaves = list(_logprob_values(field))
            if not all(finite(v) for v in leaves):
                nonfinite.append(f"{where} {key}")
                continue
            if key.endswith("_top"):
                for j, pos in enumerate(field or []):
                    positions += 1
                    found = topk_problems(pos, t.logprob_slack)
                    if found:
                        malformed.append(f"{where} {key}[{j}]: {found[0]}")
                        break
            else:
                values.setdefault(key, []).extend(leaves)
                if any(v > t.logprob_slack for v in leaves):
                    malformed.append(f"{where} {key}: a logprob above 0")
        greedy = not (answer.get("temperature") or 0) > 0
        ids, top = answer.get("output_ids"), answer.get("output_top")
        if greedy and isinstance(ids, list) and isinstance(top, list):
            for j, (token, pos) in enumerate(zip(ids, top)):
                entries = [e for e in pos or [] if isinstance(e, (list, tuple)) and len(e) >= 2]
                if not entries or not all(finite(e[0]) for e in entries):
                    continue  # counted above
                mine = next((e[0] for e in entries if e[1] == token), None)
                if mine is None or mine < entries[0][0] - t.logprob_slack:
                    not_top1.append(f"{where} position {j}")
                    break
    void = None
    if not values:
        void = "no logprob was returned"
    for key, found in sorted(values.items()):
        if found and all(v == 0 for v in found):
            void = f"all {len(found)} {key} are 0"
        elif len(found) > 1 and len(set(found)) == 1:
            void = f"all {len(found)} {key} are equal ({found[0]})"
    return {"answers": answers, "logprobs": sum(len(v) for v in values.values()), "topk_positions": positions, "nonfinite": nonfinite[:10],
            "malformed": malformed[:10], "greedy_not_top1": not_top1[:10], "void": void, **ledger_of(result)}


def ledger_of(result: dict) -> dict:
    """The box's ledger (``box_eval.Ledger``, every request of every check, kept in the record or
    not): how many logprob values it saw, and per check the null, non-finite or missing ones."""
    seen, bad = 0, []
    for check, e in sorted((result.get("budget") or {}).items()):
        seen += e.get("logprob_values") or 0
        if e.get("bad_logprobs") or e.get("missing_logprobs"):
            bad.append(f"{check}: {e.get('bad_logprobs', 0)} null or non-finite value(s), "
                       f"{e.get('missing_logprobs', 0)} answer(s) without logprobs")
    return {"ledger_values": seen, "ledger_bad": bad}


def validity_check(arms: dict, t: Thresholds) -> dict:
    """A null or non-finite logprob anywhere fails (in the recorded answers, or counted by the box's
    ledger over every request, with answers that came without logprobs), as does a top-k list that is no distribution or a
    greedy token that is not its position's top-1; an arm whose logprobs cannot tell anything
    apart is inconclusive."""
    per_arm = {arm: validity_of(r, t) for arm, r in arms.items()}
    fails, voids = [], []
    for arm, n in per_arm.items():
        if n["nonfinite"]:
            fails.append(f"{arm}: null or non-finite logprobs in {', '.join(n['nonfinite'][:4])}")
        if n["ledger_bad"]:
            fails.append(f"{arm}: the box's ledger over every request: {'; '.join(n['ledger_bad'][:4])}")
        if n["malformed"]:
            fails.append(f"{arm}: {'; '.join(n['malformed'][:3])}")
        if n["greedy_not_top1"]:
            fails.append(f"{arm}: at temperature 0 the emitted token is not its position's top-1 at "
                         f"{', '.join(n['greedy_not_top1'][:4])}")
        if n["void"]:
            voids.append(f"{arm}: {n['void']}: such logprobs tell nothing apart")
    if fails:
        return {"check": "logprob_validity", "outcome": FAIL, "why": "; ".join(fails), "per_arm": per_arm}
    if voids:
        return {"check": "logprob_validity", "outcome": INCONCLUSIVE, "why": "; ".join(voids), "per_arm": per_arm}
    return {"check": "logprob_validity", "outcome": PASS, "per_arm": per_arm,
            "why": "; ".join(f"{arm}: {n['logprobs']} logprobs and {n['topk_positions']} top-k lists over "
                             f"{n['answers']} answers, all finite, each a distribution, greedy tokens top-1"
                             + (f"; {n['ledger_values']} values over every request on the box, all finite"
                                if n["ledger_values"] else "")
                             for arm, n in per_arm.items())}


def reach_of(result: dict) -> dict:
    """Per check, the longest request in tokens (prompt and output) the box reports: in the answers
    (``prompt_tokens`` and the output) and in its per-check ledger (``budget.<check>.max_position``)."""
    out: dict = {}

    def walk(check, node):
        if isinstance(node, dict):
            if isinstance(node.get("prompt_tokens"), int):
                extra = node.get("output_ids")
                generated = len(extra) if isinstance(extra, list) else (node.get("output_tokens") or 0)
                out[check] = max(out.get(check, 0), node["prompt_tokens"] + int(generated))
            for v in node.values():
                walk(check, v)
        elif isinstance(node, list):
            for v in node:
                walk(check, v)

    for check, body in (result.get("checks") or {}).items():
        walk(check, body)
    for check, entry in (result.get("budget") or {}).items():  # box_eval's ledger, where it keeps one
        if isinstance(entry, dict) and isinstance(entry.get("max_position"), int):
            out[check] = max(out.get(check, 0), entry["max_position"])
    return out


def reach_check(arms: dict, t: Thresholds) -> dict:
    """Nothing long enough to run the indexer kernel: inconclusive (docs/sglang-contract.md §2.6)."""
    per_arm = {arm: reach_of(r) for arm, r in arms.items()}
    short = [arm for arm, n in per_arm.items() if max(n.values(), default=0) <= t.indexer_threshold_tokens]
    described = "; ".join(f"{arm}: " + ", ".join(f"{c} {n} tokens" for c, n in sorted(lengths.items()))
                          for arm, lengths in per_arm.items())
    if short:
        return {"check": "kernel_reach", "outcome": INCONCLUSIVE, "per_arm": per_arm,
                "why": f"no request of arm(s) {', '.join(short)} is longer than the indexer threshold of "
                       f"{t.indexer_threshold_tokens} tokens, so the indexer kernel never ran ({described or 'no lengths'})"}
    return {"check": "kernel_reach", "outcome": PASS, "per_arm": per_arm,
            "why": f"requests past the indexer threshold of {t.indexer_threshold_tokens} tokens in every arm "
                   f"({described})"}


def empty_cells(table: dict) -> list[str]:
    """The (context, depth) cells of a needle table where not one needle was found."""
    return [f"depth {depth} of {context}" for context, row in sorted(table["cells"].items(), key=lambda kv: int(kv[0]))
            for depth, (found, total) in row.items() if total and not found]


def needle_check(arms: dict, t: Thresholds) -> dict:
    tables = {arm: needle_table(r) for arm, r in arms.items()}
    empty = {arm: empty_cells(table) for arm, table in tables.items()}
    if any(empty.values()):
        flipped = dict(zip(("lost", "gained"), _needle_flips(arms))) if "B" in arms else {}
        return {"check": "needles", "outcome": FAIL, "per_arm": tables, "empty_cells": empty, **flipped,
                "why": "; ".join(f"arm {arm} found no needle at {', '.join(cells[:6])}"
                                 for arm, cells in empty.items() if cells) + " (a cell fails on its own)"}
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


def _floor(n: dict, t: Thresholds) -> tuple[str, str]:
    """One arm's accuracy against the task set's floor: pass, fail (Wilson upper bound below it) or
    inconclusive (below it, not significantly); ``floor_met`` also needs ``min_task_items``."""
    low, high = n["wilson95"]
    n["floor"] = {"min_accuracy": t.min_task_accuracy, "min_items": t.min_task_items,
                  "met": n["accuracy"] >= t.min_task_accuracy and n["n"] >= t.min_task_items}
    text = f"accuracy {n['accuracy']:.3f} (95% {low:.3f}-{high:.3f}, {n['n']} items) against {t.min_task_accuracy:.2f}"
    if n["accuracy"] >= t.min_task_accuracy:
        return PASS, text
    return (FAIL if high < t.min_task_accuracy else INCONCLUSIVE), text


def flips(a_items: list, b_items: list) -> dict:
    """Paired items of two runs: lost (right in the first, wrong in the second), gained, McNemar."""
    a = {i["line"]: i["correct"] for i in a_items}
    b = {i["line"]: i["correct"] for i in b_items}
    lines = sorted(set(a) & set(b))
    lost = [line for line in lines if a[line] and not b[line]]
    gained = [line for line in lines if b[line] and not a[line]]
    return {"paired": len(lines), "lost": lost, "gained": gained, "mcnemar_p": mcnemar_exact(len(lost), len(gained)),
            "net_loss": (len(lost) - len(gained)) / len(lines) if lines else 0.0,
            "flip_rate": (len(lost) + len(gained)) / len(lines) if lines else None}


def control_numbers(arm_a: dict) -> Optional[dict]:
    """Arm A's tasks asked twice in one record (``control``): how many items flip between the runs."""
    control = (((arm_a.get("control") or {}).get("checks") or {}).get("tasks") or {}).get("items")
    if control is None:
        return None
    return flips(arm_a["checks"]["tasks"]["items"], control)


def task_check(arms: dict, t: Thresholds) -> dict:
    per_arm = {arm: task_numbers(r) for arm, r in arms.items()}
    if not all(n["n"] for n in per_arm.values()):
        return {"check": "tasks", "outcome": INCONCLUSIVE, "why": "no task item was asked", "per_arm": per_arm}
    floors = {arm: _floor(n, t) for arm, n in per_arm.items()}
    floor_why = "; ".join(f"{arm}: {v[1]}" for arm, v in floors.items())
    if "B" not in arms:
        return {"check": "tasks", "outcome": floors["A"][0], "per_arm": per_arm, "why": floors["A"][1]}
    paired = flips(arms["A"]["checks"]["tasks"]["items"], arms["B"]["checks"]["tasks"]["items"])
    control = control_numbers(arms["A"])
    lost, gained, p, net = paired["lost"], paired["gained"], paired["mcnemar_p"], paired["net_loss"]
    numbers = {"per_arm": per_arm, **paired, "control": control}
    said = f"B wrong where A right on {len(lost)} item(s), right where A wrong on {len(gained)}; McNemar p={p:.3g}"
    if control is not None:
        said += (f"; control (A asked twice): {len(control['lost']) + len(control['gained'])} flip(s) of "
                 f"{control['paired']} ({control['flip_rate']:.1%})")
    if not paired["paired"]:
        return {"check": "tasks", "outcome": INCONCLUSIVE, "why": "no task item in both arms", **numbers}
    if len(lost) > len(gained) and p < t.alpha:
        return {"check": "tasks", "outcome": FAIL, "why": f"{said} < {t.alpha}", **numbers}
    if any(v[0] == FAIL for v in floors.values()):
        return {"check": "tasks", "outcome": FAIL, "why": f"below the task set's floor: {floor_why}", **numbers}
    if control is not None and control["flip_rate"] is not None and control["flip_rate"] > t.max_control_flip_rate:
        return {"check": "tasks", "outcome": INCONCLUSIVE, **numbers,
                "why": f"{said}: the same configuration flips more than {t.max_control_flip_rate:.0%} of its answers "
                       f"between two runs, too noisy to judge a kernel by"}
    if any(v[0] == INCONCLUSIVE for v in floors.values()):
        return {"check": "tasks", "outcome": INCONCLUSIVE, "why": f"{said}; below the floor, not significantly: "
                                                                 f"{floor_why}", **numbers}
    if net <= t.max_net_task_loss:
        return {"check": "tasks", "outcome": PASS, "why": f"{said}; net loss {net:.1%} <= {t.max_net_task_loss:.0%}; "
                                                          f"{floor_why}", **numbers}
    return {"check": "tasks", "outcome": INCONCLUSIVE,
            "why": f"{said}; net loss {net:.1%} > {t.max_net_task_loss:.0%} but not significant: run more items",
            **numbers}


def acceptance_check(arms: dict, t: Thresholds) -> Optional[dict]:
    """Speculative decoding: arm B's acceptance length against arm A's (``speculative`` of each
    arm's result: the algorithm and the acceptance length the server reported after the checks).
    None without a drafter."""
    spec = {arm: r.get("speculative") or {} for arm, r in arms.items()}
    if not any(s.get("algorithm") for s in spec.values()):
        return None
    lengths = {arm: s.get("accept_length") for arm, s in spec.items()}
    numbers = {"per_arm": spec}
    if not all(finite(v) and v > 0 for v in lengths.values()):
        return {"check": "spec_acceptance", "outcome": INCONCLUSIVE, **numbers,
                "why": f"speculative decoding is on, and the acceptance length is not known in every arm ({lengths})"}
    if "B" not in arms:
        return {"check": "spec_acceptance", "outcome": PASS, **numbers,
                "why": f"acceptance length {lengths['A']:.2f} (nothing to compare it with)"}
    ratio = lengths["B"] / lengths["A"]
    numbers["ratio"] = ratio
    outcome = PASS if ratio >= t.min_acceptance_ratio else FAIL
    return {"check": "spec_acceptance", "outcome": outcome, **numbers,
            "why": f"arm B's acceptance length {lengths['B']:.2f} is {ratio:.1%} of arm A's {lengths['A']:.2f} "
                   f"({'>=' if outcome == PASS else '<'} {t.min_acceptance_ratio:.0%})"}


def judge(arms: dict, t: Thresholds, served_names=()) -> tuple[str, list[dict]]:
    """(outcome, checks) for the arms' results; only checks every arm ran are judged."""
    checks = [validity_check(arms, t)]
    if _has(arms, "logprob"):
        checks.append(logprob_check(arms, t))
        checks.append(topk_reprefill_check(arms, t))
        if "B" in arms:
            checks.append(agreement_check(arms, t))
    if _has(arms, "needles"):
        checks.append(needle_check(arms, t))
    if _has(arms, "tasks"):
        checks.append(task_check(arms, t))
    checks += judge_shapes(arms, t, task_check)  # the long set, batch mix, extra task sets, logprob health
    spec = acceptance_check(arms, t)
    if spec is not None:
        checks.append(spec)
    checks.append(reach_check(arms, t))
    if _has(arms, "api"):
        from dsv4kit.quality.api_check import api_check

        checks.append(api_check(arms, served_names, t.alpha))
    return worst(c["outcome"] for c in checks), checks


def outcome_exit_code(outcome: Optional[str]) -> int:
    from dsv4kit.core import exitcodes

    return {PASS: exitcodes.OK, FAIL: exitcodes.CHECK_FAILED}.get(outcome, exitcodes.INCONCLUSIVE)
