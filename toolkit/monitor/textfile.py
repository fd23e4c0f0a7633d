"""The box's own series for node_exporter's textfile collector (the dashboard's "The box" row):
``dsv4kit_rollout_info`` (which kernels serve, written by the rollout's status check on the box)
and ``dsv4kit_record_info`` (the box's latest validate, eval and bench record, written over the
command's SSH session). A file appears whole or not at all: it is written under a hidden
temporary name (the collector reads only ``*.prom``) and renamed.
"""

from __future__ import annotations

import os
import shlex
from typing import Callable, Optional

from dsv4kit.core import box_paths

#: Where the monitoring role points the collector, under ``dsv4_prefix`` (all.yml's ``dsv4_monitoring_textfile_dir``).
DEFAULT_DIR = "/var/lib/prometheus/node-exporter"
ROLLOUT_FILE = "dsv4kit-rollout.prom"


def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series(name: str, doc: str, rows: list) -> str:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
    for labels in rows:
        text = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items() if value is not None)
        lines.append(f"{name}{{{text}}} 1")
    return "\n".join(lines) + "\n"


def rollout_info_text(report: dict) -> str:
    """``dsv4kit rollout status --json``'s report -> one series per kernel flag: whether ours
    (``dsv4kit``) or SGLang's stock kernel serves, and the versions."""
    rows = []
    for flag, entry in sorted((report.get("flags") or {}).items()):
        rows.append({"flag": flag, "kernel": "dsv4kit" if entry.get("enabled") else "stock",
                     "value": entry.get("value") if entry.get("value") is not None else "",
                     "dsv4kit_version": report.get("dsv4kit_version"),
                     "sglang_version": (report.get("sglang") or {}).get("version"),
                     "indexer_route": report.get("indexer_route")})
    return _series("dsv4kit_rollout_info", "The kernels serving on this box (dsv4kit rollout status).", rows)


def record_info_text(kind: str, record: dict, outcome: str) -> str:
    """The box's latest ``kind`` (validate, eval, bench) record as one series."""
    return _series("dsv4kit_record_info", "The latest dsv4kit record of this box.",
                   [{"kind": kind, "run_id": record.get("run_id"), "tag": record.get("tag"), "outcome": outcome,
                     "created": record.get("created_at_utc")}])


def record_file(kind: str) -> str:
    return f"dsv4kit-record-{kind}.prom"


def write_local(directory: str, name: str, text: str) -> None:
    """Write ``directory/name`` atomically (on the box, or a test's collector directory)."""
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(directory, name))


def textfile_dir(host) -> Optional[str]:
    """The box's collector directory, or None where the inventory turns monitoring off."""
    if host.get("dsv4_monitoring") is False:
        return None
    if host.get("monitoring_textfile_dir"):
        return str(host.get("monitoring_textfile_dir"))
    return box_paths.on_box(host, str(host.get('dsv4_monitoring_textfile_dir') or DEFAULT_DIR))


#: The monitoring role leaves this file in the directory it points the collector at: the commands
#: write their record series only into a directory the role configured (never into a
#: distribution's default directory that nothing of ours reads).
MARKER = ".dsv4kit-monitoring"

#: On the box: nothing without the role's marker (no monitoring there); sudo -n when the login
#: user cannot write the directory; the same hidden-name-then-rename as ``write_local``.
_BOX_WRITE = ('d=$1; f=$2; [ -e "$d/' + MARKER + '" ] || exit 0; s=""; [ -w "$d" ] || s="sudo -n"; '
              'printf "%s" "$3" | $s tee "$d/.$f.tmp" >/dev/null && $s chmod 0644 "$d/.$f.tmp" '
              '&& $s mv -f "$d/.$f.tmp" "$d/$f"')


def publish_record(session, host, kind: str, record: dict, outcome: str,
                   warn: Callable[[str], None], timeout: float = 30.0) -> bool:
    """Write the record's series into the box's collector directory over ``session``. A failure is
    a warning (monitoring never fails the command). Returns whether a file was written or skipped."""
    directory = textfile_dir(host)
    if directory is None:
        return True
    command = shlex.join(["sh", "-c", _BOX_WRITE, "_", directory, record_file(kind),
                          record_info_text(kind, record, outcome)])
    try:
        result = session.run(command, timeout=timeout, check=False)
    except Exception as exc:  # the session went away: the record stands, the dashboard lags
        warn(f"warning: the dashboard's record series was not written on the box: {exc}")
        return False
    if result.exit_code != 0:
        warn(f"warning: the dashboard's record series was not written into {directory} on the box "
             f"(exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-300:]}")
        return False
    return True
