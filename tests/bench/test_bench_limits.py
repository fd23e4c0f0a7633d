"""``dsv4kit bench`` refuses, before connecting, what the inventory already says cannot run:
``-c`` above the servers' ``dsv4_max_running_requests`` and ``--ctx`` above the model's maximum
context. The host's port is closed: a run the checks let through ends with exit 3 (it tried to
connect), so exit 2 with the message proves nothing was attempted."""

from __future__ import annotations

from dsv4kit.core import exitcodes
from tests.bench.test_cli_bench_checks import SMALL, dsv4kit, no_traceback, unreachable_inventory


def test_concurrency_above_max_running_requests_is_refused_before_connecting(tmp_path, loopback_ssh):
    inventory = unreachable_inventory(tmp_path, loopback_ssh, dsv4_max_running_requests=4)
    proc = dsv4kit("bench", "--ctx", "4096", "-c", "1,4,8", *SMALL, "-i", str(inventory),
                   "--results-repo", str(tmp_path / "results"))
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert "--concurrency/-c 8 exceeds the servers' max_running_requests 4" in proc.stderr
    assert f"dsv4_max_running_requests of host 'lo' in {inventory}" in proc.stderr
    assert "cannot connect" not in proc.stderr and not (tmp_path / "results").exists()
    no_traceback(proc)
    proc = dsv4kit("bench", "--ctx", "4096", "-c", "1,4", *SMALL, "-i", str(inventory),
                   "--results-repo", str(tmp_path / "results"))
    assert proc.returncode == exitcodes.UNREACHABLE, proc.stderr  # within the limit: it goes on to connect


def test_ctx_above_the_models_maximum_is_refused_before_connecting(tmp_path, loopback_ssh):
    inventory = unreachable_inventory(tmp_path, loopback_ssh, dsv4_model_max_context_length=8192)
    proc = dsv4kit("bench", "--ctx", "16384", "-c", "1", *SMALL, "-i", str(inventory), "--no-restart",
                   "--results-repo", str(tmp_path / "results"))
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert "--ctx 16384 exceeds the model's maximum context length 8192" in proc.stderr
    assert "dsv4_model_max_context_length of host 'lo'" in proc.stderr and "cannot connect" not in proc.stderr
    no_traceback(proc)
    proc = dsv4kit("bench", "--ctx", "8192", "-c", "1", *SMALL, "-i", str(inventory), "--no-restart",
                   "--results-repo", str(tmp_path / "results"))
    assert proc.returncode == exitcodes.UNREACHABLE, proc.stderr


def test_the_shipped_inventory_sets_both_limits():
    from pathlib import Path

    import yaml

    all_vars = yaml.safe_load((Path(__file__).resolve().parents[2] / "inventory/group_vars/all.yml").read_text())
    assert all_vars["dsv4_max_running_requests"] == 64
    assert all_vars["dsv4_model_max_context_length"] == 1048576  # DeepSeek-V4-Flash's max_position_embeddings
