"""docs/quickstart.md section 12 on the quickstart journey's box: the monitoring stage that `provision`
ran there (the distribution's real Prometheus, Alertmanager and node_exporter, started by the
systemctl stand-in from their packages' units; the DCGM exporter stand-in from the exporter package;
the Grafana stand-in from Grafana's repository: tests/fake_gpu_box.py) watching the box's stand-in
servers and router.

What the user's inventory sets for it (as the role reads them): the Grafana admin password (a vaulted
value on a real box), the distribution's package versions for this machine's release (the pins hold
Ubuntu's), free loopback ports and a 5 s scrape and evaluation cadence. Before the alert step the
installed rules' ``for:`` holds are cut to 2 s and Prometheus reloaded, as
tests/monitoring/test_monitoring_journey.py does; nothing else of the role's output is changed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

import yaml

from tests.fake_gpu_box import MONITORING_PACKAGES, upstream
from tests.monitoring.support import (GRAFANA_PASSWORD, PLANTED, cut_holds, firing, free_port, get_json,
                                      panels_without_data, post_config, query, swallow, targets_up, traffic,
                                      wait_for)

REPO = Path(__file__).resolve().parents[2]
#: The series the committed picture (docs/images/monitoring-dashboard.png) was drawn from.
PICTURE_SERIES = REPO / "docs/images/monitoring-dashboard.json"
PICTURE_NOTE = ("Simulated box: the quickstart journey's stand-ins for SGLang 0.5.23, sglang-router 0.3.2 and "
                "DCGM exporter 4.8.2, scraped by the distribution's real Prometheus (tests/journey)")
#: sglang x2, the router, node_exporter, the DCGM exporter, Prometheus itself
TARGETS = 6


def monitoring_pins() -> dict:
    """all.yml's values a user of this box sets: the Grafana password and this release's versions."""
    pins = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    versions = dict(pins["dsv4_prometheus_apt_versions"])
    release = platform.freedesktop_os_release().get("VERSION_CODENAME", "")
    if release not in versions and shutil.which("prometheus"):
        versions[release] = {name: upstream(subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", name], capture_output=True, text=True, check=True).stdout) + "*"
            for name in MONITORING_PACKAGES}
    return {"dsv4_grafana_admin_password": GRAFANA_PASSWORD, "dsv4_prometheus_apt_versions": versions}


def monitoring_role_vars() -> dict:
    ports = {f"monitoring_{name}_port": free_port()
             for name in ("prometheus", "alertmanager", "node_exporter", "dcgm_exporter", "grafana")}
    return {**ports, "monitoring_scrape_interval": "5s", "monitoring_evaluation_interval": "5s"}


def _role_vars(inventory: Path) -> dict:
    return yaml.safe_load((inventory.parent / "group_vars/dsv4_boxes.yml").read_text())


def check_monitoring(box, inventory: Path, monitor_line: str, run) -> None:
    """Section 12 on the provisioned box: every target up, Grafana's provisioning loaded, every
    panel with data (and the picture drawn from it), planted faults firing through Prometheus into
    Alertmanager, and the doc's ``dsv4kit monitor --json`` line reporting them over SSH. ``run``
    runs one doc line as the journey does."""
    role = _role_vars(inventory)
    pins = yaml.safe_load((inventory.parent / "group_vars/all.yml").read_text())
    prom = f"http://127.0.0.1:{role['monitoring_prometheus_port']}"
    states = {path.stem: json.loads(path.read_text()) for path in (box.root / "systemd").glob("*.json")}
    for unit in ("prometheus.service", "prometheus-alertmanager.service", "prometheus-node-exporter.service",
                 "dsv4-dcgm-exporter.service", "grafana-server.service"):
        assert states.get(unit, {}).get("active") == "active", (unit, states.get(unit))
    # the packaged units run this machine's real binaries, with the role's /etc/default arguments
    main = _cmdline(box, "prometheus.service")
    assert main[0] == "/usr/bin/prometheus" and f"--config.file={box.prefix}/etc/prometheus/prometheus.yml" in main, main
    wait_for("every target up", lambda: targets_up(prom, TARGETS), 120)
    _check_grafana(role["monitoring_grafana_port"])

    servers = {"prefill": pins["dsv4_prefill_port"], "decode": pins["dsv4_decode_port"]}
    dcgm = role["monitoring_dcgm_exporter_port"]
    # the rules' holds cut, Prometheus reloaded (the unit's ExecReload: SIGHUP)
    cut_holds(box.prefix / "etc/prometheus/rules/dsv4kit-alerts.yml")
    done = subprocess.run([str(box.tools / "systemctl"), "reload", "prometheus.service"],
                          env={**os.environ, **box.task_env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    post_config(servers["decode"], {"stalled": True})
    threading.Thread(target=swallow, args=(servers["decode"],), daemon=True).start()
    post_config(servers["prefill"], {"retract": 2})
    post_config(dcgm, {"xid": {"3": 79}})
    fired = wait_for("the planted alerts", lambda: PLANTED <= set(f := firing(prom)) and f, 120)
    assert fired["DSV4SchedulerStalled"]["labels"]["role"] == "decode", fired
    assert fired["DSV4KVCacheExhausted"]["labels"]["role"] == "prefill", fired
    manager = f"http://127.0.0.1:{role['monitoring_alertmanager_port']}/api/v2/alerts"
    # Prometheus re-sends a firing alert at most once a minute (--rules.alert.resend-delay): a first
    # send that Alertmanager missed arrives a minute later.
    wait_for("Alertmanager", lambda: PLANTED <= {a["labels"]["alertname"] for a in get_json(manager)}, 150)
    xids = [a["annotations"]["summary"] for a in get_json(manager) if a["labels"]["alertname"] == "DSV4GPUXid"]
    assert any("Xid 79 1 time(s)" in x for x in xids) and any(x.endswith("reported Xid 79") for x in xids), xids

    done = run(monitor_line)  # section 12's line, as the doc spells it: the box keeps its loopback
    assert done.returncode == 1, done.stdout[-3000:]
    outcome = json.loads(done.stdout)
    assert PLANTED <= {a["alertname"] for a in outcome["firing"]}, outcome
    assert PLANTED <= set(outcome["alertmanager_alerts"]), outcome
    port = role["monitoring_prometheus_port"]
    assert f"-L {port}:127.0.0.1:{port}" in outcome["tunnel"], outcome
    post_config(servers["decode"], {"stalled": False})

    # every panel of the dashboard with data, and the picture drawn from it
    for port in servers.values():
        # the stand-ins' latency histograms, published from now (the bench's 0.1 s scrapes went without)
        post_config(port, {"serving_metrics": True})
        traffic(port)
    # A histogram is born at its first observation, so its first scrape is its first sample and the
    # rate of a single burst is zero (a NaN quantile): a second burst once Prometheus has them.
    wait_for("the latency histograms scraped",
             lambda: len(query(prom, "sglang:time_to_first_token_seconds_count")) >= len(servers), 30)
    for port in servers.values():
        traffic(port)
    # PD failures (counters that appear at their first event) and a short power-cap clock event
    post_config(servers["decode"], {"transfer_failed": 1, "bootstrap_failed": 1})
    post_config(dcgm, {"throttle": {"2": "power"}})
    post_config(dcgm, {"throttle": {"2": "off"}})
    missing = panels_without_data(prom, timeout=60)
    assert not missing, missing
    _draw(prom)


def _cmdline(box, unit: str) -> list[str]:
    out = subprocess.run([str(box.tools / "systemctl"), "show", unit, "-p", "MainPID"],
                         env={**os.environ, **box.task_env}, capture_output=True, text=True, timeout=60).stdout
    pid = int(out.strip().partition("=")[2] or 0)
    # the package's /usr/bin/prometheus execs the real one: the main process is this machine's binary
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _check_grafana(port: int) -> None:
    import base64
    import urllib.request

    wait_for("Grafana", lambda: get_json(f"http://127.0.0.1:{port}/api/health")["database"] == "ok", 60)
    login = base64.b64encode(f"admin:{GRAFANA_PASSWORD}".encode()).decode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/search", headers={"Authorization": f"Basic {login}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        boards = json.loads(answer.read())
    assert [b["title"] for b in boards] == ["DeepSeek-V4 PD box"], boards


#: A panel whose line series have no finite point: Grafana draws it empty.
NO_FINITE = "lines without a finite point"


def series_shape(series: dict) -> dict:
    """What the picture's generator reads of the series: each panel's title and its kind of rows
    (``lines`` where at least one point is finite, else :data:`NO_FINITE`)."""
    def kinds(rows: list) -> list:
        lines = [values for row in rows if not isinstance(row, str) for _, values in [row]]
        drawn = any(v is not None and math.isfinite(v) for values in lines for _, v in values)
        return sorted({"table" for row in rows if isinstance(row, str)} | ({"lines" if drawn else NO_FINITE} if lines else set()))

    return {title: kinds(rows) for title, rows in series.items()}


def _draw(prom: str) -> None:
    """The dashboard drawn from this Prometheus (dsv4kit.monitor.render), in the committed picture's
    data shape. DSV4KIT_DASHBOARD_PICTURE=PATH also writes the picture to PATH and its series to
    PATH with .json: the committed picture is redrawn that way."""
    from dsv4kit.monitor import render

    end = time.time()
    series = render.fetch(prom, minutes=2, now=end)
    assert all(series.values()), [title for title, rows in series.items() if not rows]
    target = os.environ.get("DSV4KIT_DASHBOARD_PICTURE")
    if target:
        out = render.render(series, Path(target), PICTURE_NOTE, end - 120, 120)
        assert out.stat().st_size > 20_000
        Path(target).with_suffix(".json").write_text(json.dumps(
            {"note": PICTURE_NOTE, "start": end - 120, "span": 120, "series": series}) + "\n")
    committed = json.loads(PICTURE_SERIES.read_text())
    assert series_shape(series) == series_shape(committed["series"]), "the committed picture's data has another shape"


def section_12_line(text: str) -> str:
    """Section 12's ``dsv4kit monitor --json`` line, without its comment."""
    body = text[text.index("\n## 12."):]
    line = next(line for line in body.splitlines() if line.startswith("dsv4kit monitor --json"))
    return shlex.join(shlex.split(line, comments=True))
