"""The Ansible inventory, read by Ansible itself, for every dsv4kit command.

ansible-core's own inventory API reads it (``InventoryManager`` and ``VariableManager`` over a
``DataLoader``), so YAML and INI inventories, an inventory directory, ``group_vars/`` and
``host_vars/``, their precedence, Jinja values and Vault mean here what they mean to
``ansible-playbook``. Each host's variables are what ``ansible-inventory --list`` gives, with the
``dsv4_*`` and connection variables templated, then checked against
``dsv4kit.core.inventory_schema``. An error names the file (and line) that holds the bad value.

Vault: the secrets Ansible's configuration names (``ANSIBLE_VAULT_PASSWORD_FILE``,
``ANSIBLE_VAULT_IDENTITY_LIST`` or ansible.cfg; never a prompt), or ``vault_secrets``, decrypt
vaulted values; without a secret that opens it, a vaulted value stays a ``VaultedValue``.
"""

from __future__ import annotations

import contextlib
import difflib
import getpass
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from dsv4kit.core import speculative
from dsv4kit.core.inventory_schema import CONNECTION_FIELDS, FIELDS, REQUIRED

DEFAULT_INVENTORY = Path("inventory/hosts.yml")
#: The group playbooks/site.yml targets. When the inventory has it, hosts outside it (a bastion in
#: ``all``) are not dsv4kit's boxes: not read, not checked, not targeted, as for ansible-playbook.
BOX_GROUP = "dsv4_boxes"
_KNOWN = {**FIELDS, **CONNECTION_FIELDS}


class InventoryError(ValueError):
    """The inventory is missing, malformed, or names something that does not exist."""


class VaultedValue(str):
    """An Ansible Vault value no secret here opens: its ciphertext (or, for a value templated from
    one, the template), never decrypted. The schema check accepts it for any field, since its type
    is only known once decrypted; ``dsv4kit provision --ask-vault-pass`` / ``--vault-id`` hand
    Ansible the secret."""


@dataclass
class Host:
    name: str
    groups: list[str]
    vars: dict[str, Any]
    source: Path
    #: Where each variable's value was written: "path:line:column" (Ansible's own record).
    origins: dict[str, str] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.vars.get(name, default)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.vars[name]
        except KeyError:
            raise InventoryError(f"{self.source}: host {self.name!r} has no value for {name!r}") from None

    def origin(self, name: str) -> str:
        """The file (and line) that sets ``name`` for this host; the inventory when unknown."""
        return self.origins.get(name) or str(self.source)

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
                f"{self.origin('ansible_ssh_private_key_file')}: host {self.name!r}: "
                f"ansible_ssh_private_key_file {str(key)!r} does not exist"
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


def load_inventory(path: Optional[os.PathLike | str] = None, *, vault_secrets: Optional[list] = None) -> Inventory:
    """Every host of the inventory at ``path`` (a file or a directory), read by Ansible and checked.

    ``vault_secrets``: ``[(vault_id, ansible.parsing.vault.VaultSecret)]`` to use instead of the
    ones Ansible's configuration names. Raises InventoryError naming the file of the problem.
    """
    path = Path(path) if path is not None else default_inventory_path()
    if not path.is_file() and not path.is_dir():
        raise InventoryError(f"inventory file {str(path)!r} not found (pass --inventory PATH or set DSV4KIT_INVENTORY)")
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader

    loader = DataLoader()
    with _ansible_notes() as notes:
        try:
            secrets = vault_secrets if vault_secrets is not None else _configured_vault_secrets(loader)
            loader.set_vault_secrets(secrets)
            with _vault_context(secrets):
                return _read(path, loader, notes, secrets)
        except AnsibleError as exc:
            raise InventoryError(_ansible_message(exc, path)) from None


def _read(path: Path, loader, notes: list, secrets: list) -> Inventory:
    from ansible import constants as C
    from ansible.inventory.manager import InventoryManager
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    _forget_vars_files()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    _raise_parse_problems(path, notes)
    variables = VariableManager(loader=loader, inventory=manager)
    inventory = Inventory(path=path)
    order = {name: index for index, name in enumerate(manager.groups)}
    for entry in manager.get_hosts(BOX_GROUP if BOX_GROUP in manager.groups else "all"):
        context = variables.get_vars(host=entry, include_hostvars=True, stage="all")
        names = [n for n in context if n not in C.INTERNAL_STATIC_VARS and n not in ("hostvars", "omit")]
        templar = Templar(loader=loader, variables=context)
        values, origins = {}, {}
        groups = sorted((g for g in entry.get_groups()), key=lambda g: (g.depth, order.get(g.name, 0)))
        for raw_name in names:
            name = _plain(raw_name)
            origins[name] = (_origin(context[raw_name]) or _written_at(path, name, entry.name, groups)
                             or str(path))
            values[name] = _value(templar, context[raw_name], name, entry.name, origins[name], bool(secrets))
        host = Host(name=_plain(entry.name), groups=[_plain(g.name) for g in groups], vars=values, source=path,
                    origins=origins)
        _check_vars(host)
        inventory.hosts[host.name] = host
    if not inventory.hosts:
        raise InventoryError(f"{path}: no hosts defined" + (f" in group {BOX_GROUP}, the group the playbook targets"
                                                            if BOX_GROUP in manager.groups else ""))
    return inventory


def _forget_vars_files() -> None:
    """Ansible's group_vars/host_vars plugin remembers, per process, which files and directories
    it found; a second read here must see the files as they are now."""
    from ansible.plugins.vars import host_group_vars

    for cache in (getattr(host_group_vars, "FOUND", None), getattr(host_group_vars, "NAK", None)):
        if cache is not None:
            cache.clear()


# --------------------------------------------------------------------------- Ansible's own words
@contextlib.contextmanager
def _ansible_notes() -> Iterator[list]:
    """Ansible reports inventory problems as warnings on its display; collect them instead, as
    (text, exception or None), so that they become one error here (and nothing else prints)."""
    from ansible.utils.display import Display

    display, notes = Display(), []
    saved = {name: display.__dict__.get(name) for name in ("warning", "error_as_warning")}
    display.warning = lambda msg, *args, **kwargs: notes.append((str(msg), None))
    display.error_as_warning = lambda msg, exception, *args, **kwargs: notes.append((str(msg or ""), exception))
    try:
        yield notes
    finally:
        for name, value in saved.items():
            if value is None:
                display.__dict__.pop(name, None)
            else:
                display.__dict__[name] = value


def _raise_parse_problems(path: Path, notes: list) -> None:
    """An inventory file no Ansible plugin could read (Ansible warns and goes on with no hosts),
    or a group key Ansible skips, is an error here, in Ansible's words."""
    # Ansible's words: "Failed to parse inventory with 'yaml' plugin." and the exception.
    failures = [(re.search(r"with '([^']+)' plugin", msg), exc) for msg, exc in notes if exc is not None]
    failures = [(found.group(1) if found else "", exc) for found, exc in failures]
    unparsed = [msg[len("Unable to parse "):].rsplit(" as an inventory source", 1)[0]
                for msg, exc in notes if exc is None and msg.startswith("Unable to parse ")]
    problems = []
    for source in unparsed:
        # Ansible tried each inventory plugin; name the failures of the ones that fit the file's kind.
        yaml_like = Path(source).suffix in (".yml", ".yaml", ".json")
        mine = [(plugin, e) for plugin, e in failures if _failure_source(e) == source]
        fitting = [e for plugin, e in mine if plugin in (("yaml", "auto") if yaml_like else ("ini",))]
        fitting = fitting or [e for _, e in mine]
        reasons: dict[str, str] = {}
        for exc in fitting:
            where, message = _ansible_origin(exc), _ansible_text(exc)
            if message not in reasons or (where and ":" in where and ":" not in reasons[message]):
                reasons[message] = where or source
        kind = "a YAML" if yaml_like else "an INI"
        problems += [f"{where}: Ansible cannot read it as {kind} inventory: {message}"
                     for message, where in reasons.items()] or [f"{source}: no Ansible inventory plugin reads it"]
    problems += [f"{path}: {msg} (Ansible skips such a key; it is almost always a typo)"
                 for msg, exc in notes if exc is None and msg.startswith("Skipping unexpected key")]
    if problems:
        raise InventoryError("; ".join(problems))


def _failure_source(exc) -> Optional[str]:
    obj = getattr(exc, "obj", None)
    path = getattr(obj, "path", None)
    if path:
        return str(path)
    found = re.search(r"with source '([^']+)'>", str(getattr(obj, "description", "") or ""))
    return found.group(1) if found else None


def _ansible_text(exc) -> str:
    return " ".join(str(getattr(exc, "message", None) or exc).split())


def _ansible_origin(exc) -> Optional[str]:
    """Where Ansible says the error is: the first origin with a path along the exception's causes."""
    seen = exc
    while seen is not None:
        where = _origin(getattr(seen, "obj", None))
        if where and not where.startswith("<"):
            return where
        seen = seen.__cause__ or seen.__context__
    return None


def _ansible_message(exc, path: Path) -> str:
    """``origin: message`` for an AnsibleError (its origin: where Ansible says it is)."""
    return f"{_ansible_origin(exc) or path}: {_ansible_text(exc)}"


def _origin(value: Any) -> Optional[str]:
    from ansible._internal._datatag._tags import Origin  # ansible-core 2.19+: where each value came from

    origin = value if isinstance(value, Origin) else Origin.get_tag(value)
    if origin is None:
        return None
    return f"{origin.path}:{origin.line_num}" if origin.path and origin.line_num else (origin.path or origin.description)


def _written_at(path: Path, name: str, host: str, groups: list) -> Optional[str]:
    """``file:line`` of ``name`` for a value Ansible cannot tag with its origin (a YAML bool or
    null): the first vars file that sets it (host_vars, then the groups from the deepest to
    ``all``), else the inventory source itself. A value also set inline in the inventory file,
    which would win over group_vars, is named at the group_vars line: a place it is set, maybe
    not the winning one."""
    base = path if path.is_dir() else path.parent
    stems = [base / "host_vars" / host] + [base / "group_vars" / g.name for g in reversed(groups)]
    files: list[Path] = []
    for stem in stems:
        if stem.is_dir():
            files += sorted(f for f in stem.rglob("*") if f.is_file())
        files += [stem.with_name(stem.name + ext) for ext in ("", ".yml", ".yaml", ".json")
                  if stem.with_name(stem.name + ext).is_file()]
    files += [path] if path.is_file() else []
    key = re.compile(rf"""^\s*["']?{re.escape(name)}["']?\s*[:=]""")
    for candidate in files:
        try:
            lines = candidate.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            if key.match(line):
                return f"{candidate}:{number}"
    return None


# --------------------------------------------------------------------------- Vault
def _configured_vault_secrets(loader) -> list:
    """The secrets Ansible's configuration names (password file, identity list), never a prompt."""
    from ansible import constants as C
    from ansible.parsing.vault import get_file_vault_secret

    # Read now, not at import: the environment of this call counts, as for a fresh ansible-playbook.
    password_file = C.config.get_config_value("DEFAULT_VAULT_PASSWORD_FILE")
    sources = [("", password_file)] if password_file else []
    for identity in C.config.get_config_value("DEFAULT_VAULT_IDENTITY_LIST") or []:
        label, _, source = str(identity).rpartition("@")
        if source not in ("prompt", "prompt_ask_vault_pass"):
            sources.append((label, source))
    secrets = []
    for label, source in sources:
        secret = get_file_vault_secret(filename=source, vault_id=label or None, loader=loader)
        secret.load()
        secrets.append((label or C.DEFAULT_VAULT_IDENTITY, secret))
    return secrets


@contextlib.contextmanager
def _vault_context(secrets: list) -> Iterator[None]:
    """ansible-core 2.19+ decrypts a vaulted value when it is used, with the secrets of its
    process-wide context (ansible-playbook sets it once); set it for this read only."""
    from ansible.parsing.vault import VaultSecretsContext

    previous = VaultSecretsContext._current
    if previous is None:
        VaultSecretsContext._current = VaultSecretsContext(secrets)
    try:
        yield
    finally:
        VaultSecretsContext._current = previous


def _vaulted(value: Any) -> Optional[str]:
    from ansible.parsing.vault import VaultHelper

    return VaultHelper.get_ciphertext(value, with_tags=False)


def _undecryptable(exc: BaseException) -> bool:
    seen = exc
    while seen is not None:
        if "ndecryptable" in type(seen).__name__ or "undecryptable variable" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# --------------------------------------------------------------------------- values
def _value(templar, raw: Any, name: str, host: str, origin: str, have_secrets: bool) -> Any:
    """``raw`` as plain Python: templated when it is one of ours, else as Ansible holds it."""
    from ansible.errors import AnsibleError

    ciphertext = _vaulted(raw)
    if ciphertext is not None:  # a vaulted value itself: its plaintext, if a secret opens it
        try:
            return str.__str__(str(raw))
        except Exception as exc:  # noqa: BLE001 - no secret at all, or none that opens it
            if not have_secrets or _undecryptable(exc):
                return VaultedValue(ciphertext)
            raise InventoryError(f"{origin}: host {host!r}: {name}: cannot decrypt it with the vault secrets "
                                 f"given: {' '.join(str(exc).split())}") from None
    ours = name in _KNOWN or name.startswith("dsv4_")
    try:
        return _plain(templar.template(raw) if ours else raw)
    except AnsibleError as exc:
        if _undecryptable(exc):
            return VaultedValue(str(raw))  # templated from a vaulted value no secret opens
        message = " ".join(str(getattr(exc, "message", None) or exc).split())
        raise InventoryError(f"{origin}: host {host!r}: {name}: {message}") from None


def _plain(value: Any) -> Any:
    """Ansible's tagged values as the plain types the rest of dsv4kit (and yaml/json) expect."""
    if value is None or type(value) is bool or isinstance(value, VaultedValue):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if _vaulted(value) is not None:
        return str.__str__(str(value))  # decrypted on use (a secret opened it)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- the schema
def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _check_vars(host: Host) -> None:
    values = host.vars
    for name, value in values.items():
        if name not in _KNOWN:
            if name.startswith("ansible_"):
                continue  # Ansible has many connection variables; it checks its own.
            # Other names are the user's own (Jinja helpers, role variables), unless they look like
            # a misspelt connection variable ("ansbile_host").
            hint = difflib.get_close_matches(name, _KNOWN if name.startswith("dsv4_") else CONNECTION_FIELDS,
                                             n=1, cutoff=0.6 if name.startswith("dsv4_") else 0.85)
            if name.startswith("dsv4_") or hint:
                raise InventoryError(
                    f"{host.origin(name)}: host {host.name!r}: unknown field {name!r}"
                    + (f" (did you mean {hint[0]!r}?)" if hint else "")
                    + "; the schema is in toolkit/core/inventory_schema.py"
                )
            continue
        kind = _KNOWN[name][0]
        if isinstance(value, VaultedValue):
            continue
        if name in CONNECTION_FIELDS and isinstance(value, str):
            value = values[name] = _connection_value(value, kind)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # bool is an int in Python; a YAML 'true' for an int field is a mistake worth naming.
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kinds):
            raise InventoryError(
                f"{host.origin(name)}: host {host.name!r}: field {name!r} must be {_type_name(kind)}, "
                f"got {type(value).__name__} {value!r}"
            )
    missing = [name for name in REQUIRED if name not in values]
    if missing:
        raise InventoryError(f"{host.source}: host {host.name!r}: missing required field(s) {', '.join(missing)}")
    _check_layout(host)


def _connection_value(value: str, kind) -> Any:
    """An INI ``[group:vars]`` value is a string; Ansible converts its own connection variables as
    it uses them (``ansible_become=true``, ``ansible_port=2222``), and so does this. Left as is
    when Ansible would not convert it either (the type check then names it)."""
    from ansible.module_utils.parsing.convert_bool import boolean

    try:
        if kind is bool:
            return boolean(value, strict=True)
        if kind is int:
            return int(value)
    except (TypeError, ValueError):
        pass
    return value


def _check_layout(host: Host) -> None:
    values, name_of = host.vars, host.name
    count = values.get("dsv4_gpu_count")
    seen: set = set()
    for name in ("dsv4_prefill_gpus", "dsv4_decode_gpus"):
        gpus = values.get(name)
        if gpus is None or isinstance(gpus, VaultedValue):
            continue
        if not gpus:  # the units would start SGLang with --tp 0
            raise InventoryError(f"{host.origin(name)}: host {name_of!r}: {name} is empty: dsv4kit serves with "
                                 f"prefill and decode disaggregated (PD), one server on each GPU set, so each needs "
                                 f"at least one GPU (one TP={count} server without PD is not supported)")
        for gpu in gpus:
            if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0 or (count is not None and gpu >= count):
                raise InventoryError(f"{host.origin(name)}: host {name_of!r}: {name} has {gpu!r}, "
                                     f"not a GPU index in [0, {count})")
            if gpu in seen:
                raise InventoryError(f"{host.origin(name)}: host {name_of!r}: GPU {gpu} is in both the prefill "
                                     f"and the decode set")
            seen.add(gpu)
    gpu = values.get("dsv4_validate_gpu")
    if isinstance(gpu, int) and isinstance(count, int) and not 0 <= gpu < count:
        raise InventoryError(f"{host.origin('dsv4_validate_gpu')}: host {name_of!r}: dsv4_validate_gpu {gpu} "
                             f"is not in [0, {count})")
    context, most = values.get("dsv4_context_length"), values.get("dsv4_model_max_context_length")
    if isinstance(context, int) and isinstance(most, int) and context > most:
        raise InventoryError(f"{host.origin('dsv4_context_length')}: host {name_of!r}: dsv4_context_length "
                             f"{context} exceeds the model's maximum, dsv4_model_max_context_length {most} "
                             f"({host.origin('dsv4_model_max_context_length')})")
    fp4 = values.get("dsv4_fp4_indexer")
    if isinstance(fp4, str) and fp4.strip().lower() != "auto":
        raise InventoryError(f"{host.origin('dsv4_fp4_indexer')}: host {name_of!r}: dsv4_fp4_indexer must be true, "
                             f"false or 'auto', got {fp4!r}")
    found = speculative.problem(values)  # the model and speculative choice, as SGLang 0.5.23 checks it
    if found:
        raise InventoryError(f"{host.origin(found[0])}: host {name_of!r}: {found[1]}")
    for name in ("dsv4_venv_dir", "dsv4_state_dir", "dsv4_prefix", "dsv4_model_path"):
        value = values.get(name)
        if value is None or isinstance(value, VaultedValue):
            continue
        if not str(value).startswith("/"):
            raise InventoryError(f"{host.origin(name)}: host {name_of!r}: {name} must be an absolute path, "
                                 f"got {value!r}")
        # The systemd units and the box-side scripts use these paths as single words.
        if any(c.isspace() or c in "\"'\\$`%" for c in str(value)):
            raise InventoryError(f"{host.origin(name)}: host {name_of!r}: {name} must not contain whitespace, "
                                 f"quotes, '\\', '$', '`' or '%' (systemd units use it unquoted), got {value!r}")
    for name in ("dsv4_health_timeout", "dsv4_package_timeout", "dsv4_connect_timeout"):
        value = values.get(name)
        if isinstance(value, (int, float)) and value <= 0:
            raise InventoryError(f"{host.origin(name)}: host {name_of!r}: {name} must be a positive number of "
                                 f"seconds, got {value!r}")
