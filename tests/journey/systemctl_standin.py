"""``systemctl`` and ``journalctl`` on the simulated box: the rendered units really run.

Installed as two executables (:func:`install`) that run this file. State lives in
``$DSV4KIT_STANDIN_STATE`` (one JSON file per unit plus its journal), units are read from
``$DSV4KIT_STANDIN_UNITS``, then from the packages' unit directories (lib/systemd/system,
usr/lib/systemd/system) under ``$DSV4KIT_STANDIN_ROOT`` (the box's dpkg root), with the drop-ins of
``$DSV4KIT_STANDIN_UNITS/<unit>.d/*.conf`` (an empty ``Key=`` resets the list, as in systemd). A path
a unit names (its program, ``EnvironmentFile=``, ``WorkingDirectory=``) that exists under that root
is read there: a packaged unit's /usr/bin/prometheus is the package's file in the box's root. What
systemd does that the journey depends on:

- ``start``: refuses a unit whose required ``EnvironmentFile=`` is missing; reads the files and
  ``Environment=`` (later wins), runs each ``ExecStartPre=`` to completion (a failure fails the
  unit with its exit status), then ``ExecStart=`` under a supervisor that records its exit status;
  ``Type=oneshot`` runs to completion. Output goes to the unit's journal.
- the start limit: more than ``StartLimitBurst`` starts within ``StartLimitIntervalSec`` is
  refused with ``start-limit-hit``, manual starts included, until ``reset-failed``.
- ``show UNIT -p A,B``: ActiveState, SubState, Result, ExecMainStatus, ExecMainCode, NRestarts,
  MainPID, LoadState; a ``Restart=on-failure`` unit that exited non-zero is ``activating``/
  ``auto-restart`` (systemd would start it again after ``RestartSec``), others ``failed``.
- ``$VAR`` (a word alone: split on whitespace) and ``${VAR}`` in ``ExecStart=``, from the unit's environment.
- ``stop``, ``restart``, ``reload`` (SIGHUP to the main process, as the packaged units' ``ExecReload=``),
  ``is-active``, ``reset-failed``, ``enable``, ``is-enabled``, ``daemon-reload``.
- ``journalctl -u UNIT [-n N]``: the unit's journal.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def install(bin_dir: Path, state: Path, units: Path, root: Path | None = None) -> dict:
    """Write ``systemctl`` and ``journalctl`` into ``bin_dir``; returns the environment they need
    (``root``: the box's dpkg root, whose packaged units are found too)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    for name in ("systemctl", "journalctl"):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(HERE))} {name} \"$@\"\n")
        tool.chmod(0o755)
    env = {"DSV4KIT_STANDIN_STATE": str(state), "DSV4KIT_STANDIN_UNITS": str(units)}
    return {**env, "DSV4KIT_STANDIN_ROOT": str(root)} if root else env


def _state_dir() -> Path:
    return Path(os.environ["DSV4KIT_STANDIN_STATE"])


def _unit_path(name: str) -> Path:
    own = Path(os.environ["DSV4KIT_STANDIN_UNITS"]) / name
    root = os.environ.get("DSV4KIT_STANDIN_ROOT")
    if own.exists() or not root:
        return own
    packaged = [Path(root) / d / name for d in ("lib/systemd/system", "usr/lib/systemd/system")]
    return next((path for path in packaged if path.exists()), own)


def _on_root(path: str) -> str:
    """``path`` in the box's root where it is there (a packaged file), else as written."""
    root = os.environ.get("DSV4KIT_STANDIN_ROOT")
    if root and path.startswith("/") and os.path.lexists(root + path):
        return root + path
    return path


def _expand(argv: list[str], env: dict) -> list[str]:
    """systemd's variable expansion in a command line: ``$VAR`` alone splits, ``${VAR}`` does not."""
    out: list[str] = []
    for word in argv:
        alone = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if alone:
            out += env.get(alone.group(1), "").split()
        else:
            out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return out


def _load(name: str) -> dict:
    path = _state_dir() / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {"starts": [], "result": "success", "status": 0,
                                                               "restarts": 0}


def _save(name: str, state: dict) -> None:
    path = _state_dir() / f"{name}.json"
    path.with_suffix(".tmp").write_text(json.dumps(state))
    os.replace(path.with_suffix(".tmp"), path)


def _journal(name: str) -> Path:
    return _state_dir() / f"{name}.journal"


def parse_unit(name: str) -> dict:
    keys: dict = {}
    dropins = sorted((Path(os.environ["DSV4KIT_STANDIN_UNITS"]) / f"{name}.d").glob("*.conf"))
    for path in [_unit_path(name), *dropins]:
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";", "[")) or "=" not in line:
                continue
            key, value = (part.strip() for part in line.split("=", 1))
            if value:
                keys.setdefault(key, []).append(value)
            else:  # an empty assignment resets the list
                keys[key] = []
    return keys


def _environment(keys: dict) -> tuple[dict, str]:
    env = {"PATH": os.environ.get("DSV4KIT_STANDIN_PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
           "LANG": "C.UTF-8"}
    for value in keys.get("EnvironmentFile", []):
        path = _on_root(value.lstrip("-"))
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            if value.startswith("-"):
                continue
            return env, f"Failed to load environment files: {path}: No such file or directory"
        for line in lines:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k.strip()] = v.strip().strip('"').strip("'")
    for value in keys.get("Environment", []):
        for item in shlex.split(value):
            k, _, v = item.partition("=")
            env[k] = v
    return env, ""


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie of the supervisor counts as gone
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _fail(name: str, state: dict, result: str, status: int, message: str) -> int:
    state.update(result=result, status=status, pid=None, active="failed")
    _save(name, state)
    with open(_journal(name), "a") as fh:
        fh.write(message.rstrip() + "\n")
    print(f"Job for {name} failed because {message.splitlines()[0] if message else result}.\n"
          f"See \"systemctl status {name}\" and \"journalctl -xeu {name}\" for details.", file=sys.stderr)
    return 1


def start(name: str) -> int:
    if not _unit_path(name).exists():
        print(f"Failed to start {name}: Unit {name} not found.", file=sys.stderr)
        return 5
    keys = parse_unit(name)
    state = _load(name)
    if state.get("active") == "active" and _alive(state.get("pid")):
        return 0
    now = time.time()
    interval = float((keys.get("StartLimitIntervalSec") or ["10"])[-1])
    burst = int((keys.get("StartLimitBurst") or ["5"])[-1])
    state["starts"] = [t for t in state.get("starts", []) if now - t < interval]
    if len(state["starts"]) >= burst:
        return _fail(name, state, "start-limit-hit", state.get("status", 0),
                     f"{name}: Start request repeated too quickly.")
    state["starts"].append(now)
    if len(state["starts"]) > 1:
        state["restarts"] = state.get("restarts", 0) + 1
    env, problem = _environment(keys)
    if problem:
        return _fail(name, state, "resources", 0, f"{name}: {problem}")
    workdir = _on_root((keys.get("WorkingDirectory") or ["/"])[-1].lstrip("-"))
    with open(_journal(name), "a") as log:
        for pre in keys.get("ExecStartPre", []):
            done = subprocess.run(shlex.split(pre.lstrip("-+!@")), env=env, cwd=workdir, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=300)
            if done.returncode != 0 and not pre.startswith("-"):
                return _fail(name, state, "exit-code", done.returncode,
                             f"{name}: Control process exited, code=exited, status={done.returncode}/FAILURE")
        argv = _expand(shlex.split((keys.get("ExecStart") or [""])[-1].lstrip("-+!@")), env)
        argv[:1] = [_on_root(argv[0])] if argv else []
        if (keys.get("Type") or ["simple"])[-1] == "oneshot":
            done = subprocess.run(argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, timeout=300)
            if done.returncode != 0:
                return _fail(name, state, "exit-code", done.returncode,
                             f"{name}: Main process exited, code=exited, status={done.returncode}/FAILURE")
            state.update(active="active", result="success", status=0, pid=None, oneshot=True)
            _save(name, state)
            return 0
        status_file = _state_dir() / f"{name}.exit"
        status_file.unlink(missing_ok=True)
        supervisor = subprocess.Popen(
            [sys.executable, str(HERE), "_supervise", str(status_file), *argv], env=env, cwd=workdir,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    state.update(active="active", result="success", status=0, pid=supervisor.pid,
                 restart=(keys.get("Restart") or ["no"])[-1])
    _save(name, state)
    return 0


def _supervise(status_file: str, argv: list[str]) -> int:
    """Run the main process, record its exit status (systemd's ExecMainStatus), end with it."""
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: child.send_signal(s))
    code = child.wait()
    status = code if code >= 0 else 128 - code
    Path(status_file).write_text(str(status))
    return status


def _current(name: str) -> dict:
    """The unit's state now, after looking at its main process."""
    state = _load(name)
    if state.get("active") == "active" and state.get("pid") and not _alive(state["pid"]):
        status_file = _state_dir() / f"{name}.exit"
        status = int(status_file.read_text()) if status_file.exists() else 1
        state.update(pid=None, status=status, result="success" if status == 0 else "exit-code",
                     active="inactive" if status == 0 else "failed")
        with open(_journal(name), "a") as fh:
            fh.write(f"{name}: Main process exited, code=exited, status={status}\n")
        _save(name, state)
    return state


def show(name: str, props: list[str]) -> int:
    state = _current(name)
    loaded = _unit_path(name).exists()
    active = state.get("active", "inactive")
    sub = {"active": "exited" if state.get("oneshot") else "running", "failed": "failed"}.get(active, "dead")
    if active == "failed" and state.get("result") == "exit-code" and state.get("restart") == "on-failure":
        active, sub = "activating", "auto-restart"
    values = {"Id": name, "LoadState": "loaded" if loaded else "not-found", "ActiveState": active,
              "SubState": sub, "Result": state.get("result", "success"),
              "ExecMainStatus": str(state.get("status", 0)), "ExecMainCode": "1" if state.get("status") else "0",
              "NRestarts": str(state.get("restarts", 0)), "MainPID": str(_main_pid(state)),
              "UnitFileState": "enabled" if state.get("enabled") else "disabled"}
    for prop in props or list(values):
        print(f"{prop}={values.get(prop, '')}")
    return 0


def _main_pid(state: dict) -> int:
    """The main process's pid (the supervisor's child), as systemd's MainPID would be."""
    pid = state.get("pid")
    if not pid:
        return 0
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        return int(children[0]) if children else pid
    except OSError:
        return pid


def stop(name: str) -> int:
    state = _current(name)
    pid = state.get("pid")
    if pid and _alive(pid):
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.time() + 20
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    state.update(active="inactive", pid=None)
    _save(name, state)
    return 0


def reload(name: str) -> int:
    state = _current(name)
    pid = _main_pid(state)
    if state.get("active") != "active" or not pid:
        print(f"Job for {name} failed: unit is not active.", file=sys.stderr)
        return 1
    os.kill(pid, signal.SIGHUP)
    return 0


def systemctl(argv: list[str]) -> int:
    words = [a for a in argv if not a.startswith("--") and a not in ("-q",)]
    props: list[str] = []
    if "-p" in words:
        index = words.index("-p")
        props = words[index + 1].split(",")
        del words[index:index + 2]
    if not words:
        return 0
    verb, names = words[0], words[1:]
    if verb in ("daemon-reload", "enable", "disable"):
        for name in names:
            state = _load(name)
            state["enabled"] = verb == "enable"
            _save(name, state)
        return 0
    if verb == "is-enabled":
        print("enabled" if all(_load(n).get("enabled") for n in names) else "disabled")
        return 0
    if verb == "show":
        return max([show(name, props) for name in names] or [0])
    if verb == "is-active":
        states = [_current(name).get("active", "inactive") for name in names]
        print("\n".join(states))
        return 0 if all(s == "active" for s in states) else 3
    if verb == "reset-failed":
        code = 0
        for name in names:
            if not _unit_path(name).exists():
                print(f"Failed to reset failed state of unit {name}: Unit {name} not loaded.", file=sys.stderr)
                code = 1
                continue
            state = _current(name)
            state["starts"], state["result"] = [], "success"
            if state.get("active") == "failed":
                state["active"] = "inactive"
            _save(name, state)
        return code
    if verb == "start":
        return max(start(name) for name in names)
    if verb == "stop":
        return max(stop(name) for name in names)
    if verb == "restart":
        return max((stop(name), start(name))[1] for name in names)
    if verb == "reload":
        return max(reload(name) for name in names)
    print(f"systemctl stand-in: {verb} is not simulated", file=sys.stderr)
    return 1


def journalctl(argv: list[str]) -> int:
    unit = argv[argv.index("-u") + 1] if "-u" in argv else ""
    lines = int(argv[argv.index("-n") + 1]) if "-n" in argv else 10_000
    path = _journal(unit)
    text = path.read_text().splitlines() if path.exists() else []
    print("\n".join(text[-lines:]))
    return 0


if __name__ == "__main__":
    tool, rest = sys.argv[1], sys.argv[2:]
    if tool == "_supervise":
        sys.exit(_supervise(rest[0], rest[1:]))
    sys.exit(systemctl(rest) if tool == "systemctl" else journalctl(rest))
