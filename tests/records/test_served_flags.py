"""The kernel flags a record carries are the ones the servers ran with, not the inventory's ``auto``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.cli_support import invoke

from dsv4kit.serving.box import __main__ as bench_remote
from dsv4kit.records.compare import compare, format_comparison
from dsv4kit.core.inventory import Host
from dsv4kit.records.provenance import sections
from dsv4kit.records.record import comparability_key
from tests.bench_support import publish_record, synthetic_record, write_units

INDEXER, ATTENTION = "SGLANG_SM120_TRITON_INDEXER", "SGLANG_SM120_MMA_ATTENTION"
BASE = {1: [100.0, 101.0, 99.0], 16: [500.0, 505.0, 495.0]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host(prefix: Path, decode_port: int, prefill_port: int | None = None, flags=None) -> Host:
    return Host(name="lo", groups=[], source=prefix / "hosts.yml", vars={
        "dsv4_decode_port": decode_port, "dsv4_prefill_port": prefill_port or decode_port,
        "dsv4_router_port": decode_port, "dsv4_prefix": str(prefix), "dsv4_state_dir": str(prefix / "state"),
        "dsv4_kernel_flags": flags or {INDEXER: "auto", ATTENTION: "auto"}, "dsv4_gpu_count": 8})


def probe(prefix: Path) -> dict:
    """The real box-side probe, run here against the scratch prefix (and this machine's /proc)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench_remote.main(["probe", "--model-path", str(prefix / "model"), "--state-dir", str(prefix / "state"),
                           "--unit-dir", str(prefix / "etc/systemd/system"),
                           "--decision-file", str(prefix / "etc/dsv4kit/kernel-decision.json")])
    return json.loads(out.getvalue())


def software(h: Host, found: dict) -> dict:
    return sections(host=h, probe=found, server_info={}, context_length=4096, restarted=False)["software"]


@contextlib.contextmanager
def launch_server_stand_in(port: int, env: dict):
    """A process that looks like ``python -m sglang.launch_server --port PORT`` in /proc, with ``env``."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-m", "sglang.launch_server",
                             "--tp", "4", "--port", str(port)],
                            env={"PATH": os.environ.get("PATH", ""), **env})
    try:
        time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ------------------------------------------------------------------------------ comparability
def test_records_of_auto_inventories_whose_servers_ran_different_flags_are_not_comparable():
    off = synthetic_record("lo-ctx4096-20260101T000000Z", BASE, indexer="0")
    on = synthetic_record("lo-ctx4096-20260101T000100Z", BASE, indexer="1")
    assert off["software"]["kernel_flags_configured"] == on["software"]["kernel_flags_configured"]  # both "auto"
    result = compare(off, on)
    assert not result.comparable and result.rows == []
    diff = {d["field"]: (d["old"], d["new"]) for d in result.differences}
    assert diff == {"kernel_flags": (f"{ATTENTION}=0,{INDEXER}=0", f"{ATTENTION}=0,{INDEXER}=1")}
    assert "NOT COMPARABLE" in format_comparison(result)
    assert compare(off, on, ignore=["kernel_flags"]).comparable  # when the flag is the point
    same = synthetic_record("lo-ctx4096-20260101T000200Z", BASE, indexer="1")
    assert compare(on, same).comparable


def test_unknown_flags_never_match_not_even_each_other():
    a = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    b = synthetic_record("lo-ctx4096-20260101T000100Z", BASE)
    for rec in (a, b):
        rec["software"].update(kernel_flags=None, kernel_flags_reason="decode: environ unreadable")
        rec["comparability_key"] = comparability_key(rec)
    assert a["comparability_key"]["kernel_flags"].startswith("unknown: decode: environ unreadable")
    result = compare(a, b)
    assert not result.comparable and [d["field"] for d in result.differences] == ["kernel_flags"]
    assert compare(a, b, ignore=["kernel_flags"]).comparable


def test_records_from_before_the_resolved_flags_read_the_decode_servers_environment():
    old = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    for key in ("kernel_flags_servers", "kernel_flags_reason", "kernel_flags_configured"):
        old["software"].pop(key)
    old["software"]["kernel_flags"] = {INDEXER: "auto", ATTENTION: "auto"}  # the inventory's, as recorded then
    old["software"]["server_env"] = {INDEXER: "0"}
    assert comparability_key(old)["kernel_flags"] == f"{ATTENTION}=0,{INDEXER}=0"
    assert not compare(old, synthetic_record("lo-ctx4096-20260101T000100Z", BASE, indexer="1")).comparable
    del old["software"]["server_env"]
    assert comparability_key(old)["kernel_flags"].startswith("unknown")


def test_an_ab_record_over_a_kernel_flag_keeps_its_verdict_and_matches_no_plain_record():
    from dsv4kit.bench.sweep import arm_comparison

    rec = synthetic_record("lo-ctx4096-20260101T000000Z", {1: [100.0, 101.0, 99.0]})
    points = []
    for arm in ("A", "B"):
        points += [dict(p, arm=arm) for p in rec["points"]]
    rec["points"] = points
    rec["ab"] = {"key": INDEXER, "kind": "env", "values": {"A": "0", "B": "1"}}
    assert comparability_key(rec)["kernel_flags"] == f"{ATTENTION}=0,{INDEXER}=A/B 0|1"
    assert arm_comparison(rec).comparable
    with pytest.raises(ValueError, match="never pooled"):  # both arms are never compared as one record
        compare(rec, synthetic_record("lo-ctx4096-20260101T000100Z", {1: [100.0]}))
    from dsv4kit.records.compare import select_arm

    # one arm, with the flags it ran with (here the record's own), is a record like any other
    assert compare(select_arm(rec, "B"), synthetic_record("lo-ctx4096-20260101T000100Z", {1: [100.0]})).comparable


def test_records_show_and_compare_cli_name_the_flags(tmp_path):
    repo = tmp_path / "results"
    off = synthetic_record("lo-ctx4096-20260101T000000Z", BASE, indexer="0")
    on = synthetic_record("lo-ctx4096-20260101T000100Z", BASE, indexer="1")
    publish_record(repo, off)
    publish_record(repo, on)
    shown = invoke(["records", "show", off["run_id"], "--results-repo", str(repo)])
    assert shown.exit_code == 0, shown.output
    assert f"kernel flags the servers ran with: {ATTENTION}=0, {INDEXER}=0" in shown.output
    compared = invoke(["records", "compare", off["run_id"], on["run_id"], "--results-repo", str(repo)])
    assert compared.exit_code == 2 and "kernel_flags" in compared.output, compared.output


# ------------------------------------------------------------------------------ probe -> record
def test_the_record_takes_the_flags_from_the_running_servers_environment(tmp_path):
    port = free_port()
    write_units(tmp_path, Path(sys.executable).parent.parent, port)  # the unit says INDEXER=1
    with launch_server_stand_in(port, {INDEXER: "0", ATTENTION: "1", "NCCL_P2P_DISABLE": "1"}) as proc:
        found = probe(tmp_path)
    sw = software(host(tmp_path, port), found)
    # the running process wins over the unit's (edited since?) environment file
    assert sw["kernel_flags"] == {ATTENTION: "1", INDEXER: "0"}, sw
    assert sw["kernel_flags_servers"]["decode"]["source"].startswith(f"/proc/{proc.pid}/environ")
    assert sw["kernel_flags_configured"] == {INDEXER: "auto", ATTENTION: "auto"}
    assert sw["kernel_decision"]["report"] is None and "not set by dsv4kit provision" in sw["kernel_decision"]["reason"]


def test_without_a_readable_process_the_units_tell_unless_a_restart_is_pending(tmp_path):
    port = free_port()
    write_units(tmp_path, Path(sys.executable).parent.parent, port)
    sw = software(host(tmp_path, port), probe(tmp_path))
    assert sw["kernel_flags"] == {ATTENTION: "0", INDEXER: "1"}
    assert "dsv4-decode.service" in sw["kernel_flags_servers"]["decode"]["source"]
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "restart-pending").write_text("")
    sw = software(host(tmp_path, port), probe(tmp_path))
    assert sw["kernel_flags"] is None and "restart of the serving units is pending" in sw["kernel_flags_reason"]
    record = {"software": sw}
    assert comparability_key(record)["kernel_flags"].startswith("unknown: decode:")


def test_nothing_to_read_says_so(tmp_path):
    sw = software(host(tmp_path, free_port()), probe(tmp_path))
    assert sw["kernel_flags"] is None
    assert "no sglang.launch_server" in sw["kernel_flags_reason"] and "no dsv4-decode.service" in sw["kernel_flags_reason"]


def test_pd_servers_that_ran_different_flags_are_recorded_per_server(tmp_path):
    decode, prefill = free_port(), free_port()
    with launch_server_stand_in(decode, {INDEXER: "1"}), launch_server_stand_in(prefill, {INDEXER: "0"}):
        found = probe(tmp_path)
    sw = software(host(tmp_path, decode, prefill), found)
    assert sw["kernel_flags"] is None and "different kernel flags" in sw["kernel_flags_reason"]
    assert sw["kernel_flags_servers"]["decode"]["flags"][INDEXER] == "1"
    assert sw["kernel_flags_servers"]["prefill"]["flags"][INDEXER] == "0"


def test_the_decision_file_names_the_report_and_a_hand_edit_is_a_warning(tmp_path):
    port = free_port()
    etc = tmp_path / "etc" / "dsv4kit"
    etc.mkdir(parents=True)
    (etc / "kernel-decision.json").write_text(json.dumps({
        "report": {"name": "lo-gpu7-20261201T120000Z.json", "sha256": "ab" * 32, "measured_on": "lo", "gpu_index": 7,
                   "path": "/home/someone/results/validation/lo-gpu7-20261201T120000Z.json"},
        "flags": {INDEXER: {"value": "1", "source": "report", "report": "lo-gpu7-20261201T120000Z.json",
                            "why": "faster at every decode shape", "numbers": [{"shape": "x"}]},
                  ATTENTION: {"value": "0", "source": "report", "why": "slower"}}}))
    with launch_server_stand_in(port, {INDEXER: "0"}):
        found = probe(tmp_path)
    decision = software(host(tmp_path, port), found)["kernel_decision"]
    assert decision["report"]["name"] == "lo-gpu7-20261201T120000Z.json" and "path" not in decision["report"]
    assert decision["flags"][INDEXER] == {"value": "1", "source": "report", "report": "lo-gpu7-20261201T120000Z.json",
                                          "why": "faster at every decode shape"}
    assert decision["warnings"] == [f"{INDEXER} was decided '1' (report) but the servers ran with '0'"]


def test_an_unreadable_environ_falls_back_to_the_unit(tmp_path):
    port = free_port()
    write_units(tmp_path, Path(sys.executable).parent.parent, port)
    found = {"processes": [{"pid": 7, "argv": ["python", "-m", "sglang.launch_server", "--port", str(port)],
                            "env": None, "env_reason": "cannot read /proc/7/environ (Permission denied)"}],
             "units": probe(tmp_path)["units"], "restart_pending": False}
    sw = software(host(tmp_path, port), found)
    assert sw["kernel_flags"] == {ATTENTION: "0", INDEXER: "1"}
    assert "Permission denied" in sw["kernel_flags_servers"]["decode"]["source"]


@pytest.mark.parametrize("missing", ["required", "optional"])
def test_a_missing_required_environment_file_leaves_the_flags_unknown(tmp_path, missing):
    port = free_port()
    write_units(tmp_path, Path(sys.executable).parent.parent, port)  # has an optional (-) missing.env
    if missing == "required":
        (tmp_path / "etc" / "dsv4kit" / "kernel-flags.env").unlink()
    sw = software(host(tmp_path, port), probe(tmp_path))
    if missing == "required":
        assert sw["kernel_flags"] is None and "kernel-flags.env" in sw["kernel_flags_reason"]
    else:
        assert sw["kernel_flags"] == {ATTENTION: "0", INDEXER: "1"}


def test_an_environment_file_written_after_the_server_started_is_not_trusted(tmp_path):
    port = free_port()
    write_units(tmp_path, Path(sys.executable).parent.parent, port)
    with launch_server_stand_in(port, {INDEXER: "1"}) as proc:
        found = probe(tmp_path)
    [seen] = [p for p in found["processes"] if p["pid"] == proc.pid]
    assert abs(seen["started_at"] - time.time()) < 60  # the real /proc start time
    flags_file = str(tmp_path / "etc" / "dsv4kit" / "kernel-flags.env")
    # the server's environ is unreadable (another user's process); its unit's flags file is newer
    process = {"pid": proc.pid, "argv": seen["argv"], "env": None, "env_reason": "Permission denied",
               "started_at": seen["started_at"]}
    os.utime(flags_file, (seen["started_at"] + 30, seen["started_at"] + 30))
    units = probe(tmp_path)["units"]
    sw = software(host(tmp_path, port), {"processes": [process], "units": units, "restart_pending": False})
    assert sw["kernel_flags"] is None and f"{flags_file} changed after the decode server started" in sw[
        "kernel_flags_reason"]
    os.utime(flags_file, (seen["started_at"] - 30, seen["started_at"] - 30))
    units = probe(tmp_path)["units"]
    sw = software(host(tmp_path, port), {"processes": [process], "units": units, "restart_pending": False})
    assert sw["kernel_flags"] == {ATTENTION: "0", INDEXER: "1"}
