"""Docs state what the code does, and carry no number typed by hand where a machine decides it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_types_no_sizes():
    """Sizes of the venv and caches differ by machine and version: the README says how to read them."""
    sizes = re.findall(r"\b\d+(?:\.\d+)?\s?(?:[KMGT]i?B)\b", (ROOT / "README.md").read_text())
    assert not sizes, sizes


def test_validation_doc_says_ssh_config_is_read():
    """toolkit/core/ssh.py resolves ~/.ssh/config (tests/core/test_ssh_config.py); the doc must not deny it."""
    text = " ".join((ROOT / "docs/validation.md").read_text().split())
    assert "`~/.ssh/config` is not read" not in text
    assert "`~/.ssh/config` is read as Ansible's ssh reads it" in text
