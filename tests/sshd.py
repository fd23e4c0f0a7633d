"""A real OpenSSH server on 127.0.0.1 for the tests: its own host key and a throwaway client key.

Used by the remote-validation, provisioning and bench tests (fixture ``loopback_ssh`` in
``conftest.py``). It needs ``/usr/sbin/sshd`` (Debian's openssh-server) and runs as the current
user; logins are for that same user, by key only.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@dataclass
class LoopbackSSHD:
    root: Path
    host: str = "127.0.0.1"
    port: int = 0
    user: str = ""
    proc: subprocess.Popen | None = None
    extra_config: tuple = ()  # more sshd_config lines (e.g. SetEnv for a simulated box's login PATH)

    @property
    def client_key(self) -> Path:
        return self.root / "client_ed25519"

    @property
    def host_key(self) -> Path:
        return self.root / "host_ed25519"

    @property
    def known_hosts(self) -> Path:
        """A known_hosts file that trusts this server's host key (and nothing else)."""
        return self.root / "known_hosts"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    def host_key_line(self) -> str:
        key = self.host_key.with_suffix(".pub").read_text().split()
        return f"[{self.host}]:{self.port} {key[0]} {key[1]}\n"

    def start(self) -> "LoopbackSSHD":
        if not os.path.exists(SSHD):
            raise RuntimeError("sshd not found: install openssh-server (apt-get install openssh-server)")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.user = getpass.getuser()
        self.port = self.port or _free_port()
        _keygen(self.host_key)
        _keygen(self.client_key)
        authorized = self.root / "authorized_keys"
        authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        os.chmod(authorized, 0o600)
        self.known_hosts.write_text(self.host_key_line())
        config = self.root / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.host}",
                    f"HostKey {self.host_key}",
                    f"AuthorizedKeysFile {authorized}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",
                    "UsePAM no",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "Subsystem sftp internal-sftp",
                    "AcceptEnv LANG LC_*",
                    *self.extra_config,
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation directory
        with open(self.log, "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                    if sock.recv(64).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"sshd did not start listening on {self.host}:{self.port}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def ssh_argv(self, *command: str) -> list[str]:
        """An ``ssh`` command line that logs in with the client key and verifies the host key."""
        return [
            "ssh", "-p", str(self.port), "-i", str(self.client_key),
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", f"{self.user}@{self.host}", *command,
        ]
