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

import contextlib
import dataclasses
import importlib
import os
import platform
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from dsv4kit.validation.rows import (REPORT_SCHEMA, RunOptions, SuiteReport, row_json,
                                     worst_line, write_json_atomic)

SUITES: dict[str, str] = {
    "indexer": "dsv4kit.validation.indexer_suite",
    "indexer_fp4": "dsv4kit.validation.indexer_fp4_suite",
    "attention": "dsv4kit.validation.attention_suite",
}


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
            with sigint_held():  # native modules: see load_triton
                import torch

            has_cuda = torch.cuda.is_available()
        except ImportError:
            has_cuda = False
    if interpret is None:
        interpret = not has_cuda
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
        load_triton(interpret=True)
        return "cpu", True
    if not has_cuda:
        raise RuntimeError("no CUDA device is visible; pass --interpret to run on the CPU interpreter")
    load_triton(interpret=False)
    return "cuda", False


def load_triton(interpret: bool) -> None:
    """Import Triton's native parts now, with Ctrl-C held until they are in: one that lands while a
    nanobind module is importing aborts the process (no exit 130, no message). The interpreter's
    part is otherwise imported at the first kernel launch. Call it only once ``TRITON_INTERPRET``
    is decided: Triton reads it when a kernel is decorated."""
    with sigint_held():
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401

            if interpret:
                import triton.runtime.interpreter  # noqa: F401
        except ImportError:
            pass  # the suites say what is missing, as before


@contextlib.contextmanager
def sigint_held():
    """Hold SIGINT for the block; one that arrived is delivered to the restored handler after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            os.kill(os.getpid(), signal.SIGINT)


def environment_info(device: str, interpret: bool) -> dict:
    from dsv4kit.validation.environment import software_versions, torch_device

    info = {"python": platform.python_version(), "host": platform.node(), "device": device,
            "interpret": interpret}
    torch_side = torch_device(device)
    info.update({k: torch_side[k] for k in ("torch", "gpu", "capability", "cuda_visible_devices") if k in torch_side})
    versions = software_versions()
    info.update(triton=versions["triton"], dsv4kit=versions["dsv4kit"])
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
    parser.add_argument("--decode-tp", type=int, default=None,
                        help="the decode server's TP: the verdict's attention heads per GPU (default: 4)")
    parser.add_argument("--attention-backend", default=None,
                        help="SGLANG_SM120_FLASHMLA_BACKEND of the servers, which decides the head padding "
                             "(default: flashinfer, SGLang's)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    verdict = None
    if args.ctx is not None:
        from dsv4kit.validation import attention_heads
        from dsv4kit.validation.verdict_run import DEFAULT_CONCURRENCY, parse_concurrency

        try:
            verdict = VerdictRequest(args.ctx, parse_concurrency(args.concurrency) if args.concurrency
                                     else DEFAULT_CONCURRENCY,
                                     args.decode_tp or attention_heads.DEFAULT_DECODE_TP,
                                     args.attention_backend or attention_heads.DEFAULT_BACKEND)
            attention_heads.kernel_heads(verdict.decode_tp, 1, verdict.backend)  # checks both
        except ValueError as exc:
            parser.error(str(exc))
    return run_cli(args.cases, args.json_path, True if args.interpret else None,
                   compare_sglang=not args.no_sglang, verdict=verdict)


@dataclass(frozen=True)
class VerdictRequest:
    """Measure the kernel verdict (``dsv4kit.validation.verdict_run``) at these decode shapes."""

    context_length: int
    concurrency: tuple
    decode_tp: int = 4  # attention_heads.DEFAULT_DECODE_TP
    backend: str = "flashinfer"  # attention_heads.DEFAULT_BACKEND


def run_cli(cases: Optional[str], json_path: Optional[str], interpret: Optional[bool],
            compare_sglang: bool = True, emit: Callable[[str], None] = print,
            on_report: Optional[Callable[[dict], None]] = None,
            verdict: Optional[VerdictRequest] = None) -> int:
    """Shared by ``dsv4kit validate --local`` and ``python -m``. Returns an exit code.

    ``on_report`` receives the finished report (``dsv4kit validate --json`` prints it). With
    ``verdict``, the report ends with the kernel verdict of the selected suites."""
    from dsv4kit.core import exitcodes

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
                                             interpret, progress=options.progress, decode_tp=verdict.decode_tp,
                                             backend=verdict.backend)
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
