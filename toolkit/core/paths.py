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


#: The variable that moves the validation reports (``--results-dir`` wins over it).
RESULTS_DIR_ENV = "DSV4KIT_RESULTS_DIR"


#: The variable that moves the results git repository of bench and eval records (``--results-repo``
#: wins over it).
RESULTS_REPO_ENV = "DSV4KIT_RESULTS_REPO"

#: The defaults as the help texts and errors name them (docs/overview.md says why they are there).
RESULTS_DIR_DEFAULT_TEXT = f"${RESULTS_DIR_ENV}, else ~/.local/share/dsv4kit/validation"
RESULTS_REPO_DEFAULT_TEXT = f"${RESULTS_REPO_ENV}, else ~/.local/share/dsv4kit/results"


def _data_home() -> Path:
    """``$XDG_DATA_HOME/dsv4kit`` (``~/.local/share/dsv4kit``): this user's dsv4kit data."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "dsv4kit"


def default_results_dir() -> Path:
    """Where ``validate`` keeps its reports and ``provision``/``rollout plan`` look for them when no
    ``--results-dir`` is given: ``$DSV4KIT_RESULTS_DIR``, else ``$XDG_DATA_HOME/dsv4kit/validation``
    (``~/.local/share/dsv4kit/validation``). Never relative to the current directory, so every step
    finds the reports whichever directory it runs from."""
    moved = os.environ.get(RESULTS_DIR_ENV)
    if moved:
        return Path(moved).expanduser()
    return _data_home() / "validation"


def default_results_repo() -> Path:
    """The results git repository of bench and eval records when no ``--results-repo`` is given:
    ``$DSV4KIT_RESULTS_REPO``, else ``$XDG_DATA_HOME/dsv4kit/results`` (``~/.local/share/dsv4kit/results``).
    Never relative to the current directory: ``bench`` and ``eval`` write where ``records``,
    ``rollout plan`` and ``provision`` read, whichever directory each runs from."""
    moved = os.environ.get(RESULTS_REPO_ENV)
    if moved:
        return Path(moved).expanduser()
    return _data_home() / "results"


def results_repo_or_default(given: Optional[os.PathLike | str]) -> Path:
    """``given`` (the ``--results-repo`` option, ``~`` expanded) or :func:`default_results_repo`."""
    return Path(given).expanduser() if given is not None else default_results_repo()


def results_dir_or_default(given: Optional[Path]) -> Path:
    """``given`` (the ``--results-dir`` option, ``~`` expanded) or :func:`default_results_dir`.

    Abort(USAGE) when it names something that is not a directory (a file): nothing would be found
    there, nor written."""
    from dsv4kit.core import exitcodes
    from dsv4kit.core.exitcodes import Abort

    path = Path(given).expanduser() if given is not None else default_results_dir()
    if path.exists() and not path.is_dir():
        what = (f"--results-dir {str(given)!r}" if given is not None else
                f"${RESULTS_DIR_ENV} {os.environ[RESULTS_DIR_ENV]!r}" if os.environ.get(RESULTS_DIR_ENV) else
                f"the default results directory {str(path)!r}")
        raise Abort(exitcodes.USAGE, f"{what} is a file, not a directory: validation reports are kept in a "
                                     f"directory (give one with --results-dir DIR)")
    return path
