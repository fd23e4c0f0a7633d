"""The ``dsv4kit`` console script and ``python -m dsv4kit.cli``.

The typer application is imported under the missing-package guard, so a copy installed without
its dependencies (``--no-deps``, as on the GPU box) exits 5 with the install command instead of a
traceback. ``app`` is ``dsv4kit.commands.app.app``. Under ``--json``, an option click refuses
still prints the JSON error object (the command's own failures print it in ``interruptible``).
"""

from __future__ import annotations

from dsv4kit.core.missing import missing_package_exit

with missing_package_exit():
    from dsv4kit.commands.app import app


def main() -> None:
    import sys

    with missing_package_exit():
        if "--json" not in sys.argv[1:]:
            app()
            return
        from dsv4kit.core.cli_common import usage_error_as_json

        sys.exit(usage_error_as_json(app))


if __name__ == "__main__":
    main()
