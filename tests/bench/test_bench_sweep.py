"""``dsv4kit bench`` end to end: the REAL sglang.benchmark.serving client (sglang 0.5.23 wheel) on the
"box" (this machine over the loopback sshd), against the loopback SGLang stand-in, into a real git
results repository.

The client's venv is built once per machine and cached (tests/bench_support.py); building it
the first time takes about three minutes.
"""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bench_support import cli_running
from tests.fake_sglang_server import FAKE_ADMIN_KEY, FAKE_API_KEY

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
# 8 prompts of 16 + 32 tokens (320 ms each at 10 ms per token); /metrics every 20 ms, so that even
# these short points have a steady-state window with samples in it.
SMALL = ["--input-len", "16", "--output-len", "64", "--num-prompts", "8", "--warmup-requests", "2",
         "--metrics-interval", "0.02"]


def dsv4kit(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4kit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def clients_running(inventory: Path) -> list[str]:
    """Command lines of bench clients still running for this inventory's box scratch directory."""
    scratch = str(inventory.parent / "state" / "scratch")
    deadline = time.monotonic() + 15
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "sglang.benchmark.serving" in text and scratch in text:
                found.append(text)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def repo_is_untouched(repo: Path) -> None:
    """No commit, no tag, no stray file: the repository is absent or empty."""
    if not repo.exists():
        return
    assert subprocess.run(["git", "-C", str(repo), "rev-parse", "-q", "--verify", "HEAD"],
                          capture_output=True).returncode != 0
    assert git(repo, "tag", "-l") == ""
    assert [p.name for p in repo.iterdir() if p.name != ".git"] == []


def not_strict_json(name: str):
    raise AssertionError(f"the record is not strict JSON: it contains {name}")


def scratch_dirs(inventory: Path) -> list[str]:
    """The bench scratch directories left on the "box" (its dsv4_state_dir/scratch)."""
    return sorted(p.name for p in (inventory.parent / "state" / "scratch").glob("bench-*"))


def test_full_sweep_is_recorded_as_one_commit_and_tag(bench_box, tmp_path):
    server, inventory = bench_box(context_length=4096, separate_prefill=True, units=True)
    repo = tmp_path / "results"
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1,4", "--repeat", "2", *SMALL,
                   "-i", str(inventory), "--results-repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    # progress per point, on stderr
    for label in ("[1/4] C=1 rep 1/2", "[2/4] C=4 rep 1/2", "[3/4] C=1 rep 2/2", "[4/4] C=4 rep 2/2"):
        assert label in proc.stderr
    assert "context length 4096 (ok)" in proc.stderr

    # one commit, one annotated tag, a clean work tree
    assert git(repo, "rev-list", "--count", "HEAD") == "1"
    assert git(repo, "tag", "-l") == out["tag"] and out["tag"].startswith("bench/lo/4096/")
    assert git(repo, "cat-file", "-t", out["tag"]) == "tag"
    assert git(repo, "rev-parse", "HEAD") == out["commit"]
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    record = json.loads((repo / out["record_path"]).read_text(), parse_constant=not_strict_json)

    assert record["schema_version"] == 2 and record["validity_passed"] and record["invalid_points"] == 0
    assert len(record["points"]) == 4 and all(p["validity"]["passed"] for p in record["points"])
    for point in record["points"]:
        raw = point["raw"]
        assert raw["completed"] == 8 and raw["random_range_ratio"] == 1.0 and raw["max_concurrency"] in (1, 4)
        assert point["derived"]["tpot_formula_tok_s"] == pytest.approx(raw["max_concurrency"] * 1000 / raw["median_tpot_ms"])
        assert point["derived"]["decode_tok_s_per_gpu"] == pytest.approx(point["derived"]["decode_tok_s"] / 8)
        assert point["window"]["occupancy"]["admissible"] and point["window"]["occupancy"]["window_scrapes"] >= 20
        assert point["server_evidence"]["meta_info"]["ok"] and "cached_tokens" in point["server_evidence"]["meta_info"]["keys"]
        assert "--random-range-ratio" in point["argv"] and "--flush-cache" in point["argv"]
        details = json.loads(gzip.decompress((repo / "records" / record["run_id"] / point["details_file"]).read_bytes()),
                             parse_constant=not_strict_json)
        assert details["input_lens"] == [16] * 8 and all(t > 0 for t in details["ttfts"])
        assert details["metrics_samples"] and "num_running_reqs" in details["metrics_samples"][0]
    summary = record["summary"]["per_concurrency"]
    assert summary["1"]["decode_tok_s"]["n"] == 2 and summary["4"]["decode_tok_s"]["ci95"] is not None
    # the cache was flushed before every measured run
    assert server.stats()["flush_count"] == 4

    # provenance
    assert record["toolkit"]["git_commit"] and record["toolkit"]["git_dirty"] in (True, False)
    sw = record["software"]
    assert sw["sglang_version"] == "0.5.23" and sw["torch"] and sw["triton"] and sw["sglang_wheel"]
    assert record["gpus"]["model"] is None and "nvidia-smi" in record["gpus"]["reason"]
    assert record["gpus"]["serving_count"] == 8 and record["gpus"]["servers_report"] == 8  # 4 prefill + 4 decode
    assert record["server"]["context_length"] == 4096 and record["server"]["launch_args_sha256"]
    assert record["server"]["resolved_args"]["tp_size"] == 4 and record["server"]["resolved_args_sha256"]
    assert record["server"]["prefill"]["resolved_args_sha256"] and record["server"]["prefill"]["context_length"] == 4096
    assert record["model"]["revision"] == "test-rev-1" and record["model"]["tokenizer_json_sha256"]
    # the flags the servers ran with (their units' environment files), not the inventory's
    assert sw["kernel_flags"] == {"SGLANG_SM120_MMA_ATTENTION": "0", "SGLANG_SM120_TRITON_INDEXER": "1"}
    assert set(sw["kernel_flags_servers"]) == {"decode", "prefill"} and sw["kernel_flags_reason"] is None
    assert sw["kernel_flags_configured"] == {"SGLANG_SM120_TRITON_INDEXER": "1"}
    assert record["comparability_key"]["kernel_flags"] == "SGLANG_SM120_MMA_ATTENTION=0,SGLANG_SM120_TRITON_INDEXER=1"
    # the serving environment, from the units and their environment files (the stand-in is no
    # sglang.launch_server process, so /proc has nothing to say)
    assert sw["server_env"]["SGLANG_SM120_TRITON_INDEXER"] == "1" and sw["server_env"]["NCCL_P2P_DISABLE"] == "1"
    assert sw["server_env"]["SGLANG_HF_TOKEN"] == "[SCRUBBED]" and "dsv4-decode.service" in sw["server_env_source"]
    assert record["server"]["units"]["dsv4-decode"]["exec_start"][1:3] == ["-m", "sglang.launch_server"]
    assert record["server"]["units"]["dsv4-decode"]["missing_env_files"][0].endswith("missing.env")
    assert record["client"]["seed"] == 42 and record["client"]["dataset"]["range_ratio"] == 1.0
    assert record["comparability_key"]["concurrency"] == [1, 4]

    # secrets from /server_info are nowhere in the repository (any file, any object)
    everything = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-all-objects", "--batch"],
                                capture_output=True).stdout
    blobs = [everything]
    for path in (repo / "records").rglob("*.gz"):
        blobs.append(gzip.decompress(path.read_bytes()))
    for blob in blobs:
        assert FAKE_API_KEY.encode() not in blob and FAKE_ADMIN_KEY.encode() not in blob
        assert b"hf_FAKE-SECRET-unit" not in blob
    assert "[SCRUBBED]" in json.dumps(record["server"]["launch_args"])

    # the box's scratch directory is gone
    assert (inventory.parent / "state" / "scratch").is_dir() and scratch_dirs(inventory) == []

    # the records commands read it back
    listed = dsv4kit("records", "list", "--results-repo", str(repo))
    assert listed.returncode == 0 and record["run_id"] in listed.stdout
    shown = dsv4kit("records", "show", out["tag"], "--results-repo", str(repo))
    assert shown.returncode == 0 and "decode tok/s" in shown.stdout


def test_an_error_chunk_makes_the_point_invalid(bench_box, tmp_path):
    # Every 5th /generate is rejected the way SGLang rejects an over-long prompt on a stream:
    # HTTP 200 + data: {"error": ...}. The client itself counts those requests as completed.
    # It also reports cached prompt tokens: a cache that was not cold.
    server, inventory = bench_box(context_length=4096, error_every=5, cached_tokens=4)
    repo = tmp_path / "results"
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "4", "--repeat", "1", *SMALL,
                   "-i", str(inventory), "--results-repo", str(repo), "--json")
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "INVALID" in proc.stderr and "error chunk counted as success" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["validity_passed"] is False and out["invalid_points"] == 1
    record = json.loads((repo / out["record_path"]).read_text())
    point = record["points"][0]
    assert point["raw"]["completed"] == 8  # the trap: the client says everything succeeded
    assert {"output_tokens", "ttft_positive", "cold_cache"} <= set(point["validity"]["failed"])
    assert record["summary"]["per_concurrency"]["4"]["decode_tok_s"]["n"] == 0  # not counted as valid


def test_an_interrupted_sweep_records_nothing(bench_box, tmp_path):
    server, inventory = bench_box(context_length=4096, token_delay_ms=40)
    repo = tmp_path / "results"
    seen = []
    with cli_running("bench", "--ctx", "4096", "--concurrency", "1,4", "--repeat", "1", *SMALL, "-i", str(inventory),
                     "--results-repo", str(repo)) as proc:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("[2/2] C=4") and "prompts" in line:
                break  # the first point is done and recorded nowhere yet; the second is running
        assert proc.poll() is None, "the sweep ended before its second point:\n" + "".join(seen)
        time.sleep(3)  # let the client start on the box
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    assert "nothing was recorded" in rest
    assert "1 finished point(s) are kept in" in rest  # the first point, and where it is
    repo_is_untouched(repo)
    assert scratch_dirs(inventory) == []
    assert clients_running(inventory) == []  # the remote client's process group was killed


def test_a_point_timeout_aborts_the_sweep_and_records_nothing(bench_box, tmp_path):
    server, inventory = bench_box(context_length=4096, token_delay_ms=2000)
    repo = tmp_path / "results"
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1", "--repeat", "1", *SMALL, "--point-timeout", "20",
                   "-i", str(inventory), "--results-repo", str(repo))
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "timed out" in proc.stderr and "nothing was recorded" in proc.stderr
    repo_is_untouched(repo)
    assert scratch_dirs(inventory) == []


def test_a_context_length_mismatch_restarts_the_servers(bench_box, tmp_path, loopback_ssh):
    from dsv4kit.bench.sweep import SweepConfig, run_sweep
    from dsv4kit.core.inventory import load_inventory
    from dsv4kit.core.ssh import open_session

    server, inventory = bench_box(context_length=2048, inventory_context_length=2048)
    host = load_inventory(inventory).host()
    restarts = []

    def restart(inventory_path, host_, context_length, progress, timeout):
        # What the sglang_service tag does to the real units, done to the stand-in.
        restarts.append(context_length)
        server.post("/_test/config", {"context_length": context_length})

    cfg = SweepConfig(context_length=4096, concurrency=[2], input_len=16, output_len=64, repeat=1, num_prompts=4,
                      warmup_requests=1, metrics_interval_s=0.02)
    lines = []
    with open_session(host) as session:
        result = run_sweep(cfg, host=host, session=session, inventory_path=inventory, progress=lines.append,
                           restart=restart)
    assert restarts == [4096]
    assert any("context length is 2048; restarting" in l for l in lines)
    assert result.record["server"]["context_length"] == 4096
    assert result.record["server"]["restarted_for_context_length"] is True
    assert result.record["validity_passed"], lines

    # --no-restart refuses instead (exit 5), before any point runs
    server.post("/_test/config", {"context_length": 2048})
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1", *SMALL, "--no-restart", "-i", str(inventory),
                   "--results-repo", str(tmp_path / "results"))
    assert proc.returncode == 5 and "--no-restart" in proc.stderr
    repo_is_untouched(tmp_path / "results")


def test_bad_input_fails_before_connecting(tmp_path, loopback_ssh):
    from tests.remote_inventory import write_inventory

    inventory = write_inventory(tmp_path / "inv", loopback_ssh, ansible_port=1,  # nothing listens there
                                dsv4_model_path="/models/DeepSeek-V4-Flash")
    proc = dsv4kit("bench", "--ctx", "4096", "--input-len", "4000", "--output-len", "512", "-i", str(inventory),
                   "--results-repo", str(tmp_path / "r"))
    assert proc.returncode == 2 and "exceeds --ctx 4096" in proc.stderr
    proc = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1,x", "-i", str(inventory))
    assert proc.returncode == 2 and "comma-separated" in proc.stderr
    proc = dsv4kit("bench", "--ctx", "4096", "--point-timeout", "inf", "-i", str(inventory))
    assert proc.returncode == 2 and "--point-timeout must be a finite number" in proc.stderr
    proc = dsv4kit("bench", "--ctx", "4096", "--baseline", "nope", "-i", str(inventory), "--results-repo",
                   str(tmp_path / "r"))
    assert proc.returncode == 2 and "baseline" in proc.stderr
    (tmp_path / "not-a-repo").mkdir()
    (tmp_path / "not-a-repo" / "notes.txt").write_text("x")
    proc = dsv4kit("bench", "--ctx", "4096", "--input-len", "16", "--output-len", "8", "-i", str(inventory),
                   "--results-repo", str(tmp_path / "not-a-repo"))
    assert proc.returncode == 2 and "not a git repository" in proc.stderr
    proc = dsv4kit("bench", "--ctx", "4096", "--input-len", "16", "--output-len", "8", "-i", str(inventory),
                   "--results-repo", str(tmp_path / "r"))
    assert proc.returncode == 3  # unreachable, and nothing recorded
    repo_is_untouched(tmp_path / "r")


def test_a_record_of_the_same_settings_is_a_comparable_baseline(bench_box, tmp_path):
    # The early comparability check (before connecting) must agree with the record a real sweep
    # writes: the second sweep runs, and the comparison after it has a verdict (the units tell
    # which kernel flags the servers ran with).
    server, inventory = bench_box(context_length=4096, units=True)
    repo = tmp_path / "results"
    args = ["bench", "--ctx", "4096", "--concurrency", "2", "--repeat", "1", *SMALL, "-i", str(inventory),
            "--results-repo", str(repo), "--json"]
    first = dsv4kit(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    second = dsv4kit(*args, "--baseline", json.loads(first.stdout)["run_id"])
    assert second.returncode == 7, second.stderr[-3000:]  # one repetition a side: inconclusive, never a pass
    out = json.loads(second.stdout)
    assert out["validity_passed"] and out["comparison"]["comparable"] is True, out["comparison"]
    assert out["comparison"]["rows"] and out["exit_code"] == second.returncode
    assert out["comparison"]["outcome"] == "inconclusive" and "INCONCLUSIVE" not in second.stdout  # --json


def test_a_failed_point_leaves_an_incomplete_record_with_the_completed_points(bench_box, tmp_path):
    # After the first point the server's /flush_cache starts answering 400 (it cannot go idle):
    # the client aborts the second point. The first point is not lost.
    server, inventory = bench_box(context_length=4096)
    repo = tmp_path / "results"
    seen = []
    with cli_running("bench", "--ctx", "4096", "--concurrency", "1,2", "--repeat", "1", *SMALL, "-i", str(inventory),
                     "--results-repo", str(repo)) as proc:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("[1/2] C=1") and "tok/s" in line:
                server.post("/_test/config", {"flush_status": 400})
                assert (tmp_path / "spill").is_dir()  # the finished point is on disk at once
                spilled = list((tmp_path / "spill").glob("*/point-c1-r0.json"))
                assert spilled, "the finished point was not spilled"
                break
        _, rest = proc.communicate(timeout=200)
    stderr = "".join(seen) + rest
    assert proc.returncode == 6, stderr
    assert "INCOMPLETE record" in stderr and "never serves as a baseline" in stderr
    records = list((repo / "records").glob("*/record.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["incomplete"] is True and record["validity_passed"] is False
    assert [p["max_concurrency"] for p in record["points"]] == [1]
    assert "flush" in record["incomplete_reason"] or "exited" in record["incomplete_reason"]
    assert git(repo, "tag", "-l") == record["tag"]
    assert list((tmp_path / "spill").glob("*/point-*.json")) == []  # published: the spill is removed
    # an incomplete record never serves as a baseline
    proc2 = dsv4kit("bench", "--ctx", "4096", "--concurrency", "1,2", "--repeat", "1", *SMALL, "-i", str(inventory),
                    "--results-repo", str(repo), "--baseline", record["run_id"])
    assert proc2.returncode == 2 and "incomplete" in proc2.stderr
