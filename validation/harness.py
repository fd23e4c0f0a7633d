"""The validation harness: runs kernel suites against their references and reports a table.

A *suite* is a module in ``dsv4kit.validation`` that checks one kernel. ``SUITES`` maps the suite
name to that module's dotted path. Each suite module provides::

    NAME: str
    def default_cases(profile: str) -> list[str]
        # Case specs for a profile: "gpu" (full set) or "cpu" (small, for the Triton interpreter).
    def parse_case(spec: str) -> object
        # Turn one spec string into a case; raise ValueError naming the problem on bad input.
    def run(specs: list[str], options: RunOptions) -> Iterator[CheckRow]
        # Yield one row per (case, implementation) comparison, plus any extra checks
        # (CUDA-graph replay, determinism) that apply on options.device.

``--cases`` takes comma-separated ``SUITE`` (that suite's defaults) or ``SUITE:SPEC`` items.

Kernel modules are imported lazily by the suites, after ``TRITON_INTERPRET`` has been decided:
Triton reads that variable when a kernel is decorated, not when it is launched.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

SUITES: dict[str, str] = {
    "indexer": "dsv4kit.validation.indexer_suite",
    "attention": "dsv4kit.validation.attention_suite",
}

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


def parse_cases(text: Optional[str]) -> dict[str, list[str]]:
    """``"indexer,attention:c4x16"`` -> ``{"indexer": [], "attention": ["c4x16"]}``.

    An empty list means "that suite's defaults". Unknown suites and malformed specs raise
    ValueError with the offending item named.
    """
    if not text:
        return {name: [] for name in SUITES}
    selected: dict[str, list[str]] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        suite, _, spec = item.partition(":")
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r} in --cases item {item!r}; known: {', '.join(SUITES)}")
        specs = selected.setdefault(suite, [])
        if spec:
            load_suite(suite).parse_case(spec)  # fail early, before anything runs
            specs.append(spec)
    if not selected:
        raise ValueError(f"--cases {text!r} selects nothing")
    return selected


def load_suite(name: str):
    return importlib.import_module(SUITES[name])


def choose_device(interpret: Optional[bool]) -> tuple[str, bool]:
    """Decide where kernels run. ``interpret=None`` means: GPU if there is one, else interpreter."""
    has_cuda = False
    if not interpret:
        try:
            import torch

            has_cuda = torch.cuda.is_available()
        except ImportError:
            has_cuda = False
    if interpret is None:
        interpret = not has_cuda
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
        return "cpu", True
    if not has_cuda:
        raise RuntimeError("no CUDA device is visible; pass --interpret to run on the CPU interpreter")
    return "cuda", False


def environment_info(device: str, interpret: bool) -> dict:
    info = {"python": platform.python_version(), "host": platform.node(), "device": device,
            "interpret": interpret}
    try:
        import torch

        info["torch"] = torch.__version__
        if device == "cuda":
            info["gpu"] = torch.cuda.get_device_name()
            info["capability"] = "sm_%d%d" % torch.cuda.get_device_capability()
            info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    except ImportError:
        pass
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        from dsv4kit import __version__

        info["dsv4kit"] = __version__
    except ImportError:
        pass
    try:
        import sglang  # noqa: F401

        info["sglang"] = getattr(sglang, "__version__", "unknown")
    except Exception:
        info["sglang"] = None
    return info


def run_suites(
    selection: dict[str, list[str]],
    options: RunOptions,
    emit: Callable[[str], None] = print,
) -> tuple[list[SuiteReport], dict]:
    reports = []
    for name, specs in selection.items():
        suite = load_suite(name)
        profile = "cpu" if options.interpret else "gpu"
        specs = specs or suite.default_cases(profile)
        rows = []
        emit(f"== {name}: {len(specs)} case(s) on {options.device}"
             + (" (Triton interpreter)" if options.interpret else ""))
        for row in suite.run(specs, options):
            rows.append(row)
            emit(row.line())
        report = SuiteReport(name, rows)
        worst = report.worst()
        if worst is not None:
            emit(worst_line(name, worst))
        emit(f"{name}: {'PASS' if report.passed else 'FAIL'}")
        reports.append(report)
    return reports, environment_info(options.device, options.interpret)


def report_json(reports: list[SuiteReport], env: dict, started: float) -> dict:
    worst = {r.name: r.worst() for r in reports}
    return {
        "schema": REPORT_SCHEMA,
        "kind": "dsv4kit-validation",
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "started_unix": started,
        "seconds": round(time.time() - started, 3),
        "environment": env,
        "passed": all(r.passed for r in reports) and bool(reports),
        "suites": {
            r.name: {
                "passed": r.passed,
                "worst": dataclasses.asdict(worst[r.name]) if worst[r.name] else None,
                "rows": [row_json(row) for row in r.rows],
            }
            for r in reports
        },
    }


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


def main(argv: Optional[Iterable[str]] = None) -> int:
    """``python -m dsv4kit.validation.harness``: the same run without the CLI dependencies.

    This is what ``dsv4kit validate --gpu N`` runs on the box, inside the SGLang venv.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dsv4kit.validation.harness",
                                     description="Run the dsv4kit kernel validation table.")
    parser.add_argument("--cases", default=None, help="comma-separated SUITE or SUITE:SPEC items")
    parser.add_argument("--output", "-o", dest="json_path", default=None, help="write the report to this file")
    # The old spelling: dsv4kit validate --installed runs whichever dsv4kit the box has rolled out.
    parser.add_argument("--json", dest="json_path", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--interpret", action="store_true",
                        help="run kernels through Triton's CPU interpreter (small cases)")
    parser.add_argument("--no-sglang", action="store_true",
                        help="do not compare against SGLang's installed fallback")
    parser.add_argument("--ctx", type=int, default=None,
                        help="context length of the kernel verdict's decode shapes (default: no verdict)")
    parser.add_argument("--concurrency", default=None,
                        help="comma-separated decode batch sizes of the verdict (default: 1,16,64)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    verdict = None
    if args.ctx is not None:
        from dsv4kit.validation.verdict_run import DEFAULT_CONCURRENCY, parse_concurrency

        try:
            verdict = VerdictRequest(args.ctx, parse_concurrency(args.concurrency) if args.concurrency
                                     else DEFAULT_CONCURRENCY)
        except ValueError as exc:
            parser.error(str(exc))
    return run_cli(args.cases, args.json_path, True if args.interpret else None,
                   compare_sglang=not args.no_sglang, verdict=verdict)


@dataclass(frozen=True)
class VerdictRequest:
    """Measure the kernel verdict (``dsv4kit.validation.verdict_run``) at these decode shapes."""

    context_length: int
    concurrency: tuple


def run_cli(cases: Optional[str], json_path: Optional[str], interpret: Optional[bool],
            compare_sglang: bool = True, emit: Callable[[str], None] = print,
            on_report: Optional[Callable[[dict], None]] = None,
            verdict: Optional[VerdictRequest] = None) -> int:
    """Shared by ``dsv4kit validate --local`` and ``python -m``. Returns an exit code.

    ``on_report`` receives the finished report (``dsv4kit validate --json`` prints it). With
    ``verdict``, the report ends with the kernel verdict of the selected suites."""
    from dsv4kit import exitcodes

    started = time.time()
    try:
        device, interpret = choose_device(interpret)
        selection = parse_cases(cases)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.USAGE if isinstance(exc, ValueError) else exitcodes.ENVIRONMENT
    options = RunOptions(device=device, interpret=interpret, compare_sglang=compare_sglang,
                         progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    reports, env = run_suites(selection, options, emit=lambda s: emit(s) or sys.stdout.flush())
    payload = report_json(reports, env, started)
    if verdict is not None:
        from dsv4kit.validation import verdict_run
        from dsv4kit.validation.verdict import render

        targets = [name for name in selection if name in verdict_run.TARGETS]
        payload["verdict"] = verdict_run.run(targets, verdict.context_length, verdict.concurrency, device,
                                             interpret, progress=options.progress)
        for line in render(payload["verdict"]):
            emit(line)
    emit(f"VERDICT: {'PASS' if payload['passed'] else 'FAIL'}")
    if json_path:
        write_json_atomic(json_path, payload)
        emit(f"report: {json_path}")
    if on_report is not None:
        on_report(payload)
    return exitcodes.OK if payload["passed"] else exitcodes.CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
