#!/usr/bin/env python3
"""Read-only scan of apt's sources for the CUDA network repository; prints one JSON object.

Usage: cuda_apt_sources.py APT_ETC_DIR REPO_URL KEYRING REPO_MATCH

cuda-keyring (NVIDIA's documented route) writes a one-line `.list` source signed by KEYRING. apt
refuses to read its sources at all ("Conflicting values set for option Signed-By") when the same
repository appears again with another Signed-By (or none): an older deb822 `cuda.sources` signed by
/etc/apt/keyrings/cuda.asc, a hand-written line trusted through apt-key. This script sorts every
source that names a CUDA repository (a URI containing REPO_MATCH):
  keyring_sources  entries of REPO_URL signed by KEYRING (reused; never written a second time)
  remove           files that hold nothing but CUDA repository entries and are not those (legacy)
  blocking         files that mix CUDA entries with other repositories (not touched: named instead)
Standard library only (the box's system Python).
"""
import glob
import json
import os
import re
import sys


def norm(uri):
    return re.sub(r"^[a-z]+://", "", uri.strip()).rstrip("/")


def one_line_entries(path):
    """(uri, signed_by or None, enabled) of each `deb` line of a one-line-style file."""
    entries = []
    with open(path) as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if not line.startswith(("deb ", "deb-src ", "deb\t")):
                continue
            options = {}
            match = re.match(r"^(deb(?:-src)?)\s+\[([^\]]*)\]\s+(.*)$", line)
            if match:
                for option in match.group(2).split():
                    key, _, value = option.partition("=")
                    options[key.lower()] = value
                rest = match.group(3).split()
            else:
                rest = line.split()[1:]
            if rest:
                entries.append((rest[0], options.get("signed-by"), True))
    return entries


def deb822_entries(path):
    """(uri, signed_by or None, enabled) of each URI of each stanza of a deb822 file."""
    entries = []
    with open(path) as fh:
        text = fh.read()
    for stanza in re.split(r"\n\s*\n", text):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and key:
                fields[key] += "\n" + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "uris" not in fields:
            continue
        enabled = fields.get("enabled", "yes").lower() != "no"
        signed = fields.get("signed-by")
        if signed and "\n" in signed or (signed and signed.startswith("-----BEGIN")):
            signed = "(inline key)"
        for uri in fields["uris"].split():
            entries.append((uri, signed, enabled))
    return entries


def main(apt_dir, repo_url, keyring, repo_match):
    files = [os.path.join(apt_dir, "sources.list")]
    files += sorted(glob.glob(os.path.join(apt_dir, "sources.list.d", "*.list")))
    files += sorted(glob.glob(os.path.join(apt_dir, "sources.list.d", "*.sources")))
    ours = norm(repo_url)
    report = {"keyring_sources": [], "remove": [], "blocking": [], "signed_by_seen": {}}
    for path in files:
        if not os.path.isfile(path):
            continue
        entries = deb822_entries(path) if path.endswith(".sources") else one_line_entries(path)
        entries = [e for e in entries if e[2]]
        cuda = [e for e in entries if repo_match in e[0]]
        if not cuda:
            continue
        for uri, signed, _ in cuda:
            report["signed_by_seen"].setdefault(norm(uri), []).append({"file": path, "signed_by": signed})
        keyring_style = all(norm(uri) == ours and signed == keyring for uri, signed, _ in cuda)
        if keyring_style and path.endswith(".list") and not report["keyring_sources"]:
            report["keyring_sources"].append(path)
        elif len(cuda) == len(entries):
            report["remove"].append(path)
        else:
            report["blocking"].append(path)
    # Two Signed-By values for one repository: apt cannot read its sources until one goes.
    report["conflicting"] = sorted(uri for uri, seen in report["signed_by_seen"].items()
                                   if len({s["signed_by"] for s in seen}) > 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
