"""Load the Ansible inventory that ``dsv4kit provision`` uses, for the other commands.

One file, one schema: the YAML inventory (``inventory/hosts.yml``) with ``group_vars/`` and
``host_vars/`` beside it, merged the way Ansible merges them (all < parent group < child group
< host), and every ``dsv4_*`` variable checked against ``dsv4kit.core.inventory_schema``. Errors name
the file, the host and the field.
"""

from __future__ import annotations

import difflib
import getpass
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from dsv4kit.core.inventory_schema import CONNECTION_FIELDS, FIELDS, REQUIRED

DEFAULT_INVENTORY = Path("inventory/hosts.yml")
GROUP_KEYS = {"hosts", "vars", "children"}


class InventoryError(ValueError):
    """The inventory is missing, malformed, or names something that does not exist."""


class VaultedValue(str):
    """An Ansible Vault value (``!vault |``) as written: its ciphertext, never decrypted here.

    Ansible decrypts it (``dsv4kit provision --ask-vault-pass`` / ``--vault-id``); the schema check
    accepts it for any field, since its type is only known once decrypted.
    """


class _InventoryLoader(yaml.SafeLoader):
    """yaml.SafeLoader that also reads Ansible's ``!vault`` tag."""


_InventoryLoader.add_constructor("!vault", lambda loader, node: VaultedValue(loader.construct_scalar(node)))


@dataclass
class Host:
    name: str
    groups: list[str]
    vars: dict[str, Any]
    source: Path

    def get(self, name: str, default: Any = None) -> Any:
        return self.vars.get(name, default)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.vars[name]
        except KeyError:
            raise InventoryError(f"{self.source}: host {self.name!r} has no value for {name!r}") from None

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host", self.name))

    @property
    def port(self) -> int:
        return int(self.vars.get("ansible_port", 22))

    @property
    def user(self) -> str:
        return str(self.vars.get("ansible_user") or getpass.getuser())

    @property
    def key_file(self) -> Optional[Path]:
        value = self.vars.get("ansible_ssh_private_key_file")
        return Path(os.path.expanduser(value)) if value else None

    @property
    def known_hosts(self) -> Path:
        return Path(os.path.expanduser(self.vars.get("dsv4_known_hosts", "~/.ssh/known_hosts")))

    @property
    def connect_timeout(self) -> float:
        return float(self.vars.get("dsv4_connect_timeout", 15))

    @property
    def venv_python(self) -> str:
        return f"{self['dsv4_venv_dir'].rstrip('/')}/bin/python"

    def check_connectable(self) -> None:
        """Raise InventoryError unless the key file (when one is named) exists and is readable."""
        key = self.key_file
        if key is not None and not key.is_file():
            raise InventoryError(
                f"{self.source}: host {self.name!r}: ansible_ssh_private_key_file {str(key)!r} does not exist"
            )


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, Host] = field(default_factory=dict)

    def host(self, name: Optional[str] = None) -> Host:
        """The named host, or the only host when ``name`` is None."""
        if name is None:
            if len(self.hosts) == 1:
                return next(iter(self.hosts.values()))
            raise InventoryError(
                f"{self.path}: {len(self.hosts)} hosts ({', '.join(self.hosts) or 'none'}); name one with --host"
            )
        if name not in self.hosts:
            hint = difflib.get_close_matches(name, self.hosts, n=1)
            raise InventoryError(
                f"{self.path}: no host named {name!r}; known hosts: {', '.join(self.hosts) or 'none'}"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
            )
        return self.hosts[name]


def default_inventory_path() -> Path:
    return Path(os.environ.get("DSV4KIT_INVENTORY", DEFAULT_INVENTORY))


def load_inventory(path: Optional[os.PathLike | str] = None) -> Inventory:
    path = Path(path) if path is not None else default_inventory_path()
    if not path.is_file():
        raise InventoryError(f"inventory file {str(path)!r} not found (pass --inventory PATH or set DSV4KIT_INVENTORY)")
    data = _read_yaml(path)
    if not isinstance(data, dict) or not data:
        raise InventoryError(f"{path}: expected a YAML mapping of groups (e.g. 'all:'), got {type(data).__name__}")

    base = path.parent
    inventory = Inventory(path=path)
    host_entries: dict[str, tuple[list[str], dict]] = {}
    # Each group's own vars (inline < group_vars/ file). "all" has its file even when the
    # inventory never spells out an "all:" group.
    group_vars: dict[str, dict] = {"all": _group_file_vars(base, "all")}

    def walk(group: str, body: Any, parents: list[str]) -> None:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise InventoryError(f"{path}: group {group!r} must be a mapping, got {type(body).__name__}")
        unknown = set(body) - GROUP_KEYS
        if unknown:
            raise InventoryError(f"{path}: group {group!r} has unknown key(s) {sorted(unknown)}; allowed: {sorted(GROUP_KEYS)}")
        chain = parents + [group]
        inline = body.get("vars") or {}
        if not isinstance(inline, dict):
            raise InventoryError(f"{path}: vars of group {group!r} must be a mapping")
        # Ansible: inventory-file group vars < group_vars/ files.
        group_vars[group] = {**inline, **_group_file_vars(base, group)}
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise InventoryError(f"{path}: hosts of group {group!r} must be a mapping of host names")
        for host, host_vars in hosts.items():
            host_vars = host_vars or {}
            if not isinstance(host_vars, dict):
                raise InventoryError(f"{path}: host {host!r} must map to variables, got {type(host_vars).__name__}")
            groups, previous = host_entries.get(str(host), ([], {}))
            host_entries[str(host)] = (groups + [g for g in chain if g not in groups], {**previous, **host_vars})
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise InventoryError(f"{path}: children of group {group!r} must be a mapping")
        for child, child_body in children.items():
            walk(str(child), child_body, chain)

    for group, body in data.items():
        walk(str(group), body, [] if group == "all" else ["all"])

    for host, (groups, inline_vars) in host_entries.items():
        merged: dict = {}
        for group in groups:  # "all" first, then parents before children, as walked
            merged.update(group_vars[group])
        merged.update(inline_vars)
        merged.update(_host_file_vars(base, host))
        _check_vars(path, host, merged)
        inventory.hosts[host] = Host(name=host, groups=groups, vars=merged, source=path)
    if not inventory.hosts:
        raise InventoryError(f"{path}: no hosts defined")
    return inventory


def _read_yaml(path: Path) -> Any:
    try:
        with open(path) as fh:
            return yaml.load(fh, Loader=_InventoryLoader)  # noqa: S506 - a SafeLoader plus !vault
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: not valid YAML: {exc}") from None


def _vars_files(directory: Path, name: str) -> list[Path]:
    files = [directory / f"{name}{ext}" for ext in (".yml", ".yaml", "")]
    found = [f for f in files if f.is_file()]
    folder = directory / name
    if folder.is_dir():
        found += sorted(p for p in folder.iterdir() if p.suffix in (".yml", ".yaml"))
    return found


def _load_vars_files(files: list[Path]) -> dict:
    merged: dict = {}
    for file in files:
        data = _read_yaml(file) or {}
        if not isinstance(data, dict):
            raise InventoryError(f"{file}: expected a mapping of variables")
        merged.update(data)
    return merged


def _group_file_vars(base: Path, group: str) -> dict:
    return _load_vars_files(_vars_files(base / "group_vars", group))


def _host_file_vars(base: Path, host: str) -> dict:
    return _load_vars_files(_vars_files(base / "host_vars", host))


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _check_vars(path: Path, host: str, values: dict) -> None:
    known = {**FIELDS, **CONNECTION_FIELDS}
    for name, value in values.items():
        if name not in known:
            if name.startswith("ansible_"):
                continue  # Ansible has many connection variables; it checks its own.
            hint = difflib.get_close_matches(name, known, n=1)
            raise InventoryError(
                f"{path}: host {host!r}: unknown field {name!r}"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + "; the schema is in toolkit/core/inventory_schema.py"
            )
        kind = known[name][0]
        if isinstance(value, VaultedValue):
            continue
        # bool is an int in Python; a YAML 'true' for an int field is a mistake worth naming.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,))):
            raise InventoryError(
                f"{path}: host {host!r}: field {name!r} must be {_type_name(kind)}, got {type(value).__name__} {value!r}"
            )
    missing = [name for name in REQUIRED if name not in values]
    if missing:
        raise InventoryError(f"{path}: host {host!r}: missing required field(s) {', '.join(missing)}")
    _check_layout(path, host, values)


def _check_layout(path: Path, host: str, values: dict) -> None:
    count = values.get("dsv4_gpu_count")
    split = {k: values.get(k) for k in ("dsv4_prefill_gpus", "dsv4_decode_gpus")}
    seen: set = set()
    for name, gpus in split.items():
        if gpus is None:
            continue
        for gpu in gpus:
            if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0 or (count is not None and gpu >= count):
                raise InventoryError(f"{path}: host {host!r}: {name} has {gpu!r}, not a GPU index in [0, {count})")
            if gpu in seen:
                raise InventoryError(f"{path}: host {host!r}: GPU {gpu} is in both the prefill and the decode set")
            seen.add(gpu)
    gpu = values.get("dsv4_validate_gpu")
    if gpu is not None and count is not None and not 0 <= gpu < count:
        raise InventoryError(f"{path}: host {host!r}: dsv4_validate_gpu {gpu} is not in [0, {count})")
    for name in ("dsv4_venv_dir", "dsv4_state_dir", "dsv4_prefix", "dsv4_model_path"):
        value = values.get(name)
        if value is not None and not str(value).startswith("/"):
            raise InventoryError(f"{path}: host {host!r}: {name} must be an absolute path, got {value!r}")
        # The systemd units and the box-side scripts use these paths as single words.
        if value is not None and any(c.isspace() or c in "\"'\\$`%" for c in str(value)):
            raise InventoryError(f"{path}: host {host!r}: {name} must not contain whitespace, quotes, '\\', "
                                 f"'$', '`' or '%' (systemd units use it unquoted), got {value!r}")
    for name in ("dsv4_health_timeout", "dsv4_package_timeout", "dsv4_connect_timeout"):
        value = values.get(name)
        if value is not None and value <= 0:
            raise InventoryError(f"{path}: host {host!r}: {name} must be a positive number of seconds, got {value!r}")
