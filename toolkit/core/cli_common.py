"""What every ``dsv4kit`` command does the same way (docs/cli.md has the conventions):

* ``--json`` prints a machine-readable summary on stdout (progress and tables go to stderr);
* a file the command writes is ``--output PATH`` / ``-o PATH``, checked by :func:`check_output`
  before any work;
* the commands that reach a box (provision, validate, bench) check the inventory, the key file and
  known_hosts with :func:`check_hosts` before any work, with the same messages and exit codes;
* Ctrl-C says what was stopped and exits 130 (:func:`interruptible`, :func:`doing`);
* under ``--json`` a command that fails without having printed its JSON prints
  ``{"ok": false, "exit_code": N, "error": "..."}`` on stdout (:func:`interruptible`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional

import typer

from dsv4kit.core import exitcodes
from dsv4kit.core.exitcodes import Abort
from dsv4kit.core.paths import cannot_write

from dsv4kit.core.options import JSON_HELP, OUTPUT_HELP  # noqa: F401 - their one home is core.options


def fail(code: int, message: str) -> None:
    """Print ``error: message`` on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


# --------------------------------------------------------------------------- file outputs
def check_output(path: os.PathLike | str, option: str = "--output") -> Path:
    """``path`` as a Path once a file can be written there; Abort(USAGE) naming the problem.

    A directory, a missing parent directory (nothing is created), a parent that is a file, an
    existing read-only file or an unwritable directory are refused, before any work.
    """
    path = Path(path)
    shown = str(path)
    if path.is_dir():
        raise Abort(exitcodes.USAGE, f"{option} {shown!r} is a directory; give a file path")
    parent = path.absolute().parent
    if not parent.exists():
        raise Abort(exitcodes.USAGE, f"{option} {shown!r}: the directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise Abort(exitcodes.USAGE, f"{option} {shown!r}: {str(parent)!r} is not a directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise Abort(exitcodes.USAGE, f"{option} {shown!r} exists and is not writable")
    problem = cannot_write(parent)
    if problem:
        raise Abort(exitcodes.USAGE, f"{option} {shown!r}: cannot write into {str(parent)!r}: {problem}")
    return path


def deprecated(old: str, new: str) -> None:
    """One line on stderr for an old option spelling that still works."""
    typer.echo(f"warning: {old} is deprecated; use {new}", err=True)


# --------------------------------------------------------------------------- hosts, before work
def _uses_ssh(host) -> bool:
    return str(host.get("ansible_connection") or "ssh") in ("ssh", "paramiko", "smart")


def _check_key_file(host) -> None:
    key = host.key_file
    if key is None:
        return
    where = f"{host.origin('ansible_ssh_private_key_file')}: host {host.name!r}: ansible_ssh_private_key_file {str(key)!r}"
    if not key.exists():
        raise Abort(exitcodes.USAGE, f"{where} does not exist")
    if not key.is_file():
        raise Abort(exitcodes.USAGE, f"{where} is not a file")
    if not os.access(key, os.R_OK):
        raise Abort(exitcodes.USAGE, f"{where} is not readable by this user")


def _check_known_host(host, trust_new_host_key: Optional[bool]) -> None:
    """The host key of the box, and of every ProxyJump host on the way, is in known_hosts."""
    import paramiko

    from dsv4kit.core.ssh import RemoteError, resolve

    if trust_new_host_key:
        return  # an unknown key is recorded on connect; a changed one is still refused then
    known = host.known_hosts
    keys = paramiko.HostKeys()
    if known.is_file():
        try:
            keys.load(str(known))
        except Exception as exc:  # noqa: BLE001 - paramiko's InvalidHostKey is no SSHException
            raise Abort(exitcodes.USAGE, f"cannot read known_hosts {str(known)!r} (dsv4_known_hosts of host "
                                         f"{host.name!r}): {exc}; fix or remove the broken line") from None
    try:
        endpoint = resolve(host)
    except RemoteError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    for hop in [*endpoint.jumps, endpoint]:
        name = hop.known_hosts_name
        if keys.lookup(name):
            continue
        what = f"{host.name}" if hop is endpoint else f"jump host {hop.alias} of {host.name}"
        port = f"-p {hop.port} " if hop.port != 22 else ""
        raise Abort(exitcodes.UNREACHABLE,
                    f"the host key of {name} ({what}) is not in {known}: nothing was run. Record it once: "
                    f"ssh-keyscan {port}{hop.hostname} >> {known}, after checking its fingerprint against the "
                    f"box's own (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on the box)"
                    + (", or pass --trust-new-host-key" if trust_new_host_key is not None else ""))


def check_hosts(inventory: Optional[os.PathLike | str], *, host: Optional[str] = None,
                limit: Optional[Iterable[str]] = None, trust_new_host_key: Optional[bool] = False) -> list:
    """The hosts a command will reach, once the inventory, their key files and known_hosts are fine.

    ``host``: one host by name (None: the only host). ``limit``: provision's --limit (host or group
    names; any pattern, or none given, means every host). ``trust_new_host_key`` None: the command
    cannot trust new keys (the message then does not offer the flag).

    Abort(USAGE): inventory missing or malformed, unknown host, key file missing or unreadable.
    Abort(UNREACHABLE): a host's key is not in its known_hosts (and trusting new keys was not asked).
    """
    from dsv4kit.core.inventory import InventoryError, load_inventory

    try:
        inv = load_inventory(inventory)
        if limit is None:
            hosts = [inv.host(host)]
        else:
            hosts = limited_hosts(inv, limit)
    except InventoryError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    over_ssh = [target for target in hosts if _uses_ssh(target)]
    for target in over_ssh:  # every bad input (2) before any unknown key (3)
        _check_key_file(target)
    for target in over_ssh:
        _check_known_host(target, trust_new_host_key)
    return hosts


def limited_hosts(inv, limit: Iterable[str]) -> list:
    """The inventory's hosts that ``--limit`` names (all of them for a pattern or no limit)."""
    names = [part.strip() for value in limit for part in str(value).split(",") if part.strip()]
    if not names or any(set("*?:!&~[]^") & set(n) for n in names):
        return list(inv.hosts.values())
    picked = {}
    for name in names:
        for host in inv.hosts.values():
            if host.name == name or name in host.groups:
                picked[host.name] = host
    return list(picked.values())  # names that match nothing are refused by provision's own check


# --------------------------------------------------------------------------- Ctrl-C
_activity = {"doing": "starting", "left": "nothing was written"}


def doing(what: str, left: Optional[str] = None) -> None:
    """Say what the command is doing now (and what a Ctrl-C leaves behind), for the Ctrl-C message."""
    _activity["doing"] = what
    if left is not None:
        _activity["left"] = left


_interrupts = {"count": 0}


def _on_sigint(signum, frame) -> None:
    # Counted as well as raised: Ansible's (or any) __del__ that runs at that moment swallows the
    # KeyboardInterrupt ("Exception ignored in ..."), and the run must still end as interrupted.
    _interrupts["count"] += 1
    raise KeyboardInterrupt


def _interrupted(command: str) -> None:
    typer.echo(f"\ninterrupted: {command} stopped while {_activity['doing']}; {_activity['left']}", err=True)
    raise typer.Exit(exitcodes.INTERRUPTED)


def _run(fn: Callable, command: str, args, kwargs):
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_sigint) if main_thread else None
    _interrupts["count"] = 0
    try:
        result = fn(*args, **kwargs)
    except KeyboardInterrupt:
        _interrupted(command)
    except Abort as exc:
        if _interrupts["count"] and exc.exit_code != exitcodes.INTERRUPTED:
            _interrupted(command)
        fail(exc.exit_code, str(exc))
    except ModuleNotFoundError as exc:  # a package the command needs (torch for validate --local)
        from dsv4kit.core.missing import message

        if not exc.name or exc.name.split(".")[0] == "dsv4kit":
            raise
        fail(exitcodes.ENVIRONMENT, message(exc.name).removeprefix("error: "))
    except typer.Exit as exc:
        if _interrupts["count"] and exc.exit_code != exitcodes.INTERRUPTED:
            _interrupted(command)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if _interrupts["count"]:
        _interrupted(command)
    return result


class _Watched:
    """A text stream that remembers whether anything was written, and the last ``error:`` line."""

    def __init__(self, stream):
        self.stream, self.written, self.last_error = stream, False, ""

    def write(self, text: str) -> int:
        self.written = self.written or bool(text)
        for line in str(text).splitlines():
            if line.startswith(("error:", "interrupted:")):
                self.last_error = line.split(":", 1)[1].strip()
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def exit_name(code: int) -> str:
    """The name of an exit code (``usage``, ``unreachable``, ...), as the JSON envelope gives it."""
    names = {v: k.lower() for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    return names.get(code, "error")


def json_result(data: dict, code: int, error: Optional[str] = None) -> dict:
    """``data`` in the envelope every ``--json`` output shares: ``ok`` and ``exit_code`` always;
    on failure also ``exit`` (the code's name) and ``error`` (one line, or a pointer to stderr)."""
    out = {**data, "ok": code == exitcodes.OK, "exit_code": code}
    if code != exitcodes.OK:
        out["exit"] = exit_name(code)
        out["error"] = error or data.get("error") or f"exit {code}; see the messages on stderr"
    return out


def _error_object(code: int, message: str) -> dict:
    return json_result({}, code, message)


def usage_error_as_json(app) -> int:
    """Run the typer ``app`` (``--json`` given); an option click refuses also prints the JSON error
    object on stdout. Returns the exit code."""
    try:
        code = app(standalone_mode=False)
    except Exception as exc:  # typer's vendored click: its ClickException, by what it has
        if not (hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int)):
            if type(exc).__name__ == "Abort":  # Ctrl-C before the command started
                typer.echo("\ninterrupted", err=True)
                return exitcodes.INTERRUPTED
            raise
        exc.show()
        typer.echo(json.dumps(_error_object(exc.exit_code, exc.format_message()), indent=2))
        return exc.exit_code
    return code if isinstance(code, int) else 0


def interruptible(command: str, left: str = "nothing was written") -> Callable:
    """Decorate a command: Ctrl-C prints ``interrupted: <command> stopped while <doing>; <left>``
    and exits 130. Commands name their steps with :func:`doing`; an ``Abort`` becomes its exit code."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            _activity.update(doing="starting", left=left)
            if not kwargs.get("json_out"):
                return _run(fn, command, args, kwargs)
            out, err = _Watched(sys.stdout), _Watched(sys.stderr)
            sys.stdout, sys.stderr = out, err
            try:
                return _run(fn, command, args, kwargs)
            except typer.Exit as exc:
                if exc.exit_code and not out.written:
                    sys.stdout.write(json.dumps(_error_object(exc.exit_code, err.last_error), indent=2) + "\n")
                raise
            finally:
                sys.stdout, sys.stderr = out.stream, err.stream

        return run

    return wrap
