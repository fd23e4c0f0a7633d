"""Build the dsv4kit wheel from this checkout, to ship to a box.

The sources are copied to a temporary directory first, so a build never writes ``build/`` or
``*.egg-info`` into the (shared) working tree and never picks up stale build output. The build
runs without isolation and without network when setuptools is installed here (else pip builds in an
isolated environment, which needs the package index).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


class WheelBuildError(RuntimeError):
    """The checkout cannot be found or the wheel build failed; the message says why."""


@dataclass
class BuiltWheel:
    path: Path
    sha256: str
    source: Optional[Path]  # the checkout it was built from (None for a given wheel)
    commit: Optional[str] = None  # git HEAD of that checkout, "+dirty" when it had local changes


def source_root() -> Path:
    """The checkout this dsv4kit is imported from (the directory holding its pyproject.toml)."""
    import dsv4kit

    root = Path(dsv4kit.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or 'name = "dsv4kit"' not in pyproject.read_text():
        raise WheelBuildError(
            f"dsv4kit is imported from {Path(dsv4kit.__file__).parent}, which is not a source "
            "checkout; pass --wheel PATH, or --installed to use the dsv4kit rolled out on the box"
        )
    return root


def _package_dirs(pyproject: Path) -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return ["toolkit", "kernels", "validation"]
    data = tomllib.loads(pyproject.read_text())
    mapping = data.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return sorted({value.split("/")[0] for value in mapping.values()}) or ["toolkit"]


def _git_commit(root: Path) -> Optional[str]:
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_wheel(dest: Path, root: Optional[Path] = None, timeout: float = 600) -> BuiltWheel:
    """Build ``dsv4kit-*.whl`` into ``dest`` from ``root`` (default: this checkout)."""
    root = root or source_root()
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    with tempfile.TemporaryDirectory(prefix="dsv4kit-src-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "MANIFEST.in"):
            if (root / name).is_file():
                shutil.copy2(root / name, src / name)
        for name in _package_dirs(root / "pyproject.toml"):
            shutil.copytree(root / name, src / name, ignore=ignore)
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
               "-q", "-w", str(dest), str(src)]
        if importlib.util.find_spec("setuptools") is not None:
            cmd.insert(5, "--no-build-isolation")  # offline and fast; else pip fetches setuptools
        # Fixed timestamps inside the wheel, as the kernel_rollout role's build does: the same
        # sources give the same bytes, so the wheel hash in reports identifies the sources.
        env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "315532800")}
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise WheelBuildError(f"building the dsv4kit wheel took longer than {timeout:g}s") from None
        if done.returncode != 0:
            raise WheelBuildError(
                f"building the dsv4kit wheel from {root} failed (pip wheel exit {done.returncode}):\n"
                + (done.stderr or done.stdout).strip()[-3000:]
            )
    wheels = sorted(dest.glob("dsv4kit-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise WheelBuildError(f"pip wheel reported success but wrote no dsv4kit wheel into {dest}")
    return BuiltWheel(wheels[-1], sha256_of(wheels[-1]), root, _git_commit(root))


def given_wheel(path: Path) -> BuiltWheel:
    """A prebuilt wheel named on the command line, checked to be a dsv4kit wheel."""
    if not path.is_file():
        raise WheelBuildError(f"--wheel {path}: no such file")
    if not (path.name.startswith("dsv4kit-") and path.name.endswith(".whl")):
        raise WheelBuildError(f"--wheel {path}: not a dsv4kit wheel (expected dsv4kit-<version>-*.whl)")
    return BuiltWheel(path, sha256_of(path), None)
