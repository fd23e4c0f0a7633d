#!/usr/bin/env python3
"""Compare installed distributions with pinned requirement specs; print one JSON object.

Usage: verify_versions.py SPEC... (run with the venv's python). A spec "name==version" is
checked (the local label, e.g. +cu130, is ignored); other specs are reported only. Also reports
torch's CUDA version when torch is installed, without importing it when it is absent.
Exit 1 when a pinned version does not match.
"""
import importlib.metadata as metadata
import json
import re
import sys


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def main(specs):
    rows, bad = [], []
    for spec in specs:
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(==\s*([^;\s]+))?", spec)
        if not match:
            bad.append(spec)
            rows.append({"spec": spec, "error": "not a requirement spec"})
            continue
        name, wanted = match.group(1), match.group(4)
        try:
            installed = metadata.version(normalize(name))
        except metadata.PackageNotFoundError:
            installed = None
        ok = installed is not None and (wanted is None or installed.split("+")[0] == wanted.split("+")[0])
        rows.append({"spec": spec, "name": name, "wanted": wanted, "installed": installed, "ok": ok})
        if not ok:
            bad.append(spec)
    torch_cuda = None
    try:
        metadata.version("torch")
        import torch  # only when installed

        torch_cuda = torch.version.cuda
    except metadata.PackageNotFoundError:
        pass
    print(json.dumps({"packages": rows, "mismatched": bad, "torch_cuda": torch_cuda,
                      "python": "%d.%d.%d" % sys.version_info[:3]}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
