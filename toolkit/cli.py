"""The ``dsv4kit`` console script and ``python -m dsv4kit.cli``.

The console script first installs a Ctrl-C handler (exit 130, one line, no traceback), then
imports the typer application under the missing-package guard, so a copy installed without its
dependencies (``--no-deps``, as on the GPU box) exits 5 with the install command instead of a
traceback. ``app`` is ``dsv4kit.commands.app.app``. Under ``--json``, an option click refuses
still prints the JSON error object (the command's own failures print it in ``interruptible``).
"""

from __future__ import annotations

import os
import signal
import sys

from dsv4kit.core.missing import missing_package_exit

INTERRUPTED = 130  # dsv4kit.core.exitcodes.INTERRUPTED (not imported: nothing heavy before the handler)


def _interrupted_before_the_command(signum, frame) -> None:
    """Ctrl-C while the CLI loads or parses: nothing ran yet, so stop at once."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a reentrant flush; what is lost is only what loads
            pass
    os.write(2, b"\ninterrupted: dsv4kit stopped before its command ran; nothing was run\n")
    os._exit(INTERRUPTED)


# The console script (or ``python -m``) gets the handler before the heavy imports below; a test or
# a tool that imports this module keeps its own.
if __name__ == "__main__" or os.path.basename(sys.argv[0] if sys.argv else "") == "dsv4kit":
    signal.signal(signal.SIGINT, _interrupted_before_the_command)

with missing_package_exit():
    from dsv4kit.commands.app import app


def main() -> None:
    signal.signal(signal.SIGINT, _interrupted_before_the_command)
    with missing_package_exit():
        if "--json" not in sys.argv[1:]:
            app()
            return
        from dsv4kit.core.cli_common import usage_error_as_json

        sys.exit(usage_error_as_json(app))


if __name__ == "__main__":
    main()
