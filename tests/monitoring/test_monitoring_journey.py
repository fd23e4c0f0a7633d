"""The monitoring role's configuration run by the real parts outside the quickstart journey: the role
renders it (the real ansible-playbook), the distribution's real Prometheus loads it and scrapes the
SGLang stand-ins (prefill and decode, tests/fake_sglang_server.py), a router and a DCGM exporter
stand-in (tests/fake_exporters.py) and the real node_exporter, and sends to the real Alertmanager.

The quickstart journey (tests/journey/test_quickstart_journey.py, tests/journey/quickstart_monitoring.py)
runs the role as `provision` installs it on a box bound to its loopback: every target up, every
dashboard panel with data, planted faults firing into Alertmanager, `dsv4kit monitor --json` over SSH.
What only this file covers: a quiet box fires the Watchdog alone, and `dsv4kit monitor --json` on an
inventory that opens the box (dsv4_monitoring_open) reads Prometheus directly, with no tunnel.

For speed the inventory sets 1 s scrape and evaluation intervals, and the installed rules'
`for:` holds are cut to 2 s (the only change to the role's output)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.bench_support import FakeServer
from tests.monitoring.support import REPO, cut_holds, firing, free_port, render_role, targets_up, wait_for

TOOLS = ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter")
pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS),
                                reason="apt: prometheus prometheus-alertmanager prometheus-node-exporter")


class _Exporter:
    def __init__(self, kind: str, workdir: Path):
        port_file = workdir / f"{kind}.port"
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests/fake_exporters.py"), kind,
                                      "--port-file", str(port_file)], stdout=subprocess.DEVNULL,
                                     stderr=open(workdir / f"{kind}.log", "ab"))
        wait_for(f"the {kind} stand-in", port_file.exists, 20)
        self.port = int(port_file.read_text())


@pytest.fixture(scope="module")
def stack(tmp_path_factory, loopback_ssh):
    work = tmp_path_factory.mktemp("journey")
    procs: list[subprocess.Popen] = []
    servers = {"prefill": FakeServer(work / "prefill", work / "model", token_delay_ms=5,
                                     disaggregation_mode="prefill").start(),
               "decode": FakeServer(work / "decode", work / "model", token_delay_ms=5).start()}
    dcgm, router = _Exporter("dcgm", work), _Exporter("router", work)
    procs += [dcgm.proc, router.proc]
    ports = {name: free_port() for name in ("prometheus", "alertmanager", "node")}
    textfiles = work / "textfile"
    textfiles.mkdir()
    try:
        inventory_vars = {
            "dsv4_prefill_port": servers["prefill"].port, "dsv4_decode_port": servers["decode"].port,
            "monitoring_router_metrics_port": router.port, "monitoring_dcgm_exporter_port": dcgm.port,
            "monitoring_node_exporter_port": ports["node"], "monitoring_prometheus_port": ports["prometheus"],
            "monitoring_alertmanager_port": ports["alertmanager"],
            "monitoring_scrape_interval": "1s", "monitoring_evaluation_interval": "1s"}
        root = render_role(work / "rendered", inventory_vars, two_boxes=False) / "box1"
        rules = root / "etc/prometheus/rules/dsv4kit-alerts.yml"
        cut_holds(rules)
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

        wait_for("every target up", lambda: targets_up(prom, 6))
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
    wait_for("the Watchdog", lambda: "Watchdog" in firing(stack["prom"]))
    time.sleep(4)  # a few evaluations with every target up: nothing else fires
    assert set(firing(stack["prom"])) == {"Watchdog"}
    code, outcome = _monitor(_inventory(stack, open_=True))
    assert code == 0 and outcome["ok"] and outcome["watchdog_firing"] and outcome["firing"] == [], outcome
    assert outcome["urls"]["prometheus"] == f"http://127.0.0.1:{stack['ports']['prometheus']}/"
    assert outcome["tunnel"] is None
