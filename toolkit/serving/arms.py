"""A/B arms (``bench --ab KEY=A,B``, ``eval --ab``): the spec and the restart settings of each arm.

``dsv4kit bench`` and ``dsv4kit eval`` use the same pieces: ``ABSpec``, ``parse_ab``,
``arm_extra_vars``, ``default_apply_arm``. The bench's verdict between the arms of one record is
``dsv4kit.bench.assembly.arm_comparison``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from dsv4kit.core import exitcodes
from dsv4kit.serving.abort import ServingAbort
from dsv4kit.serving.remote import RESTART_TAG


#: Inventory settings of the serving units an A/B may change (lower-case keys), with their values.
SETTINGS = {"dsv4_fp4_indexer": ("false", "true")}
_BOOL_SPELLINGS = {"true": "true", "1": "true", "false": "false", "0": "false"}


@dataclass(frozen=True)
class ABSpec:
    """``--ab KEY=A,B``: an environment variable of the serving units (an upper-case name, e.g.
    ``SGLANG_SM120_TRITON_INDEXER``), a ``sglang.launch_server`` flag (``--attention-backend``) or an
    inventory setting of the serving units (``SETTINGS``: ``dsv4_fp4_indexer``, values ``true``/``false``)
    and its two values. Arm ``A`` runs with the first value, ``B`` with the second."""
    key: str
    values: dict  # {"A": value, "B": value}

    arms = ("A", "B")

    @property
    def kind(self) -> str:
        if self.key in SETTINGS:
            return "setting"
        return "server_flag" if self.key.startswith("--") else "env"

    def to_dict(self) -> dict:
        return {"key": self.key, "kind": self.kind, "values": dict(self.values), "order": "interleaved A B A B, "
                "a server restart before every arm"}


def parse_ab(text: str) -> ABSpec:
    """``KEY=A,B`` -> ABSpec; bad input is ServingAbort(USAGE). A setting's values are read as
    booleans (true/false, 1/0, any case) and kept as ``true``/``false``."""
    key, sep, values = text.partition("=")
    key = key.strip()
    parts = [v.strip() for v in values.split(",")] if sep else []
    problems = []
    if re.fullmatch(r"[a-z][a-z0-9_]*", key):
        if key not in SETTINGS:
            problems.append(f"{key!r} is not an inventory setting an A/B can change; the settings it can: "
                            f"{', '.join(sorted(SETTINGS))}")
        elif len(parts) == 2:
            spelt = [_BOOL_SPELLINGS.get(p.lower()) for p in parts]
            if None in spelt:
                problems.append(f"{key} takes true or false (or 1/0), got {values!r}")
            else:
                parts = spelt
    elif not re.fullmatch(r"[A-Z_][A-Z0-9_]*|--[a-z0-9][a-z0-9-]*", key):
        problems.append(f"KEY must be an environment variable (upper case, e.g. SGLANG_SM120_TRITON_INDEXER), a "
                        f"server flag (e.g. --attention-backend) or an inventory setting "
                        f"({', '.join(sorted(SETTINGS))}), got {key!r}")
    if len(parts) != 2 or not all(parts):
        problems.append(f"give exactly two comma-separated values, got {values!r}")
    elif parts[0] == parts[1]:
        problems.append(f"the two values are the same ({parts[0]!r}): nothing to compare")
    if problems:
        raise ServingAbort(exitcodes.USAGE, f"--ab {text!r}: " + "; ".join(problems))
    return ABSpec(key=key, values={"A": parts[0], "B": parts[1]})


def arm_extra_vars(host, context_length: int, ab: ABSpec, arm: str) -> tuple[list[str], dict]:
    """(playbook tags, extra vars) that restart the serving units as arm ``arm`` wants: an env
    variable goes into ``dsv4_kernel_flags`` (the units' environment file; tags kernel_rollout and
    sglang_service), a flag replaces its value in ``dsv4_server_extra_args`` (tag sglang_service), a
    setting is passed as itself (a boolean; tag sglang_service restarts both servers). The inventory
    is not changed: the next ``dsv4kit provision`` restores its values. Settings the arm leaves alone
    go as the host holds them (``pin_running`` pins an ``auto`` one first)."""
    from dsv4kit.serving.pins import pinned_settings

    value = ab.values[arm]
    extra = {"dsv4_context_length": context_length, **pinned_settings(host)}
    if ab.kind == "setting":
        extra[ab.key] = value == "true"
        return [RESTART_TAG], extra
    if ab.kind == "env":
        extra["dsv4_kernel_flags"] = {**(host.get("dsv4_kernel_flags") or {}), ab.key: value}
        return ["kernel_rollout", RESTART_TAG], extra
    args = [str(a) for a in host.get("dsv4_server_extra_args") or []]
    kept, skip = [], False
    for item in args:
        if skip:
            skip = False
            continue
        if item == ab.key:
            skip = True
            continue
        if item.startswith(ab.key + "="):
            continue
        kept.append(item)
    extra["dsv4_server_extra_args"] = kept + [ab.key, value]
    return [RESTART_TAG], extra


def default_apply_arm(inventory_path, host, context_length: int, ab: ABSpec, arm: str,
                      progress: Callable[[str], None], timeout: float) -> None:
    """Restart the serving units with arm ``arm``'s setting (``arm_extra_vars``) via the playbook."""
    from dsv4kit.serving.remote import restart_units

    tags, extra = arm_extra_vars(host, context_length, ab, arm)
    restart_units(inventory_path, host, tags, extra, f"for arm {arm} ({ab.key}={ab.values[arm]})", progress, timeout)

