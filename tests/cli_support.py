"""Helpers for the CLI tests: :func:`cli`, the one in-process run of ``dsv4kit`` the tests share; a
box venv whose python can be made to wait; and a run of the ``dsv4kit`` console command that is
sent SIGINT at a known point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]


def cli(*args, env: Optional[dict] = None) -> tuple[int, str, str]:
    """``dsv4kit ARGS`` in this process (typer's CliRunner): (exit code, stdout, stderr)."""
    result = invoke(args, env=env)
    return result.exit_code, result.stdout, result.stderr


def invoke(args, env: Optional[dict] = None):
    """``dsv4kit ARGS`` in this process: click's Result (``.output`` is stdout and stderr as printed).
    The one CliRunner of the tests; :func:`cli` is the same run as a tuple."""
    from typer.testing import CliRunner

    from dsv4kit.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def waiting_venv(venv: Path, *, when: str = "", marker: Optional[Path] = None, sleep: str = "") -> Path:
    """A box venv whose ``bin/python`` runs this interpreter (its venv kept: exec by its own path).

    With ``when``: a command line containing that text first touches ``marker`` and sleeps
    ``sleep`` seconds (a unique number, so the test can look for the process).
    """
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    wait = ""
    if when:
        wait = f'case "$*" in *{when}*) touch {marker}; sleep {sleep};; esac\n'
    python.write_text(f"#!/bin/sh\n{wait}exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return venv


def fake_tool(bin_dir: Path, name: str, marker: Path, sleep: str) -> Path:
    """An executable ``name`` in ``bin_dir`` that touches ``marker`` and sleeps (a tool that hangs)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\ntouch {marker}\nexec sleep {sleep}\n")
    tool.chmod(0o755)
    return tool


def running(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def interrupt(args: list[str], ready: Callable[[str, str], bool], *, env: Optional[dict] = None,
              timeout: float = 120) -> tuple[int, str, str]:
    """Run ``python -m dsv4kit.cli ARGS``; once ``ready(stdout, stderr)`` is true, send SIGINT.

    Returns (exit code, stdout, stderr). Fails when the process ends before it was ready.
    """
    proc = subprocess.Popen([sys.executable, "-m", "dsv4kit.cli", *args], cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda s=s, b=b: b.extend(iter(s.readline, "")), daemon=True)
               for s, b in ((proc.stdout, out), (proc.stderr, err))]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + timeout
        while not ready("".join(out), "".join(err)):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                for reader in readers:
                    reader.join(5)
                raise AssertionError(f"never reached the point to interrupt (exit {proc.returncode}):\n"
                                     f"{''.join(out)[-3000:]}\n{''.join(err)[-3000:]}")
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(5)
    return proc.returncode, "".join(out), "".join(err)
