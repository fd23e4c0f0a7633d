#!/usr/bin/env python3
"""Wait for an SGLang server (or the router) and check that what it reports is what was configured.

Usage:
  dsv4_health_wait.py --url http://127.0.0.1:30002 [--path /server_info] --timeout 1800
                      [--unit dsv4-decode.service] [--expect KEY=VALUE ...]
                      [--pid PID --expect-env NAME=VALUE ...] [--generate] [--api-key-file PATH]

Polls GET URL+PATH every 5 s until it answers 200 (or the timeout passes). With --unit, every
poll also reads the unit's state from systemd: a unit that failed, or crashed and waits for its
automatic restart, ends the wait at once, naming the unit, its exit status and the last journal
lines (exit 1). Then each --expect KEY is compared with the reported value (as strings;
server_info reports the resolved server arguments), each --expect-env NAME with the environment
of process PID, and --generate sends one tiny POST /generate through URL, again every poll until
it answers 200 with text or the timeout passes. For the router, that /generate is what says ready:
sglang-router 0.3.2's /readiness keeps answering 200 after a worker died, so it only gates the
first try. --api-key-file names the router's root-only key file (``DSV4_ROUTER_API_KEY=...``, the
one the router unit reads) whose key is sent (Authorization: Bearer); the key never travels on a
command line or in an environment, where other users, sudo's log and ``ansible -vvv`` would see it.
A 401 or 403 at any step ends the wait at once (exit 1): a wrong key never starts to work.
Prints one JSON object; exit 0 when everything matches, 1 on a failure, 4 on timeout.
Standard library only.
"""
import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

JOURNAL_LINES = 20
KEY_NAME = "DSV4_ROUTER_API_KEY"


def pairs(values):
    out = {}
    for value in values or []:
        key, sep, wanted = value.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {value!r}")
        out[key] = wanted
    return out


def request(url, key, body=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as response:
        raw = response.read()
    try:
        return json.loads(raw)
    except ValueError:  # a plain-text health endpoint: answering 200 is the signal
        return {}


def unit_state(unit):
    """systemd's view of ``unit`` (ActiveState, SubState, Result, ExecMainStatus, ...), or {} if unreadable."""
    props = "ActiveState,SubState,Result,ExecMainStatus,ExecMainCode,NRestarts"
    try:
        out = subprocess.run(["systemctl", "show", unit, "-p", props], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)


def unit_failure(unit):
    """Why ``unit`` will not answer (failed, or crashed and waiting to restart), or None while it may."""
    state = unit_state(unit)
    if state.get("ActiveState") != "failed" and state.get("SubState") != "auto-restart":
        return None
    try:
        journal = subprocess.run(["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        journal = f"(journalctl: {exc})"
    how = "failed" if state.get("ActiveState") == "failed" else "exited and waits for its automatic restart"
    return (f"{unit} {how}: result {state.get('Result', '?')}, exit status {state.get('ExecMainStatus', '?')}"
            f" (restarts so far: {state.get('NRestarts', '?')}); last journal lines:\n{journal}")


def process_env(pid):
    with open(f"/proc/{pid}/environ", "rb") as fh:
        items = fh.read().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in items if b"=" in item)


def read_key(path):
    """The DSV4_ROUTER_API_KEY value of the env file at ``path``; a missing file is an error."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            name, sep, value = line.strip().partition("=")
            if sep and name.strip() == KEY_NAME:
                return value.strip()
    raise ValueError(f"{path} has no {KEY_NAME}= line")


def refused(url, exc):
    """A 401/403: the key is wrong (or missing), which waiting never fixes. Prints and exits 1."""
    if exc.code in (401, 403):
        print(json.dumps({"url": url, "ok": False, "error": f"HTTP {exc.code}: the server refuses the API key "
                          f"(wrong or missing; the servers and the router take dsv4_router_api_key)"}))
        raise SystemExit(1)


def generated(base, key, args, deadline):
    """None once one tiny /generate through ``base`` answers 200 with text; else why not (at the deadline)."""
    body = {"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    while True:
        try:
            answer = request(base + "/generate", key, body)
            if isinstance(answer, dict) and "text" in answer:
                return None
            problem = f"answered without text: {str(answer)[:300]}"
        except urllib.error.HTTPError as exc:
            refused(base + "/generate", exc)
            problem = f"answered {exc.code}: {exc.read().decode(errors='replace')[:300]}"
        except (urllib.error.URLError, OSError) as exc:
            problem = f"failed: {exc}"
        if time.monotonic() >= deadline:
            return (f"POST {base}/generate {problem} (until the timeout of {args.timeout:.0f} s; {args.path} "
                    f"answered 200, which the router keeps answering with a dead worker: the /generate decides)")
        time.sleep(args.interval)


def wait_for(url, args, key):
    """The JSON answer of URL once it is 200; raises SystemExit with the printed outcome otherwise."""
    deadline = time.monotonic() + args.timeout
    last_error = "no answer yet"
    while True:
        if args.unit:
            failure = unit_failure(args.unit)
            if failure:
                print(json.dumps({"url": url, "ok": False, "unit": args.unit, "error": failure}))
                raise SystemExit(1)
        try:
            return request(url, key)
        except urllib.error.HTTPError as exc:
            refused(url, exc)
            last_error = str(exc)
        except (urllib.error.URLError, OSError) as exc:
            last_error = str(exc)
        if time.monotonic() >= deadline:
            print(json.dumps({"url": url, "ok": False, "error": f"timed out after {args.timeout:.0f} s: {last_error}"}))
            raise SystemExit(4)
        time.sleep(args.interval)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--path", default="/server_info")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--interval", type=float, default=5)
    parser.add_argument("--unit")
    parser.add_argument("--expect", action="append")
    parser.add_argument("--pid", type=int)
    parser.add_argument("--expect-env", action="append")
    parser.add_argument("--generate", action="store_true")
    parser.add_argument("--api-key-file")
    args = parser.parse_args(argv)
    try:
        key = read_key(args.api_key_file) if args.api_key_file else ""
    except (OSError, ValueError) as exc:
        print(json.dumps({"url": args.url, "ok": False, "error": f"cannot read the API key: {exc}"}))
        return 1
    base = args.url.rstrip("/")
    url = base + args.path
    try:
        info = wait_for(url, args, key)
    except SystemExit as done:
        return done.code
    mismatches = []
    for name, wanted in pairs(args.expect).items():
        got = info.get(name) if isinstance(info, dict) else None
        if str(got) != wanted:
            mismatches.append(f"{name}: server reports {got!r}, configured {wanted!r}")
    if args.expect_env:
        try:
            env = process_env(args.pid)
        except (OSError, TypeError) as exc:
            env = {}
            mismatches.append(f"cannot read the environment of pid {args.pid}: {exc}")
        for name, wanted in pairs(args.expect_env).items():
            if env and env.get(name) != wanted:
                mismatches.append(f"env {name}: process has {env.get(name)!r}, configured {wanted!r}")
    if args.generate and not mismatches:
        try:
            problem = generated(base, key, args, time.monotonic() + args.timeout)
        except SystemExit as done:
            return done.code
        if problem:
            print(json.dumps({"url": url, "ok": False, "error": problem, "ready_by": "/generate"}))
            return 4
    print(json.dumps({"url": url, "ok": not mismatches, "mismatches": mismatches,
                      "version": info.get("version") if isinstance(info, dict) else None,
                      "ready_by": "/generate" if args.generate else args.path}))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
