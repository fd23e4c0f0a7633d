#!/usr/bin/env python3
"""Wait for an SGLang server and check that what it reports is what was configured.

Usage:
  dsv4_health_wait.py --url http://127.0.0.1:30002 [--path /server_info] --timeout 1800
                      [--expect KEY=VALUE ...] [--pid PID --expect-env NAME=VALUE ...]

Polls GET URL+PATH every 5 s until it answers 200 with a JSON object (or the timeout passes),
then compares each --expect KEY with the reported value (as strings; server_info reports the
resolved server arguments, e.g. context_length), and each --expect-env NAME with the environment
of process PID (the unit's main process: the kernel flags must be in it). Prints one JSON object;
exit 0 when everything matches, 1 on a mismatch, 4 on timeout. Standard library only.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def pairs(values):
    out = {}
    for value in values or []:
        key, sep, wanted = value.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {value!r}")
        out[key] = wanted
    return out


def fetch(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
    try:
        return json.loads(body)
    except ValueError:  # a plain-text health endpoint: answering 200 is the signal
        return {}


def process_env(pid):
    with open(f"/proc/{pid}/environ", "rb") as fh:
        items = fh.read().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in items if b"=" in item)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--path", default="/server_info")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--interval", type=float, default=5)
    parser.add_argument("--expect", action="append")
    parser.add_argument("--pid", type=int)
    parser.add_argument("--expect-env", action="append")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/") + args.path
    deadline = time.monotonic() + args.timeout
    last_error = "no answer yet"
    while True:
        try:
            info = fetch(url)
            break
        except (urllib.error.URLError, OSError) as exc:
            last_error = str(exc)
        if time.monotonic() >= deadline:
            print(json.dumps({"url": url, "ok": False, "error": f"timed out after {args.timeout:.0f} s: {last_error}"}))
            return 4
        time.sleep(args.interval)
    mismatches = []
    for key, wanted in pairs(args.expect).items():
        got = info.get(key) if isinstance(info, dict) else None
        if str(got) != wanted:
            mismatches.append(f"{key}: server reports {got!r}, configured {wanted!r}")
    if args.expect_env:
        try:
            env = process_env(args.pid)
        except (OSError, TypeError) as exc:
            env = {}
            mismatches.append(f"cannot read the environment of pid {args.pid}: {exc}")
        for name, wanted in pairs(args.expect_env).items():
            if env and env.get(name) != wanted:
                mismatches.append(f"env {name}: process has {env.get(name)!r}, configured {wanted!r}")
    print(json.dumps({"url": url, "ok": not mismatches, "mismatches": mismatches,
                      "version": info.get("version") if isinstance(info, dict) else None}))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
