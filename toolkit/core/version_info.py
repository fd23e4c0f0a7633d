"""What ``dsv4kit --version`` (``-V``) says: the version, the checkout's commit, and the SGLang and
torch pins the box gets (``inventory/group_vars/all.yml``, the one place pins live)."""

from __future__ import annotations

import subprocess
from typing import Optional

from dsv4kit import __version__
from dsv4kit.core.paths import REPO_ROOT

PINS_FILE = REPO_ROOT / "inventory" / "group_vars" / "all.yml"
#: The pins shown, by inventory variable.
PINS = {"dsv4_sglang_version": "SGLang", "dsv4_torch_version": "torch"}


def commit() -> Optional[str]:
    """The checkout's commit (``+dirty`` when tracked files changed), or None (an installed wheel)."""
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def pins() -> dict:
    """``{"SGLang": "0.5.23", "torch": ...}`` from the pins file; {} when it is not there."""
    import yaml

    try:
        data = yaml.safe_load(PINS_FILE.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return {label: str(data[name]) for name, label in PINS.items() if data.get(name) is not None}


def describe() -> str:
    """Two lines: ``dsv4kit VERSION (commit ...)`` and the pins."""
    head = commit()
    first = f"dsv4kit {__version__} (commit {head or 'unknown: not a git checkout'})"
    found = pins()
    second = ("pins for the box: " + ", ".join(f"{label} {value}" for label, value in found.items())
              + f" ({PINS_FILE.relative_to(REPO_ROOT)})") if found else f"pins for the box: {PINS_FILE} not found"
    return f"{first}\n{second}"
