"""A missing third-party package, anywhere in the CLI: exit 5 with one line, never a traceback.

The console script (``dsv4kit.cli``) imports the CLI under :func:`missing_package_exit`, so even a
copy installed with ``--no-deps`` (as on the GPU box) answers with the install command.

Standard library only.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, Optional

ENVIRONMENT = 5  # dsv4kit.core.exitcodes.ENVIRONMENT (not imported: this module must load first)

# Top-level module -> (distribution to name, extra that declares it; "" = the base install).
PROVIDERS = {
    "torch": ("torch", "gpu"),
    "triton": ("triton", "gpu"),
    "numpy": ("numpy", "gpu"),
    "matplotlib": ("matplotlib", "plot"),
    "typer": ("typer", ""),
    "click": ("typer", ""),
    "rich": ("typer", ""),
    "yaml": ("pyyaml", ""),
    "fabric": ("fabric", ""),
    "invoke": ("fabric", ""),
    "paramiko": ("fabric", ""),
    "ansible": ("ansible-core", ""),
}


def install_command(extra: str) -> str:
    """``pip install`` of dsv4kit with ``extra``, from the checkout when it runs from one."""
    suffix = f"[{extra}]" if extra else ""
    source = _editable_checkout()
    if source:
        return f"pip install -e '{source}{suffix}'"
    return f"pip install 'dsv4kit{suffix}'"


def _editable_checkout() -> Optional[str]:
    """The checkout this module runs from (an editable install), or None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]  # toolkit/core/missing.py (imports nothing of dsv4kit)
    return str(root) if (root / "pyproject.toml").is_file() and (root / "toolkit").is_dir() else None


def message(module: str) -> str:
    """The one line for a missing top-level ``module``."""
    top = module.split(".")[0]
    if top in PROVIDERS:
        package, extra = PROVIDERS[top]
        command = install_command(extra)
    else:  # not one of ours: a dependency of a dependency; name it as Python did
        package, command = top, f"pip install {top}"
    return f"error: the Python package '{package}' is missing (import {module}); install it with: {command}"


@contextlib.contextmanager
def missing_package_exit() -> Iterator[None]:
    """Turn a ``ModuleNotFoundError`` for a third-party module into :data:`ENVIRONMENT`.

    A missing ``dsv4kit`` module is a packaging bug and keeps its traceback.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        name = exc.name or ""
        if not name or name.split(".")[0] == "dsv4kit":
            raise
        print(message(name), file=sys.stderr)
        raise SystemExit(ENVIRONMENT) from None

