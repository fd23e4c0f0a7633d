"""The served model is the recorded model: ``/server_info`` against the record's model and revision.

The record names the inventory's model (``dsv4_model_path``, ``dsv4_model_revision``). The decode
server says what it serves: ``model_path`` and ``served_model_name`` in ``/server_info`` (SGLang
sets ``served_model_name`` to the model path unless ``--served-model-name`` is given). The weights
manifest the model_weights stage writes (``.dsv4kit-weights.json``, read by the probe) says which
revision is on disk. A point whose server serves another path or name, or whose manifest names
another revision, fails the ``served_model`` gate, which says what is served.
"""

from __future__ import annotations

import os
from typing import Optional


def _norm(path) -> str:
    return os.path.normpath(str(path)) if path else ""


def served_name_candidates(host) -> list[str]:
    """The names the units pass as ``--served-model-name``: the inventory's
    ``dsv4_served_model_name``, whose default is the model's repository id
    (``dsv4_models[dsv4_model].repo``); a value still holding a template is resolved that way."""
    out = []
    for value in (host.get("dsv4_served_model_name"), host.get("dsv4_model_repo")):
        if value and "{{" not in str(value):
            out.append(str(value))
    models, model = host.get("dsv4_models"), host.get("dsv4_model")
    if isinstance(models, dict) and isinstance(models.get(model), dict) and models[model].get("repo"):
        out.append(str(models[model]["repo"]))
    return list(dict.fromkeys(out))


def served_name(host) -> str:
    """The name clients give the model: the first of ``served_name_candidates``, else the path
    SGLang serves it under."""
    names = served_name_candidates(host)
    return names[0] if names else str(host.get("dsv4_model_path"))


def expected_model(host, probe: Optional[dict]) -> dict:
    """What the record says is served: the inventory's model path, the names it may be served
    under (the path, and ``dsv4_served_model_name`` when the inventory sets one), its revision, and
    the revision the weights manifest on the box names (None: no manifest was read)."""
    path = _norm(host.get("dsv4_model_path"))
    names = [path] + [n for n in served_name_candidates(host) if n != path]
    weights = (probe or {}).get("weights") or {}
    return {"path": path, "served_names": names, "revision": host.get("dsv4_model_revision"),
            "manifest_revision": weights.get("revision"), "manifest_reason": weights.get("reason")}


def check(server_info: Optional[dict], expected: Optional[dict]) -> tuple[bool, str]:
    """(passed, detail) of the ``served_model`` gate for the decode server's ``/server_info``."""
    if expected is None:
        return False, "the record's model is not known (no inventory model to compare with)"
    info = server_info or {}
    served_path, served_name = info.get("model_path"), info.get("served_model_name")
    if served_path is None:
        return False, "the decode server's /server_info has no model_path: what it serves cannot be told"
    problems = []
    if _norm(served_path) != expected["path"]:
        problems.append(f"the decode server serves model_path {served_path!r}, not the record's {expected['path']!r}")
    if served_name is not None and str(served_name) not in expected["served_names"] and \
            _norm(served_name) not in expected["served_names"]:
        problems.append(f"it serves the name {served_name!r}, not {' or '.join(map(repr, expected['served_names']))}")
    manifest = expected.get("manifest_revision")
    if manifest is not None and expected.get("revision") is not None and manifest != expected["revision"]:
        problems.append(f"the weights manifest on the box names revision {manifest!r}, the record "
                        f"{expected['revision']!r} (dsv4_model_revision)")
    if problems:
        return False, "; ".join(problems)
    revision = (f"revision {manifest} (weights manifest)" if manifest is not None else
                f"revision {expected.get('revision')!r} from the inventory, not verified on the box: "
                f"{expected.get('manifest_reason') or 'no weights manifest'}")
    return True, f"served {served_path!r} as {served_name!r}: the record's model, {revision}"
