"""The router's API key, read on the box by the process that sends it.

The provision role writes the key to a root-only file (``<dsv4_prefix>/etc/dsv4kit/router-secret.env``,
mode 0600, one ``DSV4_ROUTER_API_KEY=...`` line; the router unit reads the same file). The control
machine sends only that file's path (``$DSV4KIT_API_KEY_FILE``, not a secret). Each box-side process
that sends requests reads the file once: directly when it may (a root login), else through
``sudo -n cat`` (sudo's log shows the path, never the key), and keeps the key in its own memory: never
on a command line, never in an environment that another process of the login user can read
(``/proc/PID/environ``). No file there: the stack takes no key.

SGLang's bench client takes a key only from its environment (``OPENAI_API_KEY``). ``python -m
dsv4box.key MODULE ARGS...`` runs such a client: it reads the key from its stdin, puts it into its
own ``os.environ`` after it started (``/proc/PID/environ`` keeps the environment it was started
with, which has no key), and runs ``MODULE`` as ``__main__``. Standard library only.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

#: The environment variable that names the key file on the box (its path; the key is never sent).
KEY_FILE_VARIABLE = "DSV4KIT_API_KEY_FILE"
#: The key's line in that file (the router unit's ``EnvironmentFile``).
KEY_NAME = "DSV4_ROUTER_API_KEY"
#: How long ``sudo -n cat`` may take.
SUDO_TIMEOUT_S = 30.0


class KeyFileError(OSError):
    """The key file exists but could not be read or holds no key line (an OSError, so that a
    request that cannot send its key fails as one that could not be sent)."""


def parse(text: str, path: str) -> str:
    for line in text.splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and name.strip() == KEY_NAME:
            return value.strip()
    raise KeyFileError(f"{path} has no {KEY_NAME}= line")


def read_key_file(path: str) -> str:
    """The key in ``path``; "" when there is no such file (the stack takes no key). A file this
    login may not read is read with ``sudo -n cat``; KeyFileError names the fix when that fails."""
    try:
        with open(path, encoding="utf-8") as fh:
            return parse(fh.read(), path)
    except FileNotFoundError:
        return ""
    except PermissionError:
        pass
    try:
        done = subprocess.run(["sudo", "-n", "cat", "--", path], capture_output=True, text=True,
                              timeout=SUDO_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KeyFileError(f"cannot read the API key file {path} as {_login()}: sudo -n cat failed ({exc})") from None
    if done.returncode != 0:
        if "No such file" in done.stderr:
            return ""
        raise KeyFileError(f"cannot read the API key file {path} as {_login()} (root-only): `sudo -n cat` exited "
                           f"{done.returncode}: {done.stderr.strip()[-300:]}; give the login passwordless sudo "
                           f"(as provision needs) or log in as root")
    return parse(done.stdout, path)


def _login() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


@functools.lru_cache(maxsize=1)
def api_key() -> str:
    """This process's key: from the file ``$DSV4KIT_API_KEY_FILE`` names, read once; "" for none."""
    path = os.environ.get(KEY_FILE_VARIABLE)
    return read_key_file(path) if path else ""


def start_client(argv: list, **popen_kw) -> subprocess.Popen:
    """Start the Python client ``argv`` (``python -m MODULE ...``) with the key (if any) in its own
    ``os.environ`` only: under ``python -m dsv4box.key``, the key written to its stdin."""
    key = api_key()
    if not key or len(argv) < 3 or argv[1] != "-m":
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, **popen_kw)
    proc = subprocess.Popen([argv[0], "-m", f"{__package__ or 'dsv4box'}.key", *argv[2:]], stdin=subprocess.PIPE,
                            **popen_kw)
    try:
        line = key + "\n"
        proc.stdin.write(line if popen_kw.get("text") or popen_kw.get("universal_newlines") else line.encode())
    finally:
        proc.stdin.close()
    return proc


def main() -> None:
    """``python -m dsv4box.key MODULE ARGS...``: the key from stdin into this process's environment,
    then ``MODULE`` as ``__main__`` with ``ARGS``."""
    import runpy

    key = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)
    if key:
        os.environ["OPENAI_API_KEY"] = key
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
