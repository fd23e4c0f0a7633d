"""Run the provisioning playbook (``playbooks/site.yml``) with ansible-playbook, and summarize it.

``run_playbook`` checks the inventory with ``dsv4kit.core.inventory`` first (bad input is an early
``InventoryError``), runs ansible-playbook with the repository's ``ansible.cfg``, streams every
line Ansible prints to ``progress`` (Ansible's own error text is never swallowed), and parses the
PLAY RECAP into a per-host summary. ``dsv4kit bench`` uses it to restart the serving units with
another context length: ``run_playbook(inv, tags=["sglang_service"],
extra_vars={"dsv4_context_length": N})``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from dsv4kit.core import exitcodes
from dsv4kit.core.paths import REPO_ROOT
from dsv4kit.core.inventory import InventoryError, load_inventory
from dsv4kit.provision.secrets import PlaybookSecrets

COUNTERS = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
_RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+" + r"\s+".join(rf"{c}=(?P<{c}>\d+)" for c in COUNTERS))
_TASK = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(?P<name>.*)\]")
_FATAL = re.compile(r"^(?:fatal|failed): \[(?P<host>[^\]]+?)(?: -> [^\]]+)?\]: (?P<kind>UNREACHABLE|FAILED)!")
# OpenSSH's refusal of a changed host key, and the removal line it suggests (inside Ansible's message;
# OpenSSH 9 quotes with ", older ones with ', and Ansible's JSON escapes a " as \").
_KEY_CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"
_KEYGEN_REMOVE = re.compile(r'ssh-keygen -f \\?["\'](?P<file>[^"\'\\]+)\\?["\'] -R \\?["\'](?P<name>[^"\'\\]+)\\?["\']')
_PATTERN_CHARS = set("*?:!&~[]^")
TAIL_LINES = 200
#: Tags Ansible gives a meaning of its own; always valid in --tags/--skip-tags.
SPECIAL_TAGS = ("all", "always", "never", "tagged", "untagged")


class ProvisionError(RuntimeError):
    """ansible-playbook or the playbook cannot be found, or a tag is unknown; ``exit_code`` says which."""

    def __init__(self, message: str, exit_code: int = exitcodes.ENVIRONMENT):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Failure:
    host: str
    task: str
    kind: str  # "FAILED" or "UNREACHABLE"


@dataclass
class PlaybookSummary:
    """What one ansible-playbook run did, per host (from its PLAY RECAP)."""

    hosts: dict[str, dict[str, int]]
    returncode: int
    command: list[str]
    duration_s: float
    failures: list[Failure] = field(default_factory=list)
    stdout_tail: str = ""
    timed_out: bool = False  # stopped by run_playbook's ``timeout``
    host_key_changed: dict = field(default_factory=dict)  # host -> (known_hosts, name) or None

    @property
    def unreachable(self) -> bool:
        return any(c["unreachable"] for c in self.hosts.values())

    @property
    def failed(self) -> bool:
        return self.returncode != 0 or self.unreachable or any(c["failed"] for c in self.hosts.values())

    @property
    def changed(self) -> int:
        return sum(c["changed"] for c in self.hosts.values())

    @property
    def exit_code(self) -> int:
        if self.unreachable:
            return exitcodes.UNREACHABLE
        if self.timed_out:
            return exitcodes.TIMEOUT
        if self.failed:
            return exitcodes.TOOL_FAILED
        return exitcodes.OK

    def to_dict(self) -> dict:
        return {
            "ok": not self.failed,
            "exit_code": self.exit_code,
            "ansible_returncode": self.returncode,
            "timed_out": self.timed_out,
            "duration_s": round(self.duration_s, 1),
            "hosts": self.hosts,
            "failures": [f.__dict__ for f in self.failures],
            "host_key_changed": sorted(self.host_key_changed),
            "command": self.command,
        }


def default_playbook() -> Path:
    return Path(os.environ.get("DSV4KIT_PLAYBOOK", REPO_ROOT / "playbooks" / "site.yml"))


def ansible_playbook_executable() -> str:
    """ansible-playbook next to this Python first (the venv dsv4kit runs in), then on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ansible-playbook")
    if found is None:
        raise ProvisionError("ansible-playbook not found: install ansible-core (pip install 'ansible-core>=2.16')")
    return found


def check_tools(playbook: Optional[os.PathLike | str] = None) -> Path:
    """The playbook, once it and ansible-playbook exist; ProvisionError (exit 5) naming what is missing."""
    ansible_playbook_executable()
    path = Path(playbook) if playbook is not None else default_playbook()
    if not path.is_file():
        raise ProvisionError(f"playbook {str(path)!r} not found (set DSV4KIT_PLAYBOOK or run from a dsv4kit checkout)")
    return path


def _collect_tags(node: Any, found: set[str]) -> None:
    """Every value of a ``tags`` key anywhere in a parsed playbook or task file."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "tags":
                found.update(_split([str(v) for v in value] if isinstance(value, list) else [str(value)]))
            else:
                _collect_tags(value, found)
    elif isinstance(node, list):
        for item in node:
            _collect_tags(item, found)


def playbook_tags(playbook: os.PathLike | str) -> list[str]:
    """The tags the playbook uses: its plays, roles and tasks, and the tasks of its roles."""
    import yaml

    playbook = Path(playbook)
    files = [playbook]
    roles = playbook.parent / "roles"
    if roles.is_dir():
        files += sorted(f for f in roles.glob("*/*/*.y*ml") if f.parent.name in ("tasks", "handlers"))
    found: set[str] = set()
    for file in files:
        try:
            _collect_tags(yaml.safe_load(file.read_text()), found)
        except (OSError, yaml.YAMLError) as exc:
            raise ProvisionError(f"cannot read the tags of {file}: {exc}") from None
    return sorted(found)


def check_tags(playbook: os.PathLike | str, *, tags: Optional[Iterable[str] | str] = None,
               skip_tags: Optional[Iterable[str] | str] = None) -> None:
    """Every --tags/--skip-tags name must be a tag of the playbook or one of Ansible's special tags.

    Ansible itself accepts any name and then runs (or skips) nothing: ``--skip-tags flash-attn``
    would skip nothing and start the hours-long build. ProvisionError (exit 2) names the bad tag.
    """
    known = playbook_tags(playbook)
    for option, values in (("--tags", tags), ("--skip-tags", skip_tags)):
        for name in _split(values):
            if name in known or name in SPECIAL_TAGS:
                continue
            hint = difflib.get_close_matches(name, known, n=1)
            raise ProvisionError(
                f"{option} {name!r} is not a tag of {playbook}"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + f"; valid tags: {', '.join(known)} (and Ansible's {', '.join(SPECIAL_TAGS)})",
                exit_code=exitcodes.USAGE)


def _split(values: Optional[Iterable[str] | str]) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def check_limit(inventory_path: os.PathLike | str, limit: Optional[Iterable[str] | str]) -> None:
    """Plain names in --limit must be hosts or groups of the inventory (patterns pass through)."""
    names = _split(limit)
    if not names:
        return
    inventory = load_inventory(inventory_path)
    known = set(inventory.hosts) | {g for h in inventory.hosts.values() for g in h.groups}
    for name in names:
        if _PATTERN_CHARS & set(name):
            continue
        if name not in known:
            inventory.host(name)  # raises InventoryError naming the known hosts
            raise InventoryError(f"{inventory.path}: --limit {name!r} matches no host or group")


def check_extra_vars(values: Optional[Iterable[str]]) -> list[str]:
    """``-e``/``--extra-vars`` as ansible-playbook takes them (``k=v ...``, JSON/YAML, ``@file``), checked.

    A ``dsv4_*`` name the schema does not know, or a value of the wrong type, is a ProvisionError
    (exit 2) naming it: extra vars win over the inventory, past its checks. ``k=v`` values are
    strings to Ansible, so a number or a list goes in the JSON form. Returns the values unchanged.
    """
    import yaml
    from ansible.parsing.splitter import parse_kv

    from dsv4kit.core.inventory_schema import FIELDS

    for value in values or []:
        text, parsed = str(value).strip(), None
        try:
            if text.startswith("@"):  # a YAML or JSON file
                parsed = yaml.safe_load(Path(os.path.expanduser(text[1:])).read_text())
            elif text[:1] in "{[":
                parsed = yaml.safe_load(text)
            else:
                parsed = parse_kv(text)
        except (OSError, yaml.YAMLError, ValueError) as exc:
            raise ProvisionError(f"-e {value!r}: cannot read it ({exc})", exit_code=exitcodes.USAGE) from None
        if not isinstance(parsed, dict):
            raise ProvisionError(f"-e {value!r}: not key=value pairs nor a JSON/YAML mapping",
                                 exit_code=exitcodes.USAGE)
        for name, item in parsed.items():
            if not str(name).startswith("dsv4_"):
                continue  # role knobs and Ansible's own variables: Ansible's to check
            if name not in FIELDS:
                hint = difflib.get_close_matches(str(name), FIELDS, n=1)
                raise ProvisionError(f"-e {value!r}: unknown field {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                                     + "; the schema is in toolkit/core/inventory_schema.py", exit_code=exitcodes.USAGE)
            kind = FIELDS[name][0]
            kinds = kind if isinstance(kind, tuple) else (kind,)
            if not isinstance(item, kinds) or (isinstance(item, bool) and bool not in kinds):
                raise ProvisionError(
                    f"-e {value!r}: {name} must be {' or '.join(k.__name__ for k in kinds)}, got "
                    f"{type(item).__name__} {item!r} (Ansible reads k=v values as strings: write "
                    f"-e '{{\"{name}\": ...}}' for a number, a boolean or a list)", exit_code=exitcodes.USAGE)
    return list(values or [])


def build_command(inventory_path, playbook, *, limit=None, tags=None, skip_tags=None, extra_vars=None,
                  check=False, diff=False, vault_ids=None, become_password_file=None,
                  vault_password_file=None, user_extra_vars=None, verbosity=0) -> list[str]:
    command = [ansible_playbook_executable(), "-i", str(inventory_path), str(playbook)]
    if verbosity:
        command.append("-" + "v" * min(int(verbosity), 6))
    for vault_id in vault_ids or []:
        command += ["--vault-id", str(vault_id)]
    if vault_password_file is not None:
        command += ["--vault-password-file", str(vault_password_file)]
    if become_password_file is not None:
        command += ["--become-password-file", str(become_password_file)]
    if _split(limit):
        command += ["--limit", ",".join(_split(limit))]
    if _split(tags):
        command += ["--tags", ",".join(_split(tags))]
    if _split(skip_tags):
        command += ["--skip-tags", ",".join(_split(skip_tags))]
    if extra_vars:
        command += ["--extra-vars", json.dumps(extra_vars)]
    for value in user_extra_vars or []:  # after dsv4kit's own: the user's word wins, as on Ansible's command line
        command += ["--extra-vars", str(value)]
    if check:
        command.append("--check")
    if diff:
        command.append("--diff")
    return command


def run_playbook(
    inventory_path: os.PathLike | str,
    *,
    limit: Optional[Iterable[str] | str] = None,
    tags: Optional[Iterable[str] | str] = None,
    skip_tags: Optional[Iterable[str] | str] = None,
    extra_vars: Optional[dict] = None,
    check: bool = False,
    diff: bool = False,
    progress: Callable[[str], None] = print,
    playbook: Optional[os.PathLike | str] = None,
    timeout: Optional[float] = None,
    secrets: Optional["PlaybookSecrets"] = None,
    user_extra_vars: Optional[Iterable[str]] = None,
    verbosity: int = 0,
) -> PlaybookSummary:
    """Run the playbook; stream its output to ``progress``; return the per-host summary.

    Raises InventoryError (bad inventory or --limit, nothing run), ProvisionError (no
    ansible-playbook or playbook: exit 5; a tag the playbook does not have: exit 2; nothing run),
    KeyboardInterrupt (after stopping ansible-playbook).
    A ``timeout`` (seconds) stops the whole run; the summary then fails with the timeout named.
    ``secrets`` (dsv4kit.provision.secrets) passes a become password and Vault secrets to Ansible.
    ``user_extra_vars``: the user's ``-e`` values (``check_extra_vars``), after ``extra_vars``;
    ``verbosity``: Ansible's ``-v`` count.
    """
    load_inventory(inventory_path)  # early, clear errors for a malformed inventory
    check_limit(inventory_path, limit)
    playbook = check_tools(playbook)
    check_tags(playbook, tags=tags, skip_tags=skip_tags)
    user_extra_vars = check_extra_vars(user_extra_vars)
    secret_args = secrets.command_args() if secrets is not None else {}
    command = build_command(inventory_path, playbook, limit=limit, tags=tags, skip_tags=skip_tags,
                            extra_vars=extra_vars, check=check, diff=diff, user_extra_vars=user_extra_vars,
                            verbosity=verbosity, **secret_args)
    env = dict(os.environ)
    env.setdefault("ANSIBLE_CONFIG", str(REPO_ROOT / "ansible.cfg"))
    env.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PYTHONUNBUFFERED": "1"})

    hosts: dict[str, dict[str, int]] = {}
    failures: list[Failure] = []
    key_changed: dict = {}
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    task = ""
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env=env, start_new_session=True)
    timed_out = threading.Event()
    timer = None
    if timeout is not None:
        def _stop() -> None:
            timed_out.set()
            _kill_group(proc)
        timer = threading.Timer(timeout, _stop)
        timer.daemon = True
        timer.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            progress(line)
            tail.append(line)
            if match := _TASK.match(line):
                task = match["name"]
            elif match := _FATAL.match(line):
                failure = Failure(match["host"], task, match["kind"])
                if failure not in failures:
                    failures.append(failure)
            if failures and _KEY_CHANGED in line:
                key_changed.setdefault(failures[-1].host, None)
            if failures and failures[-1].host in key_changed and (removal := _KEYGEN_REMOVE.search(line)):
                key_changed[failures[-1].host] = (removal["file"], removal["name"])
            elif match := _RECAP.match(line):
                hosts[match["host"]] = {c: int(match[c]) for c in COUNTERS}
        returncode = proc.wait()
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if secrets is not None:
            secrets.cleanup()  # the password files live only as long as the run
    if timed_out.is_set():
        message = f"dsv4kit: ansible-playbook stopped after the {timeout:.0f} s timeout"
        progress(message)
        tail.append(message)
        returncode = returncode or -signal.SIGTERM
    return PlaybookSummary(hosts=hosts, returncode=returncode, command=command,
                           duration_s=time.monotonic() - started, failures=failures,
                           stdout_tail="\n".join(tail), timed_out=timed_out.is_set(), host_key_changed=key_changed)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def format_summary(summary: PlaybookSummary) -> str:
    """The per-host table plus one line per failed task and a verdict line."""
    header = ("HOST", "OK", "CHANGED", "FAILED", "UNREACHABLE", "SKIPPED")
    rows = [header] + [
        (host, *(str(c[k]) for k in ("ok", "changed", "failed", "unreachable", "skipped")))
        for host, c in sorted(summary.hosts.items())
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    for failure in summary.failures:
        what = "unreachable" if failure.kind == "UNREACHABLE" else "failed"
        lines.append(f"{failure.host}: {what} at task [{failure.task}]")
    for host, where in sorted(summary.host_key_changed.items()):
        removal = (f"ssh-keygen -R '{where[1]}' -f {where[0]}" if where else "ssh-keygen -R <host> -f <known_hosts>")
        lines.append(f"{host}: its HOST KEY CHANGED (the box answers; ssh refuses the key it now presents: a "
                     f"reinstalled box, or a man-in-the-middle). Check the new key against the box's own "
                     f"(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on its console), then remove the old "
                     f"entry: {removal}")
    if not summary.hosts:
        lines.append("no PLAY RECAP: ansible-playbook stopped before running any host (see its output above)")
    if summary.unreachable:
        down = ",".join(sorted(h for h, c in summary.hosts.items() if c["unreachable"]))
        verdict = (f"unreachable host(s) {down} (any other hosts ran); once back: "
                   f"`dsv4kit provision --limit {down}`")
    elif summary.failed:
        verdict = f"failed (ansible-playbook exit {summary.returncode})"
    else:
        verdict = f"ok, {summary.changed} changed"
    lines.append(f"provision: {verdict} in {summary.duration_s:.0f} s")
    return "\n".join(lines)
