"""The box's textfile series (dsv4kit.monitor.textfile): what the rollout, validate, eval and bench
write for the dashboard, read back by the real node_exporter's parser... and, over the real
loopback sshd, written into the collector directory whole or not at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsv4kit.core import ssh
from dsv4kit.core.inventory import load_inventory
from dsv4kit.monitor import textfile
from tests.remote_inventory import write_inventory

RECORD = {"run_id": "20261206T0500Z-box1-ctx131072", "tag": 'bench/box1/"odd"', "created_at_utc": "2026-12-06T05:00:00+00:00"}


def _samples(text: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_the_series_parse_and_carry_what_the_dashboard_shows():
    record = _samples(textfile.record_info_text("bench", RECORD, "valid"))
    assert [(s.name, s.labels["kind"], s.labels["tag"], s.labels["outcome"], s.value) for s in record] == [
        ("dsv4kit_record_info", "bench", 'bench/box1/"odd"', "valid", 1.0)]
    report = {"dsv4kit_version": "0.9.0", "sglang": {"version": "0.5.23"}, "indexer_route": "triton",
              "flags": {"SGLANG_SM120_TRITON_INDEXER": {"value": "1", "enabled": True},
                        "DSV4KIT_SPARSE_MLA": {"value": None, "enabled": False}}}
    rollout = {s.labels["flag"]: s.labels for s in _samples(textfile.rollout_info_text(report))}
    assert rollout["SGLANG_SM120_TRITON_INDEXER"]["kernel"] == "dsv4kit"
    assert rollout["DSV4KIT_SPARSE_MLA"]["kernel"] == "stock" and rollout["DSV4KIT_SPARSE_MLA"]["sglang_version"] == "0.5.23"


def test_the_directory_follows_the_inventory():
    assert textfile.textfile_dir({}) == "/var/lib/prometheus/node-exporter"
    assert textfile.textfile_dir({"dsv4_prefix": "/srv/box/"}) == "/srv/box/var/lib/prometheus/node-exporter"
    assert textfile.textfile_dir({"monitoring_textfile_dir": "/x"}) == "/x"
    assert textfile.textfile_dir({"dsv4_monitoring": False}) is None


def test_the_rollout_status_writes_its_series_atomically(tmp_path):
    target = tmp_path / "collector"
    done = subprocess.run([shutil.which("python") or "python", "-m", "dsv4kit.rollout", "status", "--json",
                           "--decision", "", "--textfile", str(target)], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().startswith("{"), done.stderr
    written = (target / textfile.ROLLOUT_FILE).read_text()
    assert {s.labels["flag"] for s in _samples(written)} and sorted(os.listdir(target)) == [textfile.ROLLOUT_FILE]


def test_a_record_is_written_over_ssh_whole_and_nothing_without_the_directory(tmp_path, loopback_ssh):
    collector = tmp_path / "collector"
    host = load_inventory(write_inventory(tmp_path / "inv", loopback_ssh,
                                          monitoring_textfile_dir=str(collector))).host()
    warnings: list[str] = []
    with ssh.open_session(host) as session:
        assert textfile.publish_record(session, host, "eval", RECORD, "pass", warnings.append)
        assert not collector.exists() and not warnings  # no monitoring on this box: nothing, quietly
        collector.mkdir()
        assert textfile.publish_record(session, host, "eval", RECORD, "pass", warnings.append)
        assert os.listdir(collector) == [] and not warnings  # a directory the role did not mark: nothing
        (collector / textfile.MARKER).write_text("the monitoring role's\n")
        assert textfile.publish_record(session, host, "eval", RECORD, "pass", warnings.append)
        assert textfile.publish_record(session, host, "bench", RECORD, "invalid", warnings.append)
    assert sorted(os.listdir(collector)) == [textfile.MARKER, "dsv4kit-record-bench.prom", "dsv4kit-record-eval.prom"]
    assert oct((collector / "dsv4kit-record-eval.prom").stat().st_mode & 0o777) == "0o644"
    eval_series = _samples((collector / "dsv4kit-record-eval.prom").read_text())
    assert eval_series[0].labels["run_id"] == RECORD["run_id"] and eval_series[0].labels["outcome"] == "pass"
    if shutil.which("prometheus-node-exporter"):  # the real collector reads them
        port = _free_port()
        proc = subprocess.Popen(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}",
                                 f"--collector.textfile.directory={collector}", "--collector.disable-defaults",
                                 "--collector.textfile"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            text = _scrape(port)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        outcomes = {s.labels["kind"]: s.labels["outcome"] for s in _samples(text) if s.name == "dsv4kit_record_info"}
        assert outcomes == {"bench": "invalid", "eval": "pass"}, text[-2000:]
        assert "node_textfile_scrape_error 0" in text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                return answer.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
