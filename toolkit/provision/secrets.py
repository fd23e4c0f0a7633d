"""Secrets for ``dsv4kit provision``: a become (sudo) password and Ansible Vault secrets.

ansible-playbook runs in its own session without a terminal (so Ctrl-C reaches it as dsv4kit
decides), so it cannot prompt. ``PlaybookSecrets`` asks on dsv4kit's terminal instead and hands
the answers to ansible-playbook as files readable only by the user (``--become-password-file``,
``--vault-password-file``, ``--vault-id label@FILE``), removed when the run ends. ``--vault-id``
values naming a file or script pass through unchanged.
"""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional


@dataclass
class PlaybookSecrets:
    """What ``provision --ask-become-pass / --ask-vault-pass / --vault-id`` asked for."""

    become_password: Optional[str] = None
    vault_password: Optional[str] = None
    vault_ids: list[str] = field(default_factory=list)
    _directory: Optional[Path] = None

    @classmethod
    def ask(cls, *, ask_become_pass: bool = False, ask_vault_pass: bool = False,
            vault_ids: Optional[list[str]] = None, prompt: Callable[[str], str] = getpass.getpass) -> "PlaybookSecrets":
        secrets = cls(vault_ids=[])
        if ask_become_pass:
            secrets.become_password = prompt("BECOME password: ")
        if ask_vault_pass:
            secrets.vault_password = prompt("Vault password: ")
        for vault_id in vault_ids or []:
            label, _, source = vault_id.rpartition("@")
            if source == "prompt":  # ansible-playbook would prompt without a terminal: ask here
                secrets.vault_ids.append(f"{label}@" + "\0" + prompt(f"Vault password ({label or 'default'}): "))
            else:
                secrets.vault_ids.append(vault_id)
        return secrets

    def _write(self, name: str, value: str) -> Path:
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="dsv4kit-secrets-"))  # mode 0700
        path = self._directory / name
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as fh:
            fh.write(value + "\n")
        return path

    def command_args(self) -> dict:
        """Keyword arguments of dsv4kit.provision.playbook.build_command (files written on first use)."""
        ids = []
        for index, vault_id in enumerate(self.vault_ids):
            label, _, source = vault_id.rpartition("@")
            if source.startswith("\0"):
                ids.append(f"{label}@{self._write(f'vault-id-{index}', source[1:])}")
            else:
                ids.append(vault_id)
        return {
            "vault_ids": ids,
            "become_password_file": self._write("become", self.become_password) if self.become_password is not None else None,
            "vault_password_file": self._write("vault", self.vault_password) if self.vault_password is not None else None,
        }

    def cleanup(self) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
