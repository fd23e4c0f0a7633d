"""``dsv4_fp4_indexer: auto``: the FP4 index-K cache on only with the numbers and the answers.

The setting is ``true``, ``false`` or ``"auto"``. ``auto`` is resolved by ``dsv4kit provision``
(``dsv4kit.rollout.plan``) before Ansible runs; the playbook only ever sees ``true``/``false``.
It is ``true`` only when both hold for the host as it is now:

* the numbers: the ``indexer_fp4`` target of the host's full validation report (the same report,
  checked the same way as for the kernel flags) shows the FP4 function SGLang would call correct
  at every shape and the fastest correct indexer there, overall and at every shape. Which FP4
  function SGLang calls follows the resolved ``SGLANG_SM120_TRITON_INDEXER``: ``1`` replaces
  DeepGEMM's ``fp8_fp4_paged_mqa_logits`` with dsv4kit's, ``0`` leaves DeepGEMM's;
* the answers: a passing ``dsv4kit eval --ab dsv4_fp4_indexer=false,true`` record
  (``dsv4kit.records.quality_evidence``) whose arms ran with the indexer flag that will be served.

Anything missing or partial keeps it ``false``, and the decision (``value``, ``source``, ``why``)
says which piece.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from dsv4kit.rollout.targets import INDEXER_FLAG

SETTING = "dsv4_fp4_indexer"
TARGET = "indexer_fp4"
#: The A/B values of the setting's quality record: arm A FP8 (off), arm B FP4 (on).
AB_VALUES = ("false", "true")
#: The FP4 implementation of the ``indexer_fp4`` target SGLang calls, by the resolved indexer flag.
SERVING_FP4 = {"1": "dsv4kit", "0": "deepgemm-fp4"}


def is_auto(value) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def inventory_decision(value) -> dict:
    """The decision of a setting given in the inventory (true or false)."""
    return {"value": bool(value), "source": "inventory", "why": f"set in {SETTING}"}


def off(source: str, why: str, **extra) -> dict:
    return {**extra, "value": False, "source": source, "why": why}


def decide(host, report: dict, path: Path, facts, quality: Optional[Callable], indexer_flag: str) -> dict:
    """The decision for an ``auto`` setting from a report that holds for the host (identity checked)."""
    body = ((report.get("verdict") or {}).get("targets") or {}).get(TARGET)
    base = {"report": Path(path).name}
    if not isinstance(body, dict):
        return off("report", f"report {Path(path).name} has no {TARGET} verdict (validated with --cases, or by an "
                             f"older dsv4kit?): run `dsv4kit validate --host {host.name}`", **base)
    serving = SERVING_FP4["1" if str(indexer_flag).strip() == "1" else "0"]
    base.update(serving=serving, fastest=body.get("fastest"), fastest_by_shape=dict(body.get("fastest_by_shape") or {}))
    problems = numbers_problems(body, serving)
    if problems:
        return off("report", "; ".join(problems), **base)
    numbers = (f"{serving} (the FP4 indexer SGLang calls with SGLANG_SM120_TRITON_INDEXER={indexer_flag}) is correct "
               f"and the fastest correct indexer at every shape")
    if quality is None:
        return off("report", f"{numbers}, but no quality evidence was looked up", **base)
    found = quality(host, SETTING, facts, {INDEXER_FLAG: indexer_flag})
    base["quality_record"] = found.get("record")
    if not found.get("ok"):
        return off("quality record missing", f"{numbers}, but {found['why']}", **base)
    return {**base, "value": True, "source": "report + quality record", "why": f"{numbers}; {found['why']}"}


def numbers_problems(body: dict, serving: str) -> list[str]:
    """Why the ``indexer_fp4`` verdict does not show ``serving`` correct and fastest everywhere (empty: it does)."""
    rows = [m for m in body.get("measurements") or [] if isinstance(m, dict)]
    shapes = list(dict.fromkeys(m.get("shape") for m in rows))
    if not shapes:
        return [f"its {TARGET} verdict measured nothing"]
    ours = {m.get("shape"): m for m in rows if m.get("impl") == serving}
    if not ours:
        why = (body.get("unavailable") or {}).get(serving)
        return [f"{serving}, the FP4 indexer SGLang would call, was not measured" + (f" ({why})" if why else "")]
    problems = []
    wrong = [s for s in shapes if s not in ours or ours[s].get("correct") is not True]
    if wrong:
        problems.append(f"{serving} is not shown correct at {', '.join(map(str, wrong))}")
    by_shape = body.get("fastest_by_shape") or {}
    beaten = [f"{s} ({by_shape.get(s) or 'none correct'})" for s in shapes if by_shape.get(s) != serving]
    if beaten:
        problems.append(f"{serving} is not the fastest correct indexer at {', '.join(beaten)}")
    elif body.get("fastest") != serving:
        problems.append(f"the fastest correct indexer overall is {body.get('fastest')}, not {serving}")
    return problems


def render(decision: dict) -> str:
    value = "true" if decision.get("value") else "false"
    return f"  {SETTING}={value}  [{decision.get('source')}] {decision.get('why', '')}"
