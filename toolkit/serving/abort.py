"""How a serving-stack step stops the command that runs it: ``ServingAbort(exit_code, message)``.

``dsv4kit.bench.config.BenchAbort`` is this same type, so a sweep catches a failed restart or
health wait as its own.
"""

from __future__ import annotations

from dsv4kit.core import exitcodes


class ServingAbort(exitcodes.Abort):
    """Stop: nothing is recorded. ``exit_code`` from dsv4kit.core.exitcodes."""
