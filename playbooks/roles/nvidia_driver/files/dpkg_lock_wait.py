#!/usr/bin/env python3
"""Wait a bounded time for dpkg's lock, then name its holder; optionally run a dpkg command under it.

Usage: dpkg_lock_wait.py ROOT TIMEOUT [-- COMMAND ...]

Waits until no process holds ROOT/var/lib/dpkg/lock-frontend or ROOT/var/lib/dpkg/lock (apt,
dpkg, unattended-upgrades and packagekit all take them with fcntl), polling every second for at
most TIMEOUT seconds. With a COMMAND (a plain `dpkg -i`, which fails at once on a held lock), runs
it once the lock is free, and again while it fails on the lock, within the same TIMEOUT; its
output and exit status are passed through. On timeout: exit 75 and one line naming the lock,
the holder's PID and its command line. Standard library only (the box's system Python).
"""
import fcntl
import os
import struct
import subprocess
import sys
import time

LOCKS = ("var/lib/dpkg/lock-frontend", "var/lib/dpkg/lock")
TIMED_OUT = 75  # EX_TEMPFAIL
# struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (+ padding).
FLOCK = "hhqqi4x"


def holder(path):
    """PID holding a write lock on ``path`` (-1: an open-file-description lock), or None."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None  # no lock file yet: nobody holds it
    try:
        query = struct.pack(FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = struct.unpack(FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))
        return None if kind == fcntl.F_UNLCK else pid
    finally:
        os.close(fd)


def describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    return f"process {pid} ({command or 'command line unreadable'})" if pid > 0 else "another process"


def held(root):
    for lock in LOCKS:
        path = os.path.join(root, lock)
        pid = holder(path)
        if pid is not None:
            return path, pid
    return None


def wait(root, deadline):
    while True:
        busy = held(root)
        if busy is None or time.monotonic() >= deadline:
            return busy
        time.sleep(1)


def main(argv):
    root, timeout = argv[0], float(argv[1])
    command = argv[3:] if len(argv) > 2 and argv[2] == "--" else []
    started = time.monotonic()
    deadline = started + timeout
    while True:
        busy = wait(root, deadline)
        if busy is not None:
            path, pid = busy
            print(f"dpkg's lock {path} is still held after {time.monotonic() - started:.0f} s (the limit, "
                  f"dsv4_dpkg_lock_timeout) by {describe(pid)}. Nothing was installed. Wait for it to finish "
                  f"(unattended-upgrades: `systemctl status unattended-upgrades`, `tail /var/log/unattended-upgrades/"
                  f"unattended-upgrades.log`), then run `dsv4kit provision` again.", file=sys.stderr)
            return TIMED_OUT
        if not command:
            return 0
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0 or "lock" not in done.stderr or time.monotonic() >= deadline:
            sys.stdout.write(done.stdout)
            sys.stderr.write(done.stderr)
            return done.returncode
        time.sleep(1)  # taken again between the wait and the command: wait once more


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
