"""The rows of a validation report, and writing a report: shared by the harness, the suites and the verdict.

A ``CheckRow`` is one comparison (an implementation on a case, or an extra check such as graph
replay); a ``SuiteReport`` is a suite's rows. Nothing here runs a kernel.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

REPORT_SCHEMA = 1


@dataclass
class RunOptions:
    device: str  # "cuda" or "cpu"
    interpret: bool  # True when kernels run through Triton's CPU interpreter
    compare_sglang: bool = True  # also compare SGLang's own installed fallback when importable
    progress: Optional[Callable[[str], None]] = None  # status messages while a case runs


@dataclass
class CheckRow:
    """One comparison: an implementation on a case, or an extra check such as graph replay."""

    suite: str
    case: str  # human label of the case, e.g. "B=16 H=64 pages=32 seqlen<=2048"
    impl: str  # "kernel", "fallback", "sglang", "graph-replay", "determinism", ...
    passed: Optional[bool]  # None when skipped: nothing was compared
    max_abs: Optional[float] = None  # max |out - ref| over compared (finite) positions
    rel: Optional[float] = None  # ||out - ref|| / ||ref|| over compared positions
    pattern_ok: Optional[bool] = None  # -inf pattern (indexer) / no NaN in real heads (attention)
    bar: Optional[float] = None  # the rel bar this row was held to, None when informational
    note: str = ""
    extra: dict = field(default_factory=dict)
    skipped: bool = False  # the comparison could not run here (note says why); passed is None

    @property
    def status(self) -> str:
        """``skipped``, ``info`` (measured, held to no bar), ``pass`` or ``fail``."""
        if self.skipped:
            return "skipped"
        if not self.passed:
            return "fail"
        return "info" if self.bar is None else "pass"

    def line(self) -> str:
        """One table row; the rel bar the row is held to stands beside rel (``tol -``: none)."""
        def fmt(v: Optional[float]) -> str:
            return "-" if v is None else f"{v:.3e}"

        pattern = "-" if self.pattern_ok is None else ("match" if self.pattern_ok else "MISMATCH")
        tol = "-" if self.bar is None else f"{self.bar:.1e}"
        verdict = {"skipped": "SKIPPED", "info": "info", "pass": "PASS", "fail": "FAIL"}[self.status]
        text = (
            f"{self.suite:<9} {self.impl:<19} {self.case:<40} "
            f"max|d|={fmt(self.max_abs):>9}  rel={fmt(self.rel):>9} tol={tol:>7}  pattern={pattern:<8} {verdict}"
        )
        return text + (f"  {self.note}" if self.note else "")


def skipped_row(suite: str, case: str, impl: str, reason: str) -> CheckRow:
    """A comparison that could not run here: marked skipped (not passed), ``reason`` in the note."""
    return CheckRow(suite=suite, case=case, impl=impl, passed=None, skipped=True, note=reason)


def worst_line(suite: str, row: CheckRow) -> str:
    """The suite's worst kernel row in one line, its bar beside its rel."""
    tol = "" if row.bar is None else f" (tol {row.bar:.1e})"
    return f"WORST {suite}: {row.case} rel={row.rel:.3e}{tol} max|d|={row.max_abs:.3e}"


def row_from_json(values: dict) -> CheckRow:
    """A row of a saved report (fields this version does not know, e.g. ``status``, are left out)."""
    names = {f.name for f in dataclasses.fields(CheckRow)}
    values = {k: v for k, v in values.items() if k in names}
    for key in ("max_abs", "rel", "bar"):
        if isinstance(values.get(key), str):  # NaN/inf written as text
            values[key] = float(values[key])
    measured = ("max_abs", "rel", "pattern_ok", "bar")
    if "skipped" not in values and all(values.get(key) is None for key in measured):
        # Reports from before rows carried ``skipped``: a row that measured nothing was skipped.
        values.update(skipped=True, passed=None)
    return CheckRow(**values)


def row_json(row: CheckRow) -> dict:
    """A row as the report stores it, with its ``status``."""
    return {**dataclasses.asdict(row), "status": row.status}


@dataclass
class SuiteReport:
    name: str
    rows: list[CheckRow]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows if not r.skipped) and bool(self.rows)

    def worst(self, impl: str = "kernel") -> Optional[CheckRow]:
        rows = [r for r in self.rows if r.impl == impl and r.rel is not None]
        return max(rows, key=lambda r: (math.inf if math.isnan(r.rel) else r.rel), default=None)


def write_json_atomic(path: str, payload: dict) -> None:
    """Write JSON so that an interrupted run never leaves a half-written report."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            # NaN/inf floats stay JSON's NaN/Infinity (Python reads them back); anything else that
            # is not JSON (a dtype, a Path) is written as its str().
            json.dump(payload, fh, indent=2, sort_keys=True, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
