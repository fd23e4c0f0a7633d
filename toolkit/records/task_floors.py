"""The accuracy floor each task set's eval must reach, per arm, for its record to count.

The default is GSM8K's (SGLang's own release gate for DeepSeek-V4: 0.95 on 200 items). Another
task set gets its own in the inventory, keyed by the tasks file's sha256::

    dsv4_eval_task_floors:
      <sha256>: {min_accuracy: 0.9, min_items: 100}

``dsv4kit eval`` judges with the floor of the set it asked; ``auto`` (``quality_evidence``)
re-reads the inventory's floors when it decides.
"""

from __future__ import annotations

from typing import Optional

FLOORS_VAR = "dsv4_eval_task_floors"
DEFAULT_MIN_ACCURACY = 0.95
DEFAULT_MIN_ITEMS = 200


def task_floors(host) -> dict:
    """The inventory's per-task-set floors of ``host``; ValueError naming a malformed entry."""
    value = host.get(FLOORS_VAR) or {}
    if not isinstance(value, dict):
        raise ValueError(f"{FLOORS_VAR} of {host.name}: a mapping of task-file sha256 to {{min_accuracy, min_items}}, "
                         f"not {value!r}")
    for sha, floor in value.items():
        ok = isinstance(floor, dict) and set(floor) <= {"min_accuracy", "min_items"}
        acc, items = (floor.get("min_accuracy", 0.0), floor.get("min_items", 1)) if ok else (None, None)
        if not (ok and isinstance(acc, (int, float)) and not isinstance(acc, bool) and 0 <= acc <= 1
                and isinstance(items, int) and not isinstance(items, bool) and items >= 1):
            raise ValueError(f"{FLOORS_VAR}[{sha}] of {host.name}: give min_accuracy (0 to 1) and min_items "
                             f"(at least 1), not {floor!r}")
    return value


def floor_for(floors: dict, sha256: Optional[str]) -> tuple[float, int]:
    """(min_accuracy, min_items) of the task set ``sha256``: its entry in ``floors``, else the default."""
    chosen = floors.get(sha256) if sha256 else None
    chosen = chosen if isinstance(chosen, dict) else {}
    return (float(chosen.get("min_accuracy", DEFAULT_MIN_ACCURACY)), int(chosen.get("min_items", DEFAULT_MIN_ITEMS)))
