"""`dsv4kit monitor`'s pieces without a box: the ports it assumes are the role's, the monitoring
host is chosen as the role chooses it, the tunnel and URLs, the alert API parse, and bad input
(a JSON error object, exit 2; an unreachable Prometheus, exit 3)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from dsv4kit.core.inventory import load_inventory
from dsv4kit.monitor import alerts
from dsv4kit.monitor.endpoints import DEFAULT_PORTS, PORT_VARS, endpoints, monitoring_host_name
from tests.monitoring.support import ROLE

BASE = {"dsv4_venv_dir": "/opt/dsv4/venv", "dsv4_context_length": 8192, "dsv4_decode_port": 30002,
        "dsv4_gpu_count": 8}


def _inventory(tmp_path, hosts: dict, **group) -> object:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"dsv4_boxes": {
        "hosts": {name: {**BASE, **h} for name, h in hosts.items()}, "vars": group}}}}))
    return path


def test_the_default_ports_are_the_roles():
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    assert {name: defaults[var] for name, var in PORT_VARS.items()} == DEFAULT_PORTS


def test_the_monitoring_host_tunnel_and_urls(tmp_path):
    path = _inventory(tmp_path, {"a": {"ansible_host": "10.0.0.1", "ansible_user": "ops", "ansible_port": 2222},
                                 "b": {"ansible_host": "10.0.0.2"}})
    inv = load_inventory(path)
    assert monitoring_host_name(inv) == "a"
    where = endpoints(inv.host("a"))
    assert where.tunnel_command() == "ssh -N -p 2222 -L 9093:127.0.0.1:9093 -L 3000:127.0.0.1:3000 " \
                                     "-L 9090:127.0.0.1:9090 ops@10.0.0.1"
    assert where.urls() == {"grafana": "http://127.0.0.1:3000/", "prometheus": "http://127.0.0.1:9090/",
                            "alertmanager": "http://127.0.0.1:9093/", "dashboard": "http://127.0.0.1:3000/d/dsv4-pd/"}
    opened = load_inventory(_inventory(tmp_path, {"a": {"ansible_host": "10.0.0.1"}, "b": {"ansible_host": "10.0.0.2"}},
                                       dsv4_monitoring_host="b", dsv4_monitoring_open=True))
    assert monitoring_host_name(opened) == "b"
    assert endpoints(opened.host("b")).urls()["prometheus"] == "http://10.0.0.2:9090/"
    assert endpoints(opened.host("b")).tunnel_command() is None


def test_the_alert_api_parse():
    payload = {"status": "success", "data": {"alerts": [
        {"labels": {"alertname": "DSV4GPUXid", "gpu": "3"}, "annotations": {"summary": "s"}, "state": "firing",
         "activeAt": "t", "value": "7.9e+01"},
        {"labels": {"alertname": "DSV4SchedulerStalled"}, "annotations": {}, "state": "pending"},
        {"labels": {"alertname": "Watchdog"}, "annotations": {}, "state": "firing"}]}}
    fired = alerts.firing(payload)
    assert [a["alertname"] for a in fired] == ["Watchdog", "DSV4GPUXid"]
    assert fired[1]["labels"] == {"gpu": "3"} and fired[1]["summary"] == "s"
    with pytest.raises(alerts.ApiError):
        alerts.firing({"status": "error", "error": "bad"})
    assert alerts.delivered([{"labels": {"alertname": "B"}}, {"labels": {"alertname": "A"}}]) == ["A", "B"]


def _monitor(*args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "dsv4kit.cli", "monitor", "--json", *args],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(done.stdout)


def test_bad_input_and_an_unreachable_prometheus(tmp_path):
    code, out = _monitor("--timeout", "0", "-i", str(tmp_path / "none.yml"))
    assert code == 2 and out["exit"] == "usage" and "--timeout" in out["error"]
    path = _inventory(tmp_path, {"a": {"ansible_host": "127.0.0.1", "dsv4_monitoring_open": True,
                                       "monitoring_prometheus_port": 9}})  # discard port: nothing listens
    code, out = _monitor("-i", str(path), "--timeout", "3")
    assert code == 3 and out["exit"] == "unreachable" and "cannot be reached" in out["error"], out
