"""Where dsv4kit's files lie on a box: under the host's ``dsv4_prefix`` ('/' on a real box, a
scratch directory in the tests), as the provision roles write them."""

from __future__ import annotations

#: The serving units (``dsv4-*.service``) and their drop-ins.
UNIT_DIR = "/etc/systemd/system"
#: The kernel rollout's decision, written beside the served flags.
DECISION_FILE = "/etc/dsv4kit/kernel-decision.json"
#: The router's API key file the provision role writes (root-only, mode 0600).
ROUTER_KEY_FILE = "/etc/dsv4kit/router-secret.env"


def on_box(host, path: str) -> str:
    """``path`` (absolute on a real box) under ``host``'s ``dsv4_prefix``."""
    prefix = str(host.get("dsv4_prefix") or "/").rstrip("/")
    return f"{prefix}/{path.lstrip('/')}"


def unit_dir(host) -> str:
    return on_box(host, UNIT_DIR)


def decision_file(host) -> str:
    return on_box(host, DECISION_FILE)
