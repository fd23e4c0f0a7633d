"""Without the client: the /metrics parse against prometheus_client's, the series
selection, the gates' new bounds, the decode-only window, verdicts, spills, run ids and the
results repository's own-repository rule."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from dsv4kit.serving.box import metrics as box_helper
from dsv4kit.bench.metrics import cross_check, prometheus_samples
from tests.bench_support import client_line, good_evidence, point_expectation, synthetic_record

TRICKY = (
    "# HELP sglang:num_running_reqs The number of running requests.\n"
    "# TYPE sglang:num_running_reqs gauge\n"
    'sglang:num_running_reqs{model_name="a \\"q\\" \\\\ b\\nc",engine_type="unified",tp_rank="0",pp_rank="0",'
    'moe_ep_rank="0",priority=""} 3.0 1700000000000\n'
    'sglang:num_running_reqs{model_name="a \\"q\\" \\\\ b\\nc",engine_type="unified",tp_rank="0",pp_rank="0",'
    'moe_ep_rank="0",priority="1"} 3\n'
    "sglang:num_queue_reqs{ tp_rank=\"0\" , pp_rank=\"0\" } +Inf\n"
    "sglang:gen_throughput{tp_rank=\"0\",pp_rank=\"0\",} NaN\n"
    "sglang:token_usage 1e-3\n"
)


def standin_texts() -> list[str]:
    """The stand-in's /metrics in each shape, with requests running in two priorities."""
    from tests.fake_sglang_server import State

    texts = []
    for priority in (False, True):
        for all_schedulers in (False, True):
            args = argparse.Namespace(model_path="/m/DeepSeek-V4-Flash", context_length=4096, token_delay_ms=1,
                                      error_every=0, cached_tokens=0, vocab_size=10, decode_cap=0, prefill_ms=0,
                                      serial_prefill=False, batch_slowdown=0, omit="", max_running_requests=256,
                                      max_total_num_tokens=1000, tp_size=4, enable_priority_scheduling=priority,
                                      enable_metrics_for_all_schedulers=all_schedulers,
                                      gauge_refresh_passes=0)  # live gauges: the shapes, not the cadence
            state = State(args)
            for p, n in ((0, 3), (5, 2)):
                for _ in range(n):
                    state.enter("running", p, 1)
            state.enter("queued", 5, 1)
            texts.append(state.metrics())
    return texts


@pytest.mark.parametrize("text", [TRICKY, *standin_texts()])
def test_the_box_parser_reads_what_prometheus_client_reads(text):
    ours = box_helper.parse_exposition(text)
    theirs = prometheus_samples(text)
    norm = lambda rows: sorted((n, sorted(l.items()), repr(v)) for n, l, v in rows)  # noqa: E731
    assert norm(ours) == norm(theirs)
    assert cross_check({"exposition": {"1": text}}, 1) is None


def test_series_are_selected_by_label_as_0523_writes_them():
    for text in standin_texts():  # every shape: 5 running (3 + 2 by priority), 1 queued
        values, problems = box_helper.select_metrics(box_helper.parse_exposition(text))
        assert values["num_running_reqs"] == 5 and values["num_queue_reqs"] == 1, text
        assert "num_running_reqs" not in problems
    # DP groups add up; the ranks inside one are copies
    text = "".join(f'sglang:num_running_reqs{{tp_rank="{t}",pp_rank="0",dp_rank="{t // 2}"}} {2 + t // 2}\n'
                   for t in range(4))
    assert box_helper.select_metrics(box_helper.parse_exposition(text))[0]["num_running_reqs"] == 5
    # the same rank twice, differing in another label: ambiguous, named
    text = ('sglang:num_running_reqs{model_name="a",tp_rank="0",pp_rank="0"} 4\n'
            'sglang:num_running_reqs{model_name="b",tp_rank="0",pp_rank="0"} 4\n')
    values, problems = box_helper.select_metrics(box_helper.parse_exposition(text))
    assert "num_running_reqs" not in values and "ambiguous" in problems["num_running_reqs"]
    assert 'model_name="b"' in problems["num_running_reqs"]
    # only the priority breakdown: no total
    text = 'sglang:num_running_reqs{tp_rank="0",priority="1"} 4\n'
    assert "no total" in box_helper.select_metrics(box_helper.parse_exposition(text))[1]["num_running_reqs"]
    with pytest.raises(box_helper.ExpositionError):
        box_helper.parse_exposition('sglang:num_running_reqs{tp_rank="0" 4\n')


def test_exact_occupancy_has_no_tolerance_and_names_a_parse_problem():
    from dsv4kit.bench.gates import GateConfig, evaluate

    line = client_line(n=8, concurrency=8)
    evidence, window = good_evidence(8, running=16)  # 8 of another client's beside the bench's 8
    validity = evaluate(line, point_expectation(8, 16, 8, 8), GateConfig(), evidence, window)
    assert "exact_occupancy" in validity["failed"] and "foreign load" in validity["gates"]["exact_occupancy"]["detail"]
    evidence, window = good_evidence(64, running=70)  # fitted under round three's C + floor(0.1 x C)
    assert not evaluate(client_line(n=64, concurrency=64), point_expectation(64, 16, 8, 64), GateConfig(), evidence,
                        window)["gates"]["exact_occupancy"]["passed"]
    evidence, window = good_evidence(8)
    window["parse_problem"] = "the box-side /metrics parse of port 1 disagrees with prometheus_client's"
    assert not evaluate(line, point_expectation(8, 16, 8, 8), GateConfig(), evidence, window)["gates"]["exact_occupancy"]["passed"]


def test_an_ambiguous_series_fails_the_gate_naming_it():
    from dsv4kit.bench.window import analyze

    problem = "sglang:num_running_reqs is ambiguous: 2 total series for the same rank"
    samples = [{"t": 1001.0 + i * 0.01, "port": 7, "problems": {"num_running_reqs": problem}} for i in range(30)]
    window = analyze({"ttfts": [0.01] * 8, "itls": [[0.01] * 9] * 8}, 4, {"main_run_marker_time": 1000.0,
                                                                          "samples": samples}, 7)
    assert window["running"] is None and problem in window["evidence"]


def test_the_headline_counts_only_time_with_all_c_decoding():
    from dsv4kit.bench.window import analyze

    # C=1: 8 requests of 100 ms prefill then 32 tokens 10 ms apart (the first one carries 4 tokens).
    line = {"ttfts": [0.1] * 8, "itls": [[0.01] * 28] * 8, "output_lens": [32] * 8}
    window = analyze(line, 1, None, 1)
    assert window["client_decode_tok_s"] == pytest.approx(100.0, rel=0.01)  # 1000 / TPOT, not diluted by prefill
    assert window["window_tok_s"] < 0.9 * window["client_decode_tok_s"]  # the window with the prefills in it
    assert window["tokens"] == 7 * 32 + 28  # (a, b]: the first request's first chunk is before a; 4 tokens in each other


def test_window_placement_uses_the_monotonic_clock():
    from dsv4kit.bench.window import analyze

    marker = 50.0  # monotonic; the wall clock stepped back 4 s in the middle
    samples = [{"t": marker + 1.0 + i * 0.02, "wall": 9000.0 + i * 0.02 - (4.0 if i > 5 else 0.0), "port": 7,
                "num_running_reqs": 4.0, "num_queue_reqs": 0.0} for i in range(11)]
    evidence = {"clock": "monotonic", "main_run_marker_time": marker, "main_run_marker_wall": 9000.0,
                "samples": samples}
    window = analyze({"ttfts": [0.01] * 8, "itls": [[0.01] * 9] * 8}, 4, evidence, 7)
    assert window["samples"] >= 8 and window["running"]["median"] == 4.0 and window["clock"] == "monotonic"


def test_the_worst_concurrency_decides_and_the_summary_names_each():
    from dsv4kit.records.compare import compare

    base = {1: [100.0, 101.0, 99.0], 8: [400.0, 404.0, 396.0]}
    old = synthetic_record("lo-ctx4096-20260101T000000Z-aaaaaa", base)
    better = {1: [130.0, 131.0, 129.0], 8: [400.0, 404.0, 396.0]}
    new = synthetic_record("lo-ctx4096-20260101T000100Z-bbbbbb", better, invalid=((8, 1),))
    result = compare(old, new)
    assert result.outcome == "invalid" and result.exit_code() == 1
    assert result.concurrency_outcomes()[8] == "invalid"
    assert "C=8 invalid (new: 1 of 3 repetitions invalid" in result.summary() and "C=1 " in result.summary()
    # an A/B record whose arm B is invalid at one concurrency: never "ok"
    from dsv4kit.bench.sweep import arm_comparison

    ab = synthetic_record("lo-ctx4096-20260101T000200Z-cccccc", base)
    bad_b = synthetic_record("x", base, invalid=((8, 0),))
    ab["points"] = [dict(p, arm="A") for p in ab["points"]] + [dict(p, arm="B") for p in bad_b["points"]]
    ab["ab"] = {"key": "SGLANG_SM120_TRITON_INDEXER", "kind": "env", "values": {"A": "0", "B": "1"}}
    assert arm_comparison(ab).outcome == "invalid"


def test_records_compare_refuses_pooled_arms_and_compares_one(tmp_path):
    from tests.cli_support import invoke

    from tests.bench_support import publish_record

    base = {1: [100.0, 101.0, 99.0]}
    ab = synthetic_record("lo-ctx4096-20260101T000200Z-cccccc", base)
    ab["points"] = [dict(p, arm=arm) for arm in ("A", "B") for p in ab["points"]]
    plain = synthetic_record("lo-ctx4096-20260101T000300Z-dddddd", base)
    repo = tmp_path / "results"
    publish_record(repo, ab)
    publish_record(repo, plain)
    pooled = invoke(["records", "compare", ab["run_id"], plain["run_id"], "--results-repo", str(repo)])
    assert pooled.exit_code == 2 and "never pooled" in pooled.output
    one = invoke(["records", "compare", ab["run_id"] + "@A", plain["run_id"], "--results-repo", str(repo)])
    assert one.exit_code == 0 and "C=1 ok" in one.output, one.output


def test_spills_are_durable_and_a_failed_write_leaves_no_temporary_file(tmp_path):
    script = (
        "import resource, sys; from pathlib import Path\n"
        "from dsv4kit.bench.sweep import write_durably\n"
        "target = Path(sys.argv[1])\n"
        "write_durably(target, b'x' * 1000)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"  # a full disk, as far as this process goes
        "try:\n    write_durably(target, b'y' * 100000)\nexcept OSError as exc:\n    print('failed', exc.errno)\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "f.json")], capture_output=True, text=True,
                         timeout=60)
    assert "failed" in out.stdout, out.stderr
    assert (tmp_path / "f.json").read_bytes() == b"x" * 1000  # the old copy, whole
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no .tmp left behind


def test_run_ids_never_repeat_and_a_taken_spill_is_refused(tmp_path):
    from dsv4kit.bench.sweep import BenchAbort, Spill, run_names, utc_stamp

    from datetime import datetime, timezone

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ids = {run_names("lo", 4096, utc_stamp(now))[0] for _ in range(200)}
    assert len(ids) == 200  # the same second, the same host
    Spill(tmp_path / "run").create()
    with pytest.raises(BenchAbort, match="exists already"):
        Spill(tmp_path / "run").create()


def test_restarts_are_spread_between_repetitions():
    from dsv4kit.bench.sweep import restart_before

    assert [r for r in range(4) if restart_before(r, 4, 3)] == [1, 2, 3]
    assert [r for r in range(4) if restart_before(r, 4, 1)] == [2]
    assert [r for r in range(3) if restart_before(r, 3, 0)] == []


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_results_folder_inside_another_checkout_is_refused_before_any_work(tmp_path, loopback_ssh):
    from tests.bench.test_bench_sweep import dsv4kit
    from tests.remote_inventory import write_inventory

    parent = tmp_path / "checkout"
    parent.mkdir()
    git(parent, "init", "-q", "-b", "main")
    (parent / "README").write_text("x")
    git(parent, "add", "README")
    git(parent, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "parent")
    head = git(parent, "rev-parse", "HEAD")
    results = parent / "results"
    (results / ".git").mkdir(parents=True)  # what an interrupted `git init` left
    (results / ".git" / "config").write_text("")
    inventory = write_inventory(tmp_path / "inv", loopback_ssh, dsv4_model_path="/models/DeepSeek-V4-Flash")
    proc = dsv4kit("bench", "--ctx", "4096", "--input-len", "16", "--output-len", "8", "-i", str(inventory),
                   "--results-repo", str(results))
    assert proc.returncode == 2 and "not a usable repository of its own" in proc.stderr, proc.stderr
    assert str(parent) in proc.stderr
    assert git(parent, "rev-parse", "HEAD") == head and git(parent, "tag", "-l") == ""

    # a new results repository is made whole beside its place, then renamed in: it is its own
    from dsv4kit.records.results_repo import ensure_repo

    fresh = ensure_repo(parent / "fresh")
    assert git(fresh, "rev-parse", "--show-toplevel") == str(fresh.resolve())
    assert not [p for p in parent.iterdir() if p.name.startswith(".fresh")]


def test_a_kept_spill_is_published_later(tmp_path):
    from tests.cli_support import invoke

    from dsv4kit.bench.sweep import Spill, SweepResult

    record = synthetic_record("lo-ctx4096-20260101T000000Z-eeeeee", {1: [100.0, 101.0]})
    record = dict(record, incomplete=True, validity_passed=False)
    spill = Spill(tmp_path / "spill" / record["run_id"])
    spill.create()
    spill.point(record["points"][0], "details/c1_r0.json.gz", {"ttfts": [0.1]})
    spill.progress(SweepResult(record=record, details={}))
    repo = tmp_path / "results"
    out = invoke(["records", "publish", str(spill.directory), "--results-repo", str(repo), "--json"])
    assert out.exit_code == 0, out.output
    published = json.loads(out.output)
    assert published["incomplete"] is True and not spill.directory.exists()
    assert git(repo, "tag", "-l") == record["tag"]
    assert (repo / "records" / record["run_id"] / "details" / "c1_r0.json.gz").is_file()
    again = invoke(["records", "publish", str(spill.directory), "--results-repo", str(repo)])
    assert again.exit_code == 2
