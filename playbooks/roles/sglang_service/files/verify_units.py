#!/usr/bin/env python3
"""Verify systemd unit files: `systemd-analyze verify` when it exists, else a structural check.

Any line systemd-analyze prints fails the check (it warns about a misspelt key or a bad value and
still exits 0).

Usage: verify_units.py UNIT_FILE... ; prints one JSON object, exit 1 on a problem.
The structural check: [Unit], [Service] and [Install] sections; Description, ExecStart and
WantedBy present; ExecStart/ExecStartPre absolute and executable; EnvironmentFile absolute.
"""
import json
import re
import os
import shutil
import subprocess
import sys

_OTHER_UNIT_NOT_FOUND = re.compile(r"Unit [\w@.\\-]+\.(service|target|socket|mount) not found")


def structural(path):
    problems, sections, keys = [], set(), {}
    section = None
    with open(path) as fh:
        for number, raw in enumerate(fh, 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                sections.add(section)
                continue
            key, sep, value = line.partition("=")
            if not sep or section is None:
                problems.append(f"{path}:{number}: not KEY=VALUE inside a section: {line!r}")
                continue
            keys.setdefault((section, key.strip()), []).append(value.strip())
    for needed in ("Unit", "Service", "Install"):
        if needed not in sections:
            problems.append(f"{path}: no [{needed}] section")
    for section, key in (("Unit", "Description"), ("Service", "ExecStart"), ("Install", "WantedBy")):
        if (section, key) not in keys:
            problems.append(f"{path}: [{section}] has no {key}=")
    for key in ("ExecStart", "ExecStartPre"):
        for value in keys.get(("Service", key), []):
            exe = value.lstrip("-@:+!").split()[0] if value.strip() else ""
            if not exe.startswith("/"):
                problems.append(f"{path}: {key} {exe!r} is not an absolute path")
            elif not os.access(exe, os.X_OK):
                problems.append(f"{path}: {key} {exe} is not executable")
    for value in keys.get(("Service", "EnvironmentFile"), []):
        if not value.lstrip("-").startswith("/"):
            problems.append(f"{path}: EnvironmentFile {value!r} is not an absolute path")
    return problems


def main(paths):
    problems = []
    for path in paths:
        problems += structural(path)
    tool = shutil.which("systemd-analyze")
    analyzer_output = None
    if tool:
        proc = subprocess.run([tool, "verify", "--man=no", *paths], capture_output=True, text=True, timeout=120)
        analyzer_output = (proc.stdout + proc.stderr).strip()
        # systemd-analyze exits 0 on unknown keys and bad values ("Unknown key ..., ignoring"), so
        # every line it prints is a problem, whatever its exit code; except that units which name
        # each other are not installed in a scratch prefix, and "Unit ... not found" is about that
        # search path, not the files.
        problems += [line for line in analyzer_output.splitlines()
                     if line.strip() and not _OTHER_UNIT_NOT_FOUND.search(line)]
        if proc.returncode != 0 and not analyzer_output:
            problems.append(f"systemd-analyze verify exited {proc.returncode} without saying why")
    print(json.dumps({"checked": paths, "method": "systemd-analyze verify + structural" if tool else "structural",
                      "ok": not problems, "problems": problems, "systemd_analyze": analyzer_output}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
