"""``records compare`` of two eval records: the later one's answers judged against the earlier one's.

Each side is one arm (``ID@A``/``ID@B``; a record without ``--ab`` has only ``A``). The arms' raw
answers (``details/arm-<X>.json.gz``) go through the same checks as an A/B of one eval run, the
earlier record as arm A: paired needles, paired task items (McNemar), top-k agreement, each
side's KL. Both records must be eval records with equal comparability keys (``--ignore`` to allow
named fields to differ).
"""

from __future__ import annotations

from typing import Iterable

from dsv4kit.core import exitcodes
from dsv4kit.quality.checks import Thresholds, judge, outcome_exit_code


def _arm(record: dict) -> str:
    arm = record.get("_arm") or (None if record.get("ab") else "A")
    if arm is None:
        raise ValueError(f"{record['run_id']} is an A/B eval: name one arm, {record['run_id']}@A or @B")
    if arm not in record["arms"]:
        raise ValueError(f"{record['run_id']} has no arm {arm!r} (its arms: {', '.join(record['arms'])})")
    return arm


def compare_records(repo, old: dict, new: dict, ignore: Iterable[str] = ()) -> tuple[int, str, dict]:
    """(exit code, text, JSON) of ``new`` against ``old``; exit 2 when they cannot be compared."""
    from dsv4kit.records.results_repo import read_details

    if not all(r.get("kind") == "dsv4kit-eval" for r in (old, new)):
        return exitcodes.USAGE, "error: an eval record compares only with another eval record", {"error": "kinds differ"}
    try:
        arms = (_arm(old), _arm(new))
    except ValueError as exc:
        return exitcodes.USAGE, f"error: {exc}", {"error": str(exc)}
    ignore = set(ignore)
    differs = [{"field": k, "old": old["comparability_key"].get(k), "new": v}
               for k, v in new["comparability_key"].items() if k not in ignore and old["comparability_key"].get(k) != v]
    if differs:
        text = "not comparable: " + "; ".join(f"{d['field']} {d['old']!r} -> {d['new']!r}" for d in differs)
        return exitcodes.USAGE, text, {"comparable": False, "differences": differs}
    sides = {label: read_details(repo, r["run_id"], f"details/arm-{arm}.json.gz")
             for label, r, arm in (("A", old, arms[0]), ("B", new, arms[1]))}
    outcome, checks = judge(sides, Thresholds(**(new["eval"].get("thresholds") or {})))
    lines = [f"{new['run_id']}@{arms[1]} against {old['run_id']}@{arms[0]}"]
    lines += [f"{c['check']:<14} {c['outcome'].upper():<13} {c['why']}" for c in checks]
    lines.append(f"outcome: {outcome.upper()}")
    return outcome_exit_code(outcome), "\n".join(lines), {"comparable": True, "outcome": outcome, "checks": checks}
