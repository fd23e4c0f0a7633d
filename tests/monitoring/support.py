"""Paths and helpers the monitoring tests share."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks" / "roles" / "monitoring"
ALERT_RULES = ROLE / "files" / "dsv4kit-alerts.yml"
