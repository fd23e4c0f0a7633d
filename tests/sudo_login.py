"""A box as operators log in to it: a non-root login user who becomes root with sudo, over a real
loopback sshd, with sudo's own log in a file; and a watcher that reads every process's command line
and environment while Ansible runs, as any local user's ``ps`` (and root) can.

Needs root here (to add the user and the sudoers rule) and Debian's sudo (tests/run.sh installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.sshd import LoopbackSSHD


@dataclass
class SudoLogin:
    user: str
    sshd: LoopbackSSHD
    sudo_log: Path

    def host_vars(self) -> dict:
        """Inventory variables of a host reached as this user, becoming root with sudo."""
        return {"ansible_host": self.sshd.host, "ansible_port": self.sshd.port, "ansible_user": self.user,
                "ansible_ssh_private_key_file": str(self.sshd.client_key),
                "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.sshd.known_hosts} -o StrictHostKeyChecking=yes",
                "ansible_python_interpreter": "/usr/bin/python3", "ansible_become": True,
                "ansible_become_method": "sudo"}


@contextmanager
def sudo_login():
    """A fresh login user with passwordless sudo (logged to a file) and an sshd that lets it in."""
    if os.geteuid() != 0 or not shutil.which("sudo"):
        raise RuntimeError("a sudo login needs root and sudo here (tests/run.sh installs sudo)")
    user = f"d4op{uuid.uuid4().hex[:8]}"
    # Outside pytest's 0700 tree: sshd reads the authorized keys as the login user.
    root = Path(tempfile.mkdtemp(prefix="dsv4kit-sudo-"))
    sudoers = Path(f"/etc/sudoers.d/dsv4kit-test-{user}")
    sshd = None
    try:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", user], check=True, timeout=60)
        subprocess.run(["usermod", "-p", "*", user], check=True, timeout=60)  # "!" is a locked account to sshd
        log = root / "sudo.log"
        sudoers.write_text(f"Defaults:{user} logfile={log}\n{user} ALL=(ALL) NOPASSWD: ALL\n")
        sudoers.chmod(0o440)
        sshd = LoopbackSSHD(root / "sshd").start()
        for path, mode in ((root, 0o711), (root / "sshd", 0o711), (root / "sshd/authorized_keys", 0o644)):
            path.chmod(mode)
        yield SudoLogin(user, sshd, log)
    finally:
        if sshd:
            sshd.stop()
        sudoers.unlink(missing_ok=True)
        subprocess.run(["userdel", "--remove", user], capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def reachable_by(*paths: Path):
    """Let other users reach ``paths`` (the client's venv and interpreter, which may live under a
    0700 home here): every directory on the way gets search permission for others (``o+x``), only
    while the block runs; each mode is put back after."""
    changed = {}
    try:
        for path in paths:
            for directory in [p for p in (Path(os.path.realpath(path)), *Path(os.path.realpath(path)).parents)
                              if p.is_dir()]:
                mode = directory.stat().st_mode & 0o7777
                if not mode & 0o001 and directory not in changed:
                    changed[directory] = mode
                    directory.chmod(mode | 0o001)
        yield
    finally:
        for directory, mode in changed.items():
            directory.chmod(mode)


@dataclass
class ProcessWatch:
    """Reads /proc over and over; ``found`` lists where ``secret`` was seen, and by whom it was readable."""

    secret: str
    marker: str = "dsv4-health-wait"  # command lines holding it are kept in ``seen``
    interval: float = 0.02
    found: set = field(default_factory=set)
    seen: set = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def scan(self) -> None:
        me = os.getpid()
        secret = self.secret.encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                uid = os.stat(f"/proc/{entry}").st_uid
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            line = cmdline.replace(b"\0", b" ").decode(errors="replace")
            if self.marker in line:
                self.seen.add(line)
            if secret in cmdline:  # /proc/PID/cmdline: every local user reads it (ps)
                self.found.add(f"argv of pid {entry}: {line[:300]}")
            if secret in environ and uid != 0:  # readable by that (non-root) user
                self.found.add(f"environment of pid {entry} (uid {uid}): {line[:300]}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan()
            time.sleep(self.interval)

    @contextmanager
    def running(self):
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=30)
