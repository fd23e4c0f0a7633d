"""The profile in the record: ``bench --profile`` carries it, ``records show``/``compare`` print
it and gate it, and ``bench --baseline-ctx`` prints the throughput retention. One journey over
the loopback box: the record ``bench`` publishes is the one ``records`` reads."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.profiling.test_profile_cli import dsv4kit, leftovers, settled

pytestmark = pytest.mark.slow

# 2 requests of 16 + 600 tokens at 10 ms a token: the point and the profile's load take ~6 s each.
POINT = ["--concurrency", "2", "--repeat", "1", "--num-prompts", "2", "--warmup-requests", "1",
         "--input-len", "16", "--output-len", "600", "--metrics-interval", "0.02"]


def test_bench_profile_is_recorded_shown_gated_and_compared(bench_box, tmp_path):
    server, inventory = bench_box(context_length=4096)
    repo = tmp_path / "results"
    proc = dsv4kit("bench", "--ctx", "4096", *POINT, "--profile", "3", "--max-class-share", "dense_gemm=1%",
                   "-i", str(inventory), "--results-repo", str(repo), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]  # the gate; the point itself is valid
    out = json.loads(proc.stdout)
    assert out["validity_passed"] and out["exit_code"] == 1
    record = json.loads((repo / out["record_path"]).read_text())
    profile = record["profile"]
    assert profile["context_length"] == 4096 and profile["concurrency"] == 2 and profile["ranks"] == 4
    # Profiled without stacks: the stand-in's torch indexer fallback counts as dense GEMM and elementwise.
    assert profile["classes"]["dense_gemm"]["share"] > 0.01 and "per_rank" not in profile
    assert profile["indexer_by_name"] is False
    assert profile["gate"]["breaches"] and "dense GEMM" in profile["gate"]["breaches"][0]
    assert not settled(server)["profiling"] and leftovers(inventory) == []

    shown = dsv4kit("records", "show", out["run_id"], "--results-repo", str(repo))
    assert shown.returncode == 0 and "decode breakdown at context 4096, C=2" in shown.stdout
    assert "indexer" in shown.stdout and "not in the class table" in shown.stdout
    gated = dsv4kit("records", "show", out["run_id"], "--results-repo", str(repo), "--max-class-share", "dense_gemm=1%")
    assert gated.returncode == 1 and "gate failed" in gated.stderr
    # A limit just above the recorded share passes.
    loose_pct = min(100.0, round(100 * profile["classes"]["dense_gemm"]["share"] + 0.1, 2))
    loose = dsv4kit("records", "show", out["run_id"], "--results-repo", str(repo), "--max-class-share",
                    f"dense_gemm={loose_pct}%")
    assert loose.returncode == 0

    # The same box at a smaller context (the stand-in "restarted"): --baseline-ctx shows the retention.
    server.post("/_test/config", {"context_length": 2048})
    second = dsv4kit("bench", "--ctx", "2048", *POINT, "--baseline-ctx", "4096", "-i", str(inventory),
                     "--results-repo", str(repo), "--no-restart")
    assert "throughput retention at context 2048 against 4096" in second.stdout, second.stderr[-3000:]
    assert "C=2 " in second.stdout.split("throughput retention", 1)[1]
    new_id = subprocess.run(["git", "-C", str(repo), "tag", "-l", "bench/*/2048/*"], capture_output=True,
                            text=True, check=True).stdout.split("/")[-1].strip()
    compared = dsv4kit("records", "compare", out["run_id"], f"lo-ctx2048-{new_id}", "--ignore", "context_length",
                       "--results-repo", str(repo))
    assert "only A carries a profile" in compared.stdout, compared.stdout + compared.stderr
    both = dsv4kit("records", "compare", out["run_id"], out["run_id"], "--results-repo", str(repo),
                   "--max-class-share", "dense_gemm=1%")
    assert "decode breakdown (A: context 4096, B: context 4096)" in both.stdout
    assert both.returncode != 0 and "gate failed" in both.stderr


def test_max_class_share_without_profile_is_bad_input(tmp_path, loopback_ssh):
    from tests.remote_inventory import write_inventory

    inventory = write_inventory(tmp_path, loopback_ssh, dsv4_model_path="/nonexistent")
    proc = dsv4kit("bench", "--ctx", "4096", "--max-class-share", "indexer=2%", "-i", str(inventory),
                   "--results-repo", str(tmp_path / "r"))
    assert proc.returncode == 2 and "--max-class-share needs --profile" in proc.stderr
