"""What a systemd unit file gives its process: ``EnvironmentFile=``, ``Environment=`` and ``ExecStart=``.

Standard library only: besides the control machine, this runs on the box, inside the bench's
box-side helper (copied beside it) and the rollout report's script (from the installed dsv4kit).
Later assignments win, as in systemd; a ``-`` before an ``EnvironmentFile=`` path makes it optional.
"""

from __future__ import annotations

import os
import shlex


def read_env_file(path: str) -> dict:
    """``KEY=VALUE`` lines of an environment file (blank lines, ``#`` comments and quotes dropped). OSError if unreadable."""
    values = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip().strip('"').strip("'")
    return values


def read_unit(path: str) -> dict:
    """The unit at ``path``: ``env`` (files, then ``Environment=``, in file order), ``env_files`` read,
    ``missing_env_files`` (and ``missing_required_env_files``: those without ``-``, which stop the
    unit), ``env_file_mtimes`` and ``exec_start`` (argv, or the raw text if it does not split).
    OSError if the unit itself is unreadable."""
    with open(path) as fh:
        lines = fh.read().splitlines()
    unit = {"path": path, "env": {}, "env_files": [], "missing_env_files": [], "exec_start": None}
    for line in lines:
        key, _, value = line.partition("=")
        key = key.strip()
        if key == "EnvironmentFile":
            env_path = value.strip().lstrip("-")
            try:
                unit["env"].update(read_env_file(env_path))
                unit["env_files"].append(env_path)
                unit.setdefault("env_file_mtimes", {})[env_path] = round(os.path.getmtime(env_path), 2)
            except OSError:
                unit["missing_env_files"].append(env_path)
                if not value.strip().startswith("-"):  # systemd refuses to start the unit without it
                    unit.setdefault("missing_required_env_files", []).append(env_path)
        elif key == "Environment":
            for item in shlex.split(value):
                if "=" in item:
                    k, v = item.split("=", 1)
                    unit["env"][k] = v
        elif key == "ExecStart":
            try:
                unit["exec_start"] = shlex.split(value.strip().lstrip("-@+!"))
            except ValueError:
                unit["exec_start"] = value.strip()
    return unit
