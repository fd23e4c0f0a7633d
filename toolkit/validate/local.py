"""``dsv4kit validate --local``: the validation table (and the kernel verdict) on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from dsv4kit.core import exitcodes
from dsv4kit.core.cli_common import check_output, doing
from dsv4kit.core.exitcodes import Abort


def run_local(*, cases: Optional[str], output: Optional[Path], interpret: Optional[bool], verdict: bool,
              ctx: Optional[int], concurrency: Optional[str], emit: Callable[[str], None],
              on_report: Optional[Callable[[dict], None]]) -> int:
    """Run the table here (its GPU, or Triton's interpreter); the harness's exit code.

    Abort(USAGE) on a bad ``concurrency`` or an unwritable ``output``, before anything runs.
    """
    from dsv4kit.validation.harness import VerdictRequest, run_cli
    from dsv4kit.validation.verdict_run import DEFAULT_CONCURRENCY, DEFAULT_CONTEXT, parse_concurrency

    request = None
    if verdict:
        try:
            levels = parse_concurrency(concurrency) if concurrency else DEFAULT_CONCURRENCY
        except ValueError as exc:
            raise Abort(exitcodes.USAGE, str(exc)) from None
        request = VerdictRequest(ctx or DEFAULT_CONTEXT, levels)
    if output is not None:
        check_output(output)
    doing("running the validation table", "no report was written")
    return run_cli(cases, str(output) if output else None, interpret, emit=emit, on_report=on_report,
                   verdict=request)
