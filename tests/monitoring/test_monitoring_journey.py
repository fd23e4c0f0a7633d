"""The monitoring journey with real parts: the monitoring role renders its configuration (the real
ansible-playbook), the distribution's real Prometheus loads it and scrapes the SGLang stand-ins
(prefill and decode, tests/fake_sglang_server.py), a router and a DCGM exporter stand-in
(tests/fake_exporters.py) and the real node_exporter, and sends to the real Alertmanager. Faults
planted in the stand-ins (a stalled scheduler, a retraction, an Xid) fire the matching alerts,
which reach Alertmanager, and `dsv4kit monitor --json` reports them, over SSH (the loopback sshd)
for a box bound to its loopback and directly for an open one.

For speed the inventory sets 1 s scrape and evaluation intervals, and the installed rules'
`for:` holds are cut to 2 s (the only change to the role's output)."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.bench_support import FakeServer
from tests.monitoring.support import REPO, render_role

TOOLS = ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter")
pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS),
                                reason="apt: prometheus prometheus-alertmanager prometheus-node-exporter")
PLANTED = {"DSV4SchedulerStalled", "DSV4KVCacheExhausted", "DSV4GPUXid"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def _post(port: int, body: dict) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/_test/config", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=5).read()


def _wait(what: str, probe, timeout: float = 45.0):
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


class _Exporter:
    def __init__(self, kind: str, workdir: Path):
        port_file = workdir / f"{kind}.port"
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests/fake_exporters.py"), kind,
                                      "--port-file", str(port_file)], stdout=subprocess.DEVNULL,
                                     stderr=open(workdir / f"{kind}.log", "ab"))
        _wait(f"the {kind} stand-in", port_file.exists, 20)
        self.port = int(port_file.read_text())


@pytest.fixture(scope="module")
def stack(tmp_path_factory, loopback_ssh):
    work = tmp_path_factory.mktemp("journey")
    procs: list[subprocess.Popen] = []
    # the prefill role writes PD's KV transfer histogram; decode runs speculative decoding
    servers = {"prefill": FakeServer(work / "prefill", work / "model", token_delay_ms=5, serving_metrics=True,
                                     disaggregation_mode="prefill").start(),
               "decode": FakeServer(work / "decode", work / "model", token_delay_ms=5, serving_metrics=True,
                                    spec_accept_length=2.5).start()}
    dcgm, router = _Exporter("dcgm", work), _Exporter("router", work)
    procs += [dcgm.proc, router.proc]
    ports = {name: _free_port() for name in ("prometheus", "alertmanager", "node")}
    textfiles = work / "textfile"
    textfiles.mkdir()
    # the box's series as the product writes them (rollout status --textfile; a bench record)
    from dsv4kit.monitor import textfile

    textfile.write_local(str(textfiles), textfile.ROLLOUT_FILE, textfile.rollout_info_text(
        {"dsv4kit_version": "0.9.0", "sglang": {"version": "0.5.23"}, "indexer_route": "triton",
         "flags": {"SGLANG_SM120_TRITON_INDEXER": {"value": "1", "enabled": True}}}))
    textfile.write_local(str(textfiles), textfile.record_file("bench"), textfile.record_info_text(
        "bench", {"run_id": "20261206T0500Z-box1", "tag": "bench/box1/1", "created_at_utc": "2026-12-06T05:00:00Z"},
        "valid"))
    try:
        inventory_vars = {
            "dsv4_prefill_port": servers["prefill"].port, "dsv4_decode_port": servers["decode"].port,
            "monitoring_router_metrics_port": router.port, "monitoring_dcgm_exporter_port": dcgm.port,
            "monitoring_node_exporter_port": ports["node"], "monitoring_prometheus_port": ports["prometheus"],
            "monitoring_alertmanager_port": ports["alertmanager"],
            "monitoring_scrape_interval": "1s", "monitoring_evaluation_interval": "1s"}
        root = render_role(work / "rendered", inventory_vars, two_boxes=False) / "box1"
        rules = root / "etc/prometheus/rules/dsv4kit-alerts.yml"
        rules.write_text(re.sub(r"for: \d+m", "for: 2s", rules.read_text()))
        procs.append(subprocess.Popen(
            ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ports['node']}",
             f"--collector.textfile.directory={textfiles}"],
            stdout=subprocess.DEVNULL, stderr=open(work / "node.log", "ab")))
        procs.append(subprocess.Popen(
            ["prometheus-alertmanager", f"--config.file={root / 'etc/prometheus/alertmanager.yml'}",
             f"--storage.path={work / 'am'}", f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
             "--cluster.listen-address="], stdout=subprocess.DEVNULL, stderr=open(work / "am.log", "ab")))
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={root / 'etc/prometheus/prometheus.yml'}",
             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{ports['prometheus']}"],
            stdout=subprocess.DEVNULL, stderr=open(work / "prometheus.log", "ab")))
        prom = f"http://127.0.0.1:{ports['prometheus']}"

        def all_up():
            targets = _get(f"{prom}/api/v1/targets")["data"]["activeTargets"]
            return len(targets) == 6 and all(t["health"] == "up" for t in targets) and targets

        _wait("every target up", all_up)
        yield {"work": work, "prom": prom, "ports": ports, "servers": servers, "dcgm": dcgm, "sshd": loopback_ssh}
    finally:
        for proc in procs:
            proc.terminate()
        for server in servers.values():
            server.stop()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _firing(prom: str) -> dict:
    alerts = _get(f"{prom}/api/v1/alerts")["data"]["alerts"]
    return {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}


def _inventory(stack, *, open_: bool) -> Path:
    sshd = stack["sshd"]
    host = {"ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": sshd.user,
            "ansible_ssh_private_key_file": str(sshd.client_key), "dsv4_known_hosts": str(sshd.known_hosts),
            "dsv4_connect_timeout": 10, "dsv4_monitoring_open": open_, "dsv4_venv_dir": "/opt/dsv4/venv",
            "dsv4_context_length": 8192, "dsv4_decode_port": stack["servers"]["decode"].port, "dsv4_gpu_count": 8,
            "monitoring_prometheus_port": stack["ports"]["prometheus"],
            "monitoring_alertmanager_port": stack["ports"]["alertmanager"]}
    path = stack["work"] / f"hosts-{'open' if open_ else 'loopback'}.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"dsv4_boxes": {"hosts": {"box1": host}}}}}))
    return path


def _monitor(inventory: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "dsv4kit.cli", "monitor", "--json", "-i", str(inventory)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "120"})
    return done.returncode, json.loads(done.stdout)


def test_a_quiet_box_fires_only_the_watchdog_and_monitor_says_ok(stack):
    _wait("the Watchdog", lambda: "Watchdog" in _firing(stack["prom"]))
    time.sleep(4)  # a few evaluations with every target up: nothing else fires
    assert set(_firing(stack["prom"])) == {"Watchdog"}
    code, outcome = _monitor(_inventory(stack, open_=True))
    assert code == 0 and outcome["ok"] and outcome["watchdog_firing"] and outcome["firing"] == [], outcome
    assert outcome["urls"]["prometheus"] == f"http://127.0.0.1:{stack['ports']['prometheus']}/"
    assert outcome["tunnel"] is None


def test_planted_faults_fire_their_alerts_reach_alertmanager_and_monitor_reports_them(stack):
    servers = stack["servers"]
    servers["decode"].post("/_test/config", {"stalled": True})
    stuck = threading.Thread(target=lambda: _swallow(servers["decode"]), daemon=True)
    stuck.start()
    servers["prefill"].post("/_test/config", {"retract": 2})
    _post(stack["dcgm"].port, {"xid": {"3": 79}})

    fired = _wait("the planted alerts", lambda: PLANTED <= set(f := _firing(stack["prom"])) and f)
    assert set(fired) == PLANTED | {"Watchdog"}, sorted(fired)
    assert fired["DSV4SchedulerStalled"]["labels"]["role"] == "decode"
    assert fired["DSV4KVCacheExhausted"]["labels"]["role"] == "prefill"
    # the last-Xid series (with its text) and the exporter's Xid counter both fire it
    xids = [a["labels"] for a in _get(f"{stack['prom']}/api/v1/alerts")["data"]["alerts"]
            if a["labels"]["alertname"] == "DSV4GPUXid" and a["state"] == "firing"]
    assert ("3", "79", "GPU has fallen off the bus") in {(x["gpu"], x.get("err_code"), x.get("err_msg")) for x in xids}
    assert ("3", "79") in {(x["gpu"], x.get("xid")) for x in xids}, xids

    manager = f"http://127.0.0.1:{stack['ports']['alertmanager']}/api/v2/alerts"
    _wait("Alertmanager", lambda: PLANTED <= {a["labels"]["alertname"] for a in _get(manager)})

    code, outcome = _monitor(_inventory(stack, open_=False))  # over SSH: the box keeps its loopback
    assert code == 1 and not outcome["ok"], outcome
    assert {a["alertname"] for a in outcome["firing"]} == PLANTED
    assert PLANTED <= set(outcome["alertmanager_alerts"])
    port = stack["ports"]["prometheus"]
    assert f"-L {port}:127.0.0.1:{port}" in outcome["tunnel"] and str(stack["sshd"].port) in outcome["tunnel"]
    servers["decode"].post("/_test/config", {"stalled": False})


def _swallow(server) -> None:
    """A streaming request that waits in the stalled server's queue."""
    body = {"text": "w1 w2 w3", "stream": True, "sampling_params": {"max_new_tokens": 4}}
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        urllib.request.urlopen(request, timeout=120).read()
    except (OSError, http.client.HTTPException):  # the server stops under it at the end
        pass


def _traffic(server, n: int = 6) -> None:
    """A few requests, so that the latency histograms and the cache hit rate have observations."""
    for i in range(n):
        body = {"text": "w1 w2 w3 w4", "stream": True, "sampling_params": {"max_new_tokens": 8 + i}}
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/generate", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=60).read()


def _query(stack, expr: str) -> list:
    answer = _get(f"{stack['prom']}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def test_every_dashboard_panel_returns_data_from_prometheus(stack):
    """Each of the dashboard's panels, every query of it, returns series, with the stand-ins
    writing what SGLang 0.5.23, sglang-router 0.3.2 and DCGM exporter 4.8.2 write, and the box's
    textfile series written by the product."""
    from dsv4kit.monitor.panels import all_panels

    for server in stack["servers"].values():
        _traffic(server)
    # PD failures (counters that appear at their first event) and one short power-cap clock event;
    # neither holds long enough to fire an alert with the role's real holds
    stack["servers"]["decode"].post("/_test/config", {"transfer_failed": 1, "bootstrap_failed": 1})
    _post(stack["dcgm"].port, {"throttle": {"2": "power"}})
    _post(stack["dcgm"].port, {"throttle": {"2": "off"}})
    panels = all_panels()
    assert len(panels) == 21

    def empty_queries():
        return [(p.title, expr) for p in panels for expr, _ in p.queries if not _query(stack, expr)]

    missing = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        missing = empty_queries()
        if not missing:
            break
        time.sleep(1)
    assert not missing, missing
    # the histograms hold real observations, not only empty buckets
    ttft = _query(stack, 'sum(sglang:time_to_first_token_seconds_count)')
    assert float(ttft[0]["value"][1]) >= 12
    # the picture of the dashboard in docs/quickstart.md is drawn from these answers
    # (DSV4KIT_DASHBOARD_PICTURE=docs/images/monitoring-dashboard.png redraws it)
    from dsv4kit.monitor import render

    end = time.time()
    series = render.fetch(stack["prom"], minutes=2, now=end)
    assert all(series[p.title] for p in panels), [p.title for p in panels if not series[p.title]]
    note = ("Simulated box: dsv4kit's stand-ins for SGLang 0.5.23, sglang-router 0.3.2 and DCGM exporter 4.8.2, "
            "scraped by a real Prometheus (tests/monitoring/test_monitoring_journey.py)")
    (stack["work"] / "dashboard-series.json").write_text(json.dumps(series))
    out = render.render(series, stack["work"] / "dashboard.png", note, end - 120, 120)
    assert out.stat().st_size > 20_000
    if os.environ.get("DSV4KIT_DASHBOARD_PICTURE"):
        shutil.copyfile(out, os.environ["DSV4KIT_DASHBOARD_PICTURE"])
