"""The alerts firing now, read from Prometheus's HTTP API (``/api/v1/alerts``) and the ones
Alertmanager holds (``/api/v2/alerts``), either from this machine or, for a box bound to its
loopback, by a small Python reader run on the box over SSH."""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request

WATCHDOG = "Watchdog"
PROMETHEUS_PATH = "/api/v1/alerts"
ALERTMANAGER_PATH = "/api/v2/alerts?active=true&silenced=false&inhibited=false"


class ApiError(RuntimeError):
    """Prometheus or Alertmanager answered with an error, or not in its API's shape."""


def firing(payload) -> list[dict]:
    """The firing alerts of a ``/api/v1/alerts`` answer: name, labels, summary, since, value."""
    if not isinstance(payload, dict) or payload.get("status") != "success":
        raise ApiError(f"Prometheus answered {str(payload)[:200]!r}")
    out = []
    for alert in (payload.get("data") or {}).get("alerts") or []:
        if alert.get("state") != "firing":
            continue
        labels = dict(alert.get("labels") or {})
        out.append({"alertname": labels.pop("alertname", "?"), "labels": labels,
                    "summary": (alert.get("annotations") or {}).get("summary", ""),
                    "since": alert.get("activeAt"), "value": alert.get("value")})
    return sorted(out, key=lambda a: (a["alertname"] != WATCHDOG, a["alertname"], sorted(a["labels"].items())))


def delivered(payload) -> list[str]:
    """The alert names an Alertmanager ``/api/v2/alerts`` answer holds."""
    if not isinstance(payload, list):
        raise ApiError(f"Alertmanager answered {str(payload)[:200]!r}")
    return sorted({str((a.get("labels") or {}).get("alertname", "?")) for a in payload})


def get_json(url: str, timeout: float):
    """GET ``url`` from this machine; OSError when it cannot be reached, ApiError on a bad answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return json.loads(answer.read().decode())
    except urllib.error.HTTPError as exc:
        raise ApiError(f"{url}: HTTP {exc.code}") from None
    except ValueError as exc:
        raise ApiError(f"{url}: not JSON ({exc})") from None


def remote_reader(url: str, timeout: float) -> str:
    """The shell command that prints ``url``'s body on the box (python3 is on every Ubuntu box)."""
    code = ("import sys,urllib.request;"
            f"sys.stdout.write(urllib.request.urlopen({url!r},timeout={float(timeout)!r}).read().decode())")
    return f"python3 -c {shlex.quote(code)}"


def get_json_over_ssh(session, url: str, timeout: float):
    """GET ``url`` (the box's loopback) on the box through ``session`` (dsv4kit.core.ssh)."""
    done = session.run(remote_reader(url, timeout), timeout=timeout + 15, check=False)
    if done.exit_code != 0:
        raise ApiError(f"{url} on {session.target}: {(done.stderr or done.stdout).strip()[-300:]}")
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        raise ApiError(f"{url} on {session.target}: not JSON ({exc})") from None
