"""The monitoring role as the real ansible-playbook renders it for a two-box inventory
(tests/monitoring/support.render_role): `promtool check config` on what it writes, both boxes'
targets in one Prometheus, loopback unless opened, the thresholds from the inventory, the vaulted
Grafana password in a file and no anonymous access, the profiling fields only where probed, the
units' `systemd-analyze security` scores, and the shipped dashboard is the generator's output."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.monitoring.support import GRAFANA_PASSWORD, ROLE, render_role

needs_promtool = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed (apt: prometheus)")
needs_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")

#: `systemd-analyze security --offline` exposure (systemd 252; lower is better): the DCGM exporter's
#: unit, and the distribution's units with the role's drop-in. A change that raises one fails here.
SECURITY_BUDGET = {"dsv4-dcgm-exporter.service": 1.2, "prometheus.service": 1.4,
                   "prometheus-alertmanager.service": 1.6, "prometheus-node-exporter.service": 1.6}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    return render_role(tmp_path_factory.mktemp("monitoring"),
                       {"dsv4_monitoring_ttft_slo_ms": 2500, "dsv4_speculative": "DSPARK",
                        "dsv4_monitoring_spec_accept_qualified": 3.0},
                       box2={"dsv4_monitoring_open": True, "dsv4_gpu_count": 4,
                             "monitoring_dcgm_prof_present": ["DCGM_FI_PROF_SM_ACTIVE"]})


@needs_promtool
def test_promtool_check_config_passes_on_what_the_role_writes(rendered):
    config = rendered / "box1/etc/prometheus/prometheus.yml"
    done = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 rule files found" in done.stdout + done.stderr


def test_one_prometheus_scrapes_both_boxes(rendered):
    config = yaml.safe_load((rendered / "box1/etc/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"sglang", "sglang-router", "node", "dcgm", "prometheus"}
    got = {(t, sc["labels"]["box"], sc["labels"]["role"]) for name in ("sglang", "sglang-router", "node", "dcgm")
           for sc in jobs[name]["static_configs"] for t in sc["targets"]}
    for box, address in (("box1", "127.0.0.1"), ("box2", "192.0.2.12")):
        assert {(f"{address}:30001", box, "prefill"), (f"{address}:30002", box, "decode"),
                (f"{address}:29000", box, "router"), (f"{address}:9100", box, "node"),
                (f"{address}:9400", box, "dcgm")} <= got
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    # Only the monitoring host runs Prometheus, Alertmanager and Grafana.
    assert not list((rendered / "box2").rglob("prometheus.yml")) and not list((rendered / "box2").rglob("grafana.ini"))


def test_loopback_unless_the_inventory_opens_it(rendered):
    box1 = "\n".join(p.read_text() for p in (rendered / "box1/etc/default").iterdir())
    box1 += (rendered / "box1/etc/systemd/system/dsv4-dcgm-exporter.service").read_text()
    box1 += (rendered / "box1/etc/grafana/grafana.ini").read_text()
    listens = re.findall(r"(?:(?<!cluster\.)listen-address=|--address |http_addr = )(\S*?)(?::\d+|\s|$)", box1)
    assert listens and set(listens) == {"127.0.0.1"}, listens
    assert "--cluster.listen-address= " in box1 or '--cluster.listen-address="' in box1
    box2 = (rendered / "box2/etc/default/prometheus-node-exporter").read_text()
    assert "--web.listen-address=0.0.0.0:9100" in box2
    # box1's Prometheus may reach box2 (and nothing else) through its sandbox.
    dropin = (rendered / "box1/etc/systemd/system/prometheus.service.d/dsv4kit.conf").read_text()
    assert "IPAddressAllow=localhost 192.0.2.12" in dropin and "IPAddressDeny=any" in dropin


def test_retention_is_bounded_by_size(rendered):
    args = (rendered / "box1/etc/default/prometheus").read_text()
    assert "--storage.tsdb.retention.size=20GB" in args


def test_the_thresholds_come_from_the_inventory(rendered):
    rules = yaml.safe_load((rendered / "box1/etc/prometheus/rules/dsv4kit-thresholds.yml").read_text())
    exprs = {r["record"]: r["expr"] for r in rules["groups"][0]["rules"]}
    assert exprs["dsv4:ttft_p99_slo_seconds"] == "vector(2.5)"
    assert exprs["dsv4:spec_accept_length_floor"] == "vector(2.4)"  # 0.8 x 3.0
    assert 'vector(8), "box", "box1"' in exprs["dsv4:gpus_expected"]
    assert 'vector(4), "box", "box2"' in exprs["dsv4:gpus_expected"]
    alerts = rendered / "box1/etc/prometheus/rules/dsv4kit-alerts.yml"
    assert alerts.read_text() == (ROLE / "files/dsv4kit-alerts.yml").read_text()


def test_grafana_reads_the_vaulted_password_from_a_file_and_admits_no_anonymous_user(rendered):
    ini = (rendered / "box1/etc/grafana/grafana.ini").read_text()
    assert GRAFANA_PASSWORD not in ini
    assert f"admin_password = $__file{{{rendered / 'box1/etc/grafana/admin_password'}}}" in ini
    assert re.search(r"\[auth\.anonymous\]\nenabled = false", ini) and "allow_sign_up = false" in ini
    secret = rendered / "box1/etc/grafana/admin_password"
    assert secret.read_text() == GRAFANA_PASSWORD and secret.stat().st_mode & 0o777 == 0o640
    source = yaml.safe_load((rendered / "box1/etc/grafana/provisioning/datasources/dsv4kit.yml").read_text())
    assert source["datasources"][0]["url"] == "http://127.0.0.1:9090"


def test_profiling_fields_only_where_probed(rendered):
    box1 = (rendered / "box1/etc/dcgm-exporter/counters.csv").read_text()
    box2 = (rendered / "box2/etc/dcgm-exporter/counters.csv").read_text()
    assert "DCGM_FI_PROF_" not in box1
    assert re.findall(r"^DCGM_FI_PROF_\w+", box2, re.M) == ["DCGM_FI_PROF_SM_ACTIVE"]
    for field in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
                  "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_GPU_TEMP"):
        assert re.search(rf"^{field},", box1, re.M), field


def _exposure(root: Path, name: str) -> float:
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", f"--root={root}", "--no-pager", name],
                          capture_output=True, text=True, timeout=120)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout + done.stderr)
    assert match, done.stdout + done.stderr
    return float(match.group(1))


@needs_analyze
def test_units_stay_within_their_security_budget(rendered, tmp_path):
    """The DCGM exporter's unit as rendered, and the distribution's units (as the installed
    packages ship them) with the role's drop-in, in a scratch root."""
    shipped = Path("/lib/systemd/system")
    units = tmp_path / "etc/systemd/system"
    shutil.copytree(rendered / "box1/etc/systemd/system", units)
    for name in SECURITY_BUDGET:
        if name != "dsv4-dcgm-exporter.service":
            if not (shipped / name).exists():
                pytest.skip(f"{name} not installed (apt: prometheus, prometheus-alertmanager, prometheus-node-exporter)")
            shutil.copy(shipped / name, units / name)
    scores = {name: _exposure(tmp_path, name) for name in SECURITY_BUDGET}
    over = {n: (s, SECURITY_BUDGET[n]) for n, s in scores.items() if s > SECURITY_BUDGET[n]}
    assert not over, f"systemd-analyze security got worse (score, budget): {over}"


def test_the_shipped_dashboard_is_the_generators_output():
    from dsv4kit.monitor.dashboard import render

    assert (ROLE / "files/dsv4-pd-dashboard.json").read_text() == render()
