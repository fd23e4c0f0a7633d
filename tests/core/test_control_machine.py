"""`pip install -e .` is all the control machine needs to provision: from a fresh venv holding only
dsv4kit's declared dependencies, kernel_rollout's wheel build (`pip wheel --no-build-isolation`,
run with that venv's Python) works."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "README.md", "toolkit", "kernels", "validation"]


def test_a_fresh_venv_with_dsv4kit_builds_the_rollout_wheel(tmp_path):
    checkout = tmp_path / "checkout"
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            checkout.mkdir(exist_ok=True)
            shutil.copy2(source, checkout / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin/python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(checkout)], capture_output=True,
                             text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    assert (venv / "bin/ansible-playbook").is_file()
    build = subprocess.run([str(python), str(REPO / "playbooks/roles/kernel_rollout/files/build_dsv4kit_wheel.py"),
                            str(checkout), str(tmp_path / "wheels")], capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-3000:]
    assert json.loads(build.stdout)["name"].startswith("dsv4kit-")
