"""Records: the results git repository (atomic commit + tag), comparison verdicts, the records CLI."""

from __future__ import annotations

import json
import subprocess

import pytest
from tests.cli_support import invoke

from dsv4kit.records import results_repo
from dsv4kit.records.compare import compare, format_comparison
from dsv4kit.records.record import RecordError, dumps
from dsv4kit.records.results_repo import ResultsRepoError, list_records, publish, read_record
from tests.bench_support import publish_record, synthetic_record


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def commits(repo) -> list[str]:
    proc = subprocess.run(["git", "-C", str(repo), "rev-list", "--all"], capture_output=True, text=True)
    return proc.stdout.split() if proc.returncode == 0 else []


def files_of(record) -> dict:
    return {f"records/{record['run_id']}/record.json": dumps(record).encode()}


BASE = {1: [100.0, 101.0, 99.0], 16: [500.0, 505.0, 495.0]}


# ------------------------------------------------------------------------------ results repo
def test_publish_is_one_commit_and_one_annotated_tag(tmp_path):
    repo = tmp_path / "results"  # absent: created
    rec = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    published = publish(repo, run_id=rec["run_id"], tag=rec["tag"], files=files_of(rec), message="bench one")
    assert commits(repo) == [published.commit]
    assert git(repo, "cat-file", "-t", rec["tag"]) == "tag"  # annotated
    assert git(repo, "rev-parse", f"{rec['tag']}^{{commit}}") == published.commit
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "records" / rec["run_id"] / "record.json").is_file()  # work tree follows

    second = synthetic_record("lo-ctx4096-20260101T000100Z", BASE)
    publish(repo, run_id=second["run_id"], tag=second["tag"], files=files_of(second), message="bench two")
    assert len(commits(repo)) == 2 and git(repo, "status", "--porcelain") == ""
    assert [e.run_id for e in list_records(repo)] == [rec["run_id"], second["run_id"]]
    assert [e.tag for e in list_records(repo)] == [rec["tag"], second["tag"]]


def test_published_tags_are_never_moved_and_run_ids_never_reused(tmp_path):
    repo = tmp_path / "results"
    rec = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    publish_record(repo, rec)
    before = (commits(repo), git(repo, "rev-parse", rec["tag"]))
    other = synthetic_record("lo-ctx4096-20260101T000009Z", BASE)
    with pytest.raises(ResultsRepoError, match="already exists.*never moved"):
        publish(repo, run_id=other["run_id"], tag=rec["tag"], files=files_of(other), message="x")
    with pytest.raises(ResultsRepoError, match="never reused"):
        publish(repo, run_id=rec["run_id"], tag="bench/lo/4096/other", files=files_of(rec), message="x")
    assert (commits(repo), git(repo, "rev-parse", rec["tag"])) == before
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("fail_at", ["hash-object", "mktag", "update-ref"])
def test_an_interrupted_publish_leaves_no_commit_no_tag_no_file(tmp_path, monkeypatch, fail_at):
    repo = tmp_path / "results"
    first = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    publish_record(repo, first)
    before = commits(repo)
    real = results_repo._git

    def interrupted(repo_, *args, **kw):
        if args and args[0] == fail_at:
            raise KeyboardInterrupt
        return real(repo_, *args, **kw)

    monkeypatch.setattr(results_repo, "_git", interrupted)
    rec = synthetic_record("lo-ctx4096-20260101T000500Z", BASE)
    with pytest.raises(KeyboardInterrupt):
        publish(repo, run_id=rec["run_id"], tag=rec["tag"], files=files_of(rec), message="x")
    monkeypatch.setattr(results_repo, "_git", real)
    assert commits(repo) == before
    assert git(repo, "tag", "-l") == first["tag"]
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert not (repo / "records" / rec["run_id"]).exists()


def test_a_failing_transaction_changes_nothing(tmp_path):
    repo = tmp_path / "results"
    first = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    publish_record(repo, first)
    # Someone else moves the branch between our read and our update: the transaction must refuse.
    real = results_repo._git
    racer = []

    def racing(repo_, *args, **kw):
        if args and args[0] == "update-ref":
            other = git(repo, "commit-tree", "-p", "HEAD", "-m", "racer", git(repo, "rev-parse", "HEAD^{tree}"))
            git(repo, "update-ref", "refs/heads/main", other)
            racer.append(other)
        return real(repo_, *args, **kw)

    rec = synthetic_record("lo-ctx4096-20260101T000500Z", BASE)
    results_repo._git = racing
    try:
        with pytest.raises(ResultsRepoError, match="nothing was changed"):
            publish(repo, run_id=rec["run_id"], tag=rec["tag"], files=files_of(rec), message="x")
    finally:
        results_repo._git = real
    assert git(repo, "tag", "-l") == first["tag"]
    assert len(racer) == results_repo.PUBLISH_ATTEMPTS  # it rebuilt on the new head and retried each time
    assert git(repo, "rev-parse", "refs/heads/main") == racer[-1]  # the other writer's commit stands
    assert git(repo, "ls-tree", "-r", "--name-only", "HEAD", "--", f"records/{rec['run_id']}") == ""


def test_a_publish_that_loses_the_ref_race_rebuilds_on_the_new_head(tmp_path):
    # Another sweep publishes between our read of main and our transaction ("cannot lock ref"):
    # we rebuild on its commit and retry; both records stand, each under its own path.
    repo = tmp_path / "results"
    publish_record(repo, synthetic_record("lo-ctx4096-20260101T000000Z", BASE))
    real = results_repo._git
    other = synthetic_record("lo-ctx4096-20260101T000300Z", BASE)
    raced = []

    def racing(repo_, *args, **kw):
        if args and args[0] == "update-ref" and not raced:
            raced.append(True)
            publish(repo, run_id=other["run_id"], tag=other["tag"], files=files_of(other), message="other")
        return real(repo_, *args, **kw)

    rec = synthetic_record("lo-ctx4096-20260101T000500Z", BASE)
    results_repo._git = racing
    try:
        published = publish(repo, run_id=rec["run_id"], tag=rec["tag"], files=files_of(rec), message="ours")
    finally:
        results_repo._git = real
    assert raced and published.attempts == 2
    assert [e.run_id for e in list_records(repo)] == ["lo-ctx4096-20260101T000000Z", other["run_id"], rec["run_id"]]
    assert git(repo, "rev-parse", "HEAD^") == git(repo, "rev-parse", f"{other['tag']}^{{commit}}")
    assert git(repo, "rev-parse", f"{rec['tag']}^{{commit}}") == published.commit == git(repo, "rev-parse", "HEAD")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_repository_path_checks(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ResultsRepoError, match="is a file"):
        results_repo.ensure_repo(tmp_path / "file")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ResultsRepoError, match="not a git repository"):
        results_repo.ensure_repo(tmp_path / "full")


def test_read_record_by_id_tag_prefix_and_path(tmp_path):
    repo = tmp_path / "results"
    a = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    b = synthetic_record("lo-ctx131072-20260101T000100Z", BASE, context_length=131072)
    publish_record(repo, a)
    publish_record(repo, b)
    assert read_record(repo, a["run_id"])["run_id"] == a["run_id"]
    assert read_record(repo, b["tag"])["run_id"] == b["run_id"]
    assert read_record(repo, "lo-ctx1310")["run_id"] == b["run_id"]
    assert read_record(repo, str(repo / "records" / a["run_id"] / "record.json"))["run_id"] == a["run_id"]
    with pytest.raises(RecordError, match="ambiguous"):
        read_record(repo, "lo-ctx")
    with pytest.raises(RecordError, match="no record"):
        read_record(repo, "nope")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "dsv4kit.bench.sweep", "schema_version": 99}))
    with pytest.raises(RecordError, match="schema_version 99"):
        read_record(repo, str(bad))


# ------------------------------------------------------------------------------ comparison
def verdicts(result, metric="decode_tok_s"):
    return {r.concurrency: r.verdict for r in result.rows if r.metric == metric}


def test_a_regression_is_detected_and_noise_is_not():
    old = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    slower = synthetic_record("lo-ctx4096-20260101T000100Z", {1: [100.5, 99.5, 100.0], 16: [450.0, 452.0, 448.0]})
    result = compare(old, slower)
    assert result.comparable
    assert verdicts(result) == {1: "no-change", 16: "regressed"}
    assert verdicts(result, "median_tpot_ms")[16] == "regressed"
    row = next(r for r in result.rows if r.metric == "decode_tok_s" and r.concurrency == 16)
    assert row.delta_pct == pytest.approx(-10.0, abs=0.1) and row.ci_pct[1] < 0 and row.threshold_pct >= 3.0
    assert len(result.regressions) == 2  # decode tok/s and median TPOT at C=16
    assert format_comparison(result).splitlines()[-1] == "2 regression(s)"

    faster = synthetic_record("lo-ctx4096-20260101T000200Z", {1: [120.0, 121.0, 119.0], 16: [500.0, 504.0, 497.0]})
    assert verdicts(compare(old, faster)) == {1: "improved", 16: "no-change"}


def test_inconclusive_and_invalid_verdicts():
    old = synthetic_record("lo-ctx4096-20260101T000000Z", {1: [100.0], 16: [500.0, 505.0, 495.0]})
    noisy = synthetic_record("lo-ctx4096-20260101T000100Z", {1: [80.0], 16: [300.0, 700.0, 400.0]})
    v = verdicts(compare(old, noisy))
    assert v == {1: "inconclusive", 16: "inconclusive"}
    broken = synthetic_record("lo-ctx4096-20260101T000200Z", {1: [100.0], 16: [500.0, 505.0]},
                              invalid=((16, 0), (16, 1)))
    assert verdicts(compare(old, broken))[16] == "invalid"


def test_too_few_repetitions_or_too_much_noise_is_inconclusive_with_its_own_exit_code():
    base = synthetic_record("lo-ctx4096-20260101T000000Z", {16: [500.0, 505.0, 495.0]})
    # one valid repetition, -40%
    one = synthetic_record("lo-ctx4096-20260101T000100Z", {16: [300.0]})
    result = compare(base, one)
    assert verdicts(result) == {16: "inconclusive"} and result.outcome == "inconclusive" and result.exit_code() == 7
    # n=3 with ~10% CV, -30%
    noisy_old = synthetic_record("lo-ctx4096-20260101T000200Z", {16: [450.0, 500.0, 550.0]})
    noisy_new = synthetic_record("lo-ctx4096-20260101T000300Z", {16: [315.0, 350.0, 385.0]})
    result = compare(noisy_old, noisy_new)
    assert result.outcome in ("inconclusive", "regressed") and result.exit_code() != 0


def test_each_metric_gets_its_own_verdict_and_the_summary_names_them():
    from dsv4kit.records.compare import Comparison, Row

    rows = [Row("decode_tok_s", 8, 3, 3, 200.0, 260.0, 30.0, (20.0, 40.0), 5.0, "improved"),
            Row("median_ttft_ms", 8, 3, 3, 100.0, 14.0, -86.0, (-90.0, -80.0), 10.0, "improved"),
            Row("median_tpot_ms", 8, 3, 3, 10.0, 13.0, 30.0, (20.0, 40.0), 5.0, "regressed"),
            Row("p99_tpot_ms", 8, 3, 3, 12.0, 12.2, 1.6, (-1.0, 4.0), 15.0, "no-change")]
    result = Comparison("a", "b", True, rows=rows)
    assert result.metric_verdicts() == {"decode_tok_s": "improved", "median_ttft_ms": "improved",
                                        "median_tpot_ms": "regressed", "p99_tpot_ms": "no-change"}
    summary = result.summary()
    assert summary.startswith("C=8 regressed; throughput improved (decode_tok_s improved +30.0% at C=8)")
    assert "TTFT improved" in summary and "TPOT regressed (median_tpot_ms regressed +30.0% at C=8" in summary
    assert result.outcome == "regressed" and result.exit_code() == 1
    rows[2] = Row("median_tpot_ms", 16, 3, 3, 10.0, 8.0, -20.0, (-25.0, -15.0), 5.0, "improved")
    rows.append(Row("median_tpot_ms", 8, 3, 3, 10.0, 13.0, 30.0, (20.0, 40.0), 5.0, "regressed"))
    assert Comparison("a", "b", True, rows=rows).metric_verdicts()["median_tpot_ms"] == "mixed"


def test_non_comparable_records_get_no_verdict_and_say_why():
    old = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    other = synthetic_record("lo-ctx131072-20260101T000100Z", {1: [50.0], 64: [400.0]}, context_length=131072,
                             isl=512, gpu_model="NVIDIA H200")
    result = compare(old, other)
    assert not result.comparable and result.rows == []
    fields = {d["field"] for d in result.differences}
    assert {"context_length", "input_len", "gpu_model", "concurrency", "num_prompts"} <= fields
    text = format_comparison(result)
    assert "NOT COMPARABLE" in text and "context_length: 4096 -> 131072" in text
    same_but_ctx = synthetic_record("lo-ctx131072-20260101T000200Z", BASE, context_length=131072)
    assert not compare(old, same_but_ctx).comparable
    assert compare(old, same_but_ctx, ignore=["context_length"]).comparable
    with pytest.raises(ValueError, match="unknown comparability field"):
        compare(old, same_but_ctx, ignore=["colour"])


# ------------------------------------------------------------------------------ CLI
@pytest.fixture
def repo_with_records(tmp_path):
    repo = tmp_path / "results"
    records = {
        "base": synthetic_record("lo-ctx4096-20260101T000000Z", BASE),
        "slow": synthetic_record("lo-ctx4096-20260101T000100Z", {1: [100.5, 99.5, 100.0], 16: [450.0, 452.0, 448.0]}),
        "same": synthetic_record("lo-ctx4096-20260101T000200Z", {1: [100.2, 100.9, 99.1], 16: [501.0, 503.0, 497.0]}),
        "long": synthetic_record("lo-ctx131072-20260101T000300Z", {1: [60.0, 61.0, 60.5], 16: [280.0, 279.0, 281.0]},
                                 context_length=131072),
        "two": synthetic_record("lo-ctx4096-20260101T000400Z", {1: [60.0, 61.0], 16: [280.0, 279.0]}),
    }
    for rec in records.values():
        publish_record(repo, rec)
    return repo, records


def test_records_compare_exit_codes(repo_with_records):
    repo, recs = repo_with_records
    result = invoke(["records", "compare", recs["base"]["run_id"], recs["slow"]["run_id"], "--results-repo", str(repo)])
    assert result.exit_code == 1, result.output
    assert "regressed" in result.output and "Δ%" in result.output
    result = invoke(["records", "compare", recs["base"]["tag"], recs["same"]["tag"], "--results-repo", str(repo)])
    assert result.exit_code == 0, result.output
    assert "no regression" in result.output
    result = invoke(["records", "compare", recs["base"]["run_id"], recs["long"]["run_id"], "--results-repo", str(repo)])
    assert result.exit_code == 2 and "NOT COMPARABLE" in result.output and "context_length" in result.output
    result = invoke(["records", "compare", recs["base"]["run_id"], recs["long"]["run_id"], "--results-repo", str(repo),
                     "--ignore", "context_length", "--json"])
    assert result.exit_code == 1  # 128K is much slower than 8K here: regressions
    assert json.loads(result.output)["comparable"] is True
    # -40% with only two repetitions on a side: inconclusive, and that is never exit 0
    result = invoke(["records", "compare", recs["base"]["run_id"], recs["two"]["run_id"], "--results-repo", str(repo)])
    assert result.exit_code == 7 and "INCONCLUSIVE" in result.output and "--repeat 3" in result.output
    result = invoke(["records", "compare", "nope", recs["long"]["run_id"], "--results-repo", str(repo)])
    assert result.exit_code == 2 and "no record 'nope'" in result.output


def test_records_list_and_show(repo_with_records):
    repo, recs = repo_with_records
    result = invoke(["records", "list", "--results-repo", str(repo)])
    assert result.exit_code == 0
    assert all(r["run_id"] in result.output for r in recs.values())
    rows = json.loads(invoke(["records", "list", "--results-repo", str(repo), "--json"]).output)
    assert [r["context_length"] for r in rows] == [4096, 4096, 4096, 131072, 4096]
    shown = invoke(["records", "show", recs["long"]["run_id"], "--results-repo", str(repo)])
    assert shown.exit_code == 0 and "decode tok/s" in shown.output and "131072" in shown.output
    as_json = json.loads(invoke(["records", "show", recs["base"]["tag"], "--results-repo", str(repo), "--json"]).output)
    assert as_json["run_id"] == recs["base"]["run_id"]
    assert invoke(["records", "list", "--results-repo", str(repo.parent / "none")]).exit_code == 2


def test_records_plot_writes_a_png(repo_with_records, tmp_path):
    pytest.importorskip("matplotlib")
    repo, recs = repo_with_records
    out = tmp_path / "plot.png"
    result = invoke(["records", "plot", recs["base"]["run_id"], recs["long"]["run_id"], "--out", str(out),
                     "--results-repo", str(repo)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    every = tmp_path / "all.png"  # no ids: every record in the repository
    result = invoke(["records", "plot", "--out", str(every), "--results-repo", str(repo)])
    assert result.exit_code == 0, result.output
    assert every.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert invoke(["records", "plot", "--out", str(out), "--metric", "nonsense", "--results-repo", str(repo)]).exit_code == 2


def test_baseline_ctx_picks_the_newest_record_of_that_host_and_context(repo_with_records, tmp_path):
    from dsv4kit.bench.run import find_baseline as _find_baseline
    from dsv4kit.core.exitcodes import Abort

    repo, recs = repo_with_records
    assert _find_baseline(repo, "lo", 4096)["run_id"] == recs["two"]["run_id"]
    # a newer record with an invalid point, and a newer incomplete one, are passed over
    publish_record(repo, synthetic_record("lo-ctx4096-20260101T000500Z", BASE, invalid=((1, 0),)))
    incomplete = synthetic_record("lo-ctx4096-20260101T000600Z", BASE)
    incomplete["incomplete"] = True
    publish_record(repo, incomplete)
    assert _find_baseline(repo, "lo", 4096)["run_id"] == recs["two"]["run_id"]
    only_invalid = synthetic_record("lo-ctx8192-20260101T000700Z", BASE, context_length=8192, invalid=((1, 0),))
    publish_record(repo, only_invalid)
    with pytest.raises(Abort) as info:
        _find_baseline(repo, "lo", 8192)
    assert info.value.exit_code == 2
    assert _find_baseline(repo, "lo", 131072)["run_id"] == recs["long"]["run_id"]
    with pytest.raises(Abort) as info:
        _find_baseline(repo, "lo", 16384)
    assert info.value.exit_code == 2
    with pytest.raises(Abort):
        _find_baseline(repo, "other-box", 4096)


def test_records_compare_shows_field_level_differences_of_server_args_and_env():
    old = synthetic_record("lo-ctx4096-20260101T000000Z", BASE)
    new = synthetic_record("lo-ctx4096-20260101T000100Z", BASE)
    old["server"]["resolved_args"] = {"tp_size": 4, "attention_backend": "dsv4", "mem_fraction_static": 0.8}
    new["server"]["resolved_args"] = {"tp_size": 4, "attention_backend": "triton", "mem_fraction_static": 0.8,
                                      "enable_metrics": True}
    old["software"]["server_env"] = {"SGLANG_SM120_TRITON_INDEXER": "0", "NCCL_P2P_DISABLE": "1"}
    new["software"]["server_env"] = {"SGLANG_SM120_TRITON_INDEXER": "1", "NCCL_P2P_DISABLE": "1"}
    old["server"]["launch_args"] = ["python", "-m", "sglang.launch_server", "--tp", "4", "--port", "30000"]
    new["server"]["launch_args"] = ["python", "-m", "sglang.launch_server", "--tp", "4", "--port", "30000",
                                    "--enable-metrics"]
    result = compare(old, new)
    fields = {d["field"]: (d["old"], d["new"]) for d in result.info}
    assert fields["server.resolved_args.attention_backend"] == ("dsv4", "triton")
    assert fields["server.resolved_args.enable_metrics"] == (None, True)
    assert fields["software.server_env.SGLANG_SM120_TRITON_INDEXER"] == ("0", "1")
    assert fields["server.launch_args.--enable-metrics"] == (None, True)
    assert "server.resolved_args.tp_size" not in fields and "software.server_env.NCCL_P2P_DISABLE" not in fields
    assert "note: software.server_env.SGLANG_SM120_TRITON_INDEXER differs: 0 -> 1" in format_comparison(result)


def test_records_list_has_a_header_and_show_prints_no_python_reprs(repo_with_records):
    repo, recs = repo_with_records
    listing = invoke(["records", "list", "--results-repo", str(repo)]).output.splitlines()
    assert listing[0].split()[:3] == ["RUN", "ID", "CONTEXT"] and "VALIDITY" in listing[0], listing[0]
    shown = invoke(["records", "show", recs["long"]["run_id"], "--results-repo", str(repo)]).output
    assert not any(mark in shown for mark in ("{'", "['", "': ", "None")), shown


def test_records_refuses_a_plain_directory_that_is_no_git_repository(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for args in (("list",), ("show", "x"), ("compare", "a", "b")):
        result = invoke(["records", *args, "--results-repo", str(plain)])
        assert result.exit_code == 2 and "not a git repository" in result.output, (args, result.output)


def test_records_plot_title_fits_inside_the_figure():
    pytest.importorskip("matplotlib")
    from dsv4kit.records.compare import METRICS
    from dsv4kit.records.plot import figure

    record = {"run_id": "r", "summary": {"per_concurrency": {"1": {m: {"n": 1, "mean": 1.0} for m in METRICS}}}}
    for metric in METRICS:
        fig = figure([record], metric)
        fig.canvas.draw()
        box = fig.axes[0].title.get_window_extent()
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, (metric, box)
