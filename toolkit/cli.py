"""The ``dsv4kit`` console script and ``python -m dsv4kit.cli``.

The typer application is imported under the missing-package guard, so a copy installed without
its dependencies (``--no-deps``, as on the GPU box) exits 5 with the install command instead of a
traceback. ``app`` is ``dsv4kit.commands.app.app``.
"""

from __future__ import annotations

from dsv4kit.core.missing import missing_package_exit

with missing_package_exit():
    from dsv4kit.commands.app import app


def main() -> None:
    with missing_package_exit():
        app()


if __name__ == "__main__":
    main()
