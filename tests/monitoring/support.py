"""Paths and helpers the monitoring tests share."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks" / "roles" / "monitoring"
ALERT_RULES = ROLE / "files" / "dsv4kit-alerts.yml"

import json
import math
import os
import subprocess
import sys

import yaml

GRAFANA_PASSWORD = "grafana-test-secret-5e1"


def render_role(root: Path, overrides: dict | None = None, box2: dict | None = None, *, two_boxes: bool = True) -> Path:
    """Render the monitoring role's configuration (its tasks/config.yml, defaults and the tracked
    pins, through the real ansible-playbook) for an inventory of two boxes, both rendered locally:
    box1 (the monitoring host, under ``root/box1``) and box2 (address 192.0.2.12, under
    ``root/box2``, with the host vars ``box2``; left out when not ``two_boxes``). ``overrides``:
    inventory values for both. The units are left alone. Returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    work = root / "ansible"
    work.mkdir(exist_ok=True)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {"box1": {**local, "ansible_host": "127.0.0.1", "dsv4_prefix": str(root / "box1")},
             "box2": {**local, "ansible_host": "192.0.2.12", "dsv4_prefix": str(root / "box2"), **(box2 or {})}}
    if not two_boxes:
        del hosts["box2"]
    site_vars = yaml.safe_load((REPO / "playbooks/site.yml").read_text())[0]["vars"]
    pins = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    group = {**pins, **site_vars, "ansible_managed": "managed by dsv4kit",
             "dsv4_grafana_admin_password": GRAFANA_PASSWORD, "monitoring_manage_units": False, **(overrides or {})}
    group.pop("ansible_ssh_common_args", None)
    inventory = {"all": {"children": {"dsv4_boxes": {"hosts": hosts, "vars": group}}}}
    (work / "inventory.yml").write_text(yaml.safe_dump(inventory))
    play = [{"hosts": "dsv4_boxes", "gather_facts": False,
             "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "config"}}]}]
    (work / "play.yml").write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLE.parent),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(work / "tmp")}
    done = subprocess.run(["ansible-playbook", "-i", str(work / "inventory.yml"), str(work / "play.yml")],
                          capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise AssertionError(f"ansible-playbook failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    return root


# --- talking to the real Prometheus and Alertmanager, and to the stand-ins (both monitoring journeys) ---
import http.client
import socket
import time
import urllib.parse
import urllib.request

#: The alerts a planted stalled queue, retraction and Xid fire.
PLANTED = {"DSV4SchedulerStalled", "DSV4KVCacheExhausted", "DSV4GPUXid"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def post_config(port: int, body: dict) -> None:
    """A stand-in's fault hook: ``POST /_test/config`` on 127.0.0.1:``port``."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/_test/config", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=5).read()


def wait_for(what: str, probe, timeout: float = 45.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last: {last}")


def firing(prom: str) -> dict:
    alerts = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
    return {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}


def query(prom: str, expr: str) -> list:
    answer = get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def targets_up(prom: str, count: int):
    """Prometheus's active targets when there are ``count`` and every one is up, else None."""
    targets = get_json(f"{prom}/api/v1/targets")["data"]["activeTargets"]
    return targets if len(targets) == count and all(t["health"] == "up" for t in targets) else None


def _generate(port: int, body: dict, timeout: float) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=timeout).read()


def traffic(port: int, n: int = 6) -> None:
    """A few streamed requests to the SGLang stand-in on ``port``: the latency histograms and the
    cache hit rate get observations."""
    for i in range(n):
        _generate(port, {"text": "w1 w2 w3 w4", "stream": True, "sampling_params": {"max_new_tokens": 8 + i}}, 60)


def swallow(port: int) -> None:
    """A streaming request that waits in a stalled stand-in's queue (until the server stops under it)."""
    try:
        _generate(port, {"text": "w1 w2 w3", "stream": True, "sampling_params": {"max_new_tokens": 4}}, 120)
    except (OSError, http.client.HTTPException):
        pass


def finite(result: list) -> bool:
    """Whether a query's result has a series with a finite value now (a quantile of a histogram
    with no observations in its rate window is NaN: a line Grafana cannot draw)."""
    return any(math.isfinite(float(series["value"][1])) for series in result)


def panels_without_data(prom: str, timeout: float = 30.0) -> list:
    """The (panel, query) pairs of the generated dashboard that still return no series with a
    finite value after ``timeout``."""
    from dsv4kit.monitor.panels import all_panels

    panels = all_panels()
    deadline = time.monotonic() + timeout
    while True:
        missing = [(p.title, expr) for p in panels for expr, _ in p.queries if not finite(query(prom, expr))]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(1)


def cut_holds(rules: Path) -> None:
    """The installed alert rules with every ``for:`` hold cut to 2 s (the only change the
    monitoring journeys make to what the role installs)."""
    import re

    rules.write_text(re.sub(r"for: \d+m", "for: 2s", rules.read_text()))
