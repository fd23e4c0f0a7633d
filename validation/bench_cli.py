"""What the kernel benchmarks' command lines share: the parser, ``--render``, atomic writes, the PNG."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Optional


def new_parser(module: str, description: str) -> argparse.ArgumentParser:
    """The parser of ``python -m dsv4kit.validation.<module>``."""
    return argparse.ArgumentParser(prog=f"python -m dsv4kit.validation.{module}", description=description)


def render_file(path: str, render: Callable[[dict], str], verb: str = "render") -> int:
    """``--render JSON``: print ``render`` of a saved result; 0, or 2 naming the unreadable file."""
    try:
        with open(path) as fh:
            print(render(json.load(fh)), end="")
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: cannot {verb} {path}: {exc}", file=sys.stderr)
        return 2
    return 0


def write_text_atomic(path: str, text: str) -> None:
    """Write ``text`` so that an interrupted run never leaves a half-written file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json_atomic(path: str, payload: dict) -> None:
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def save_figure(figure: Callable[[dict], Any], payload: dict, path: str,
                log: Optional[Callable[[str], None]] = None) -> Optional[str]:
    """Save ``figure(payload)`` as a PNG at ``path``; None (said to ``log``) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if log:
            log("matplotlib is not installed: skipping the plot")
        return None
    fig = figure(payload)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
