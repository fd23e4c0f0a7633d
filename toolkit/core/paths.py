"""Where this dsv4kit runs from, and checks on local output paths done before long work starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

#: The directory holding toolkit/, kernels/, playbooks/ when dsv4kit runs from a checkout (an
#: installed wheel has none of them there; callers check for what they need).
REPO_ROOT = Path(__file__).resolve().parents[2]  # toolkit/core/paths.py


def cannot_write(directory: Path) -> Optional[str]:
    """Why a file cannot be created (and removed) in ``directory``, or None when it can."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".dsv4kit-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return str(exc.strerror or exc)
    return None
