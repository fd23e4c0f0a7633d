"""``dsv4kit records``: list, show, compare and plot bench records in the results repository.

A record is named by its run id (``box1-ctx131072-20260101T120000Z``), its tag
(``bench/box1/131072/20260101T120000Z``), a unique run-id prefix, or a ``record.json`` path.

``compare`` exit codes: 0 comparable, no regression and every metric told apart from the noise;
1 a metric regressed (also "mixed": better at one C, worse at another) or a concurrency is
invalid (an invalid or missing point on either side); 2 the records are not comparable (the
differing key fields are listed; no verdict), a record was not found, or an A/B record was given
without naming an arm (``ID@A``); 7 inconclusive (fewer than 3 valid repetitions on a side, or
noise too large to tell). The worst concurrency decides.

``publish DIR`` publishes a sweep kept in a spill directory (a publish that failed, a disk that
filled up): its ``record.json``, else its ``record.partial.json`` as an incomplete record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import typer

from dsv4kit.core import exitcodes
from dsv4kit.core.options import JsonOut, MaxClassShare, Output, ResultsRepo
from dsv4kit.core.cli_common import check_output, deprecated, doing, interruptible

app = typer.Typer(help="List, show, compare and plot bench records.", no_args_is_help=True)


def _repo(path: Optional[Path]) -> Path:
    """The results repository to read; exit 2 when it names a file (or anything not a directory)."""
    from dsv4kit.core.paths import RESULTS_REPO_ENV, results_repo_or_default

    repo = results_repo_or_default(path)
    if repo.exists() and not repo.is_dir():
        # Named as the user gave it: the option, the environment variable, or the default.
        what = (f"--results-repo {str(repo)!r}" if path is not None else
                f"${RESULTS_REPO_ENV} {str(repo)!r}" if os.environ.get(RESULTS_REPO_ENV) else
                f"the default results repository {str(repo)!r}")
        _fail(exitcodes.USAGE, f"{what} is a file, not a directory: a results repository is a git "
                               f"directory (give one with --results-repo DIR)")
    doing(f"reading the results repository {repo}", "nothing was changed")
    if repo.is_dir():
        _check_git(repo)
    return repo


def _has_records_branch(repo: Path) -> bool:
    import subprocess

    from dsv4kit.records.results_repo import BRANCH

    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"refs/heads/{BRANCH}"],
                          capture_output=True, text=True, timeout=30)
    return done.returncode == 0


def _check_git(repo: Path) -> None:
    """Exit 2 unless ``repo`` is a git repository of its own (reading never creates one)."""
    from dsv4kit.records.results_repo import ResultsRepoError, check_branch, check_path

    try:
        is_repo = check_path(repo)
        # Records live on branch main, which reading finds whatever is checked out; a repository
        # without it (one on master, say) would read as empty, so it is refused as bench refuses it.
        if is_repo and not _has_records_branch(repo):
            check_branch(repo)
    except ResultsRepoError as exc:
        _fail(exitcodes.USAGE, str(exc))
    if not is_repo:
        _fail(exitcodes.USAGE, f"results repository {str(repo)!r} is not a git repository (`dsv4kit bench` "
                               f"creates one on its first record; give one with --results-repo DIR)")


def _fail(code: int, message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load(repo: Path, ident: str) -> dict:
    from dsv4kit.records.record import RecordError
    from dsv4kit.records.results_repo import ResultsRepoError, read_record

    try:
        return read_record(repo, ident)
    except (RecordError, ResultsRepoError) as exc:
        _fail(exitcodes.USAGE, str(exc))


def _load_side(repo: Path, ident: str) -> dict:
    """A record to compare; ``ID@A`` / ``ID@B`` is one arm of an A/B record (arms are never pooled)."""
    from dsv4kit.records.compare import select_arm

    base, sep, arm = ident.rpartition("@")
    if not sep or not base:
        return _load(repo, ident)
    record = _load(repo, base)
    if record.get("kind") == "dsv4kit-eval":  # its arms are judged from their answers (quality.compare)
        return dict(record, _arm=arm)
    try:
        return select_arm(record, arm)
    except ValueError as exc:
        _fail(exitcodes.USAGE, str(exc))


@app.command("list")
@interruptible("dsv4kit records list", "nothing was changed")
def list_records(
    results_repo: ResultsRepo = None,
    json_out: JsonOut = False,
) -> None:
    """List the records, oldest first: run id, tag, context, lengths, concurrency, validity."""
    from dsv4kit.records.record import RecordError
    from dsv4kit.records.results_repo import ResultsRepoError, list_records as entries_of, read_entry

    repo = _repo(results_repo)
    try:
        entries = entries_of(repo)
        rows = []
        for entry in entries:
            record = read_entry(repo, entry)
            if record.get("kind") == "dsv4kit-eval":
                from dsv4kit.records.eval_record import list_row

                rows.append(list_row(entry, record))
                continue
            key = record["comparability_key"]
            rows.append({"run_id": entry.run_id, "tag": entry.tag, "context_length": key["context_length"],
                         "input_len": key["input_len"], "output_len": key["output_len"],
                         "concurrency": key["concurrency"], "repeat": record["sweep"]["repeat"],
                         "validity_passed": record["validity_passed"], "created_at_utc": record["created_at_utc"]})
    except (RecordError, ResultsRepoError) as exc:
        _fail(exitcodes.USAGE, str(exc))
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no records in {repo}")
        return
    line = "{:<44} {:<8} {:<11} {:<12} {:<6} {:<14} {}".format
    typer.echo(line("RUN ID", "CONTEXT", "ISL/OSL", "CONCURRENCY", "REPEAT", "VALIDITY", "TAG"))
    for row in rows:
        if row.get("kind") == "eval":
            typer.echo(line(row["run_id"], row["context_length"], "eval", f"--ab {row['ab']}" if row["ab"] else "-",
                            "", str(row["outcome"]).upper(), row["tag"] or "(untagged)"))
            continue
        typer.echo(line(row["run_id"], row["context_length"], f"{row['input_len']}/{row['output_len']}",
                        ",".join(map(str, row["concurrency"])), f"x{row['repeat']}",
                        "valid" if row["validity_passed"] else "INVALID points", row["tag"] or "(untagged)"))


@app.command("show")
@interruptible("dsv4kit records show", "nothing was changed")
def show(
    record_id: str = typer.Argument(..., metavar="ID", help="Run id, tag, unique prefix or record.json path."),
    results_repo: ResultsRepo = None,
    json_out: JsonOut = False,
    max_class_share: MaxClassShare = None,
) -> None:
    """Show one record: provenance, the per-point gates, the summary table and its decode
    breakdown when it carries a profile (exit 1 when a --max-class-share limit is exceeded)."""
    from dsv4kit.bench.sweep import format_summary
    from dsv4kit.records.gpu_telemetry import telemetry_line

    record = _load(_repo(results_repo), record_id)
    if json_out:  # the record as it is; the gate still decides the exit code, as in the plain run
        typer.echo(json.dumps(record, indent=2))
        raise typer.Exit(_profile_gate(record, max_class_share, show=False))
    if record.get("kind") == "dsv4kit-eval":
        from dsv4kit.records.eval_record import format_record

        typer.echo(format_record(record))
        raise typer.Exit(0)
    from dsv4kit.records.record import record_api

    sw, tk, gp, server = record["software"], record["toolkit"], record["gpus"], record["server"]
    ds = record["client"]["dataset"]
    typer.echo(f"{record['run_id']}  (tag {record['tag']}, schema {record['schema_version']})")
    typer.echo(f"created {record['created_at_utc']}, {record['duration_wall_s']:.0f} s; toolkit "
               f"{tk.get('version')} @ {str(tk.get('git_commit'))[:12]}{' (dirty)' if tk.get('git_dirty') else ''}")
    gpu_text = (f"{gp.get('model')} x{gp.get('count')}, driver {gp.get('driver')}" if gp.get("model")
                else f"unknown ({gp.get('reason') or 'not probed'})")
    typer.echo(f"host {record['host'].get('name')}: GPUs {gpu_text}; serving on {gp.get('serving_count')}")
    typer.echo(f"SGLang {_pairs(sw.get('sglang_version'))}, torch {_pairs(sw.get('torch'))} (CUDA "
               f"{_pairs(sw.get('torch_cuda'))}), triton {_pairs(sw.get('triton'))}")
    flags = sw.get("kernel_flags")
    ran = _pairs(flags) if flags is not None else f"UNKNOWN ({sw.get('kernel_flags_reason')})"
    typer.echo(f"kernel flags the servers ran with: {ran}; inventory: {_pairs(sw.get('kernel_flags_configured'))}")
    typer.echo(f"model {record['model'].get('name')} @ {record['model'].get('revision')}; context length "
               f"{server.get('context_length')}; launch args sha256 {str(server.get('launch_args_sha256'))[:12]}")
    typer.echo(f"API {record_api(record)} (client backend {record['client'].get('backend')}); "
               f"workload {ds['name']} {ds['input_len']}/{ds['output_len']} tokens, range ratio {ds['range_ratio']}, "
               f"seed {record['client']['seed']}, prompts per point {_pairs(record['client']['num_prompts'])}")
    typer.echo("")
    for point in record["points"]:
        v = point["validity"]
        dec = point["derived"].get("decode_tok_s")
        running = ((point.get("window") or {}).get("running") or {}).get("median")
        typer.echo(f"C={point['max_concurrency']:<4} rep {point['repetition']}"
                   f"{' arm ' + point['arm'] if point.get('arm') else ''}: "
                   f"decode {'-' if dec is None else f'{dec:.1f}'} tok/s (running batch "
                   f"{'-' if running is None else f'{running:g}'})  "
                   f"{'valid' if v['passed'] else 'INVALID: ' + ', '.join(v['failed'])}")
        for name in v["failed"]:
            typer.echo(f"    {name}: {v['gates'][name]['detail']}")
        if "gpu_telemetry" in point:
            typer.echo(f"    {telemetry_line(point['gpu_telemetry'], v['gates'].get('gpu_throttle'))}")
    typer.echo("")
    if record.get("incomplete"):
        typer.echo(f"INCOMPLETE: {record.get('incomplete_reason')}")
    typer.echo(format_summary(record))
    for note in record.get("notes") or []:
        typer.echo(f"note: {note}")
    _profile_gate(record, max_class_share)


def _pairs(value) -> str:
    """A mapping as ``NAME=value, ...`` (a list as ``a, b``; None as ``unknown``): never a Python repr."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={_pairs(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(_pairs(v) for v in value) or "none"
    return "unknown" if value is None else str(value)


def _profile_gate(record: dict, max_class_share: Optional[List[str]], show: bool = True) -> int:
    """Print the record's decode breakdown (``show``) and the ``--max-class-share`` breaches; exit 1
    on a breach (show), else return 1 or 0 (compare folds it into its own exit code)."""
    from dsv4kit.core.exitcodes import Abort
    from dsv4kit.profile.breakdown import record_report

    try:
        text, breaches = record_report(record, max_class_share or [])
    except Abort as exc:
        _fail(exc.exit_code, str(exc))
    if text and show:
        typer.echo("\n" + text)
    for breach in breaches:
        typer.echo(f"gate failed ({record['run_id']}): {breach}", err=True)
    if breaches and show:
        raise typer.Exit(exitcodes.CHECK_FAILED)
    return exitcodes.CHECK_FAILED if breaches else exitcodes.OK


@app.command("compare")
@interruptible("dsv4kit records compare", "nothing was changed")
def compare_cmd(
    old_id: str = typer.Argument(..., metavar="A", help="The old record (baseline); ID@A or ID@B for one arm of an A/B record."),
    new_id: str = typer.Argument(..., metavar="B", help="The new record; ID@A or ID@B for one arm of an A/B record."),
    results_repo: ResultsRepo = None,
    ignore: List[str] = typer.Option([], "--ignore", help="Comparability field allowed to differ (repeatable), e.g. context_length."),
    json_out: JsonOut = False,
    max_class_share: MaxClassShare = None,
) -> None:
    """Compare B against A per metric and concurrency (and their decode breakdowns when both carry
    a profile); exit 1 on a regression, an invalid concurrency or a --max-class-share breach in B,
    2 if not comparable, 7 if inconclusive (fewer than 3 valid repetitions a side, or too noisy to
    tell). The worst concurrency decides; the summary names each one's outcome."""
    from dsv4kit.records.compare import compare, format_comparison

    repo = _repo(results_repo)
    old, new = _load_side(repo, old_id), _load_side(repo, new_id)
    if "dsv4kit-eval" in (old.get("kind"), new.get("kind")):
        from dsv4kit.quality.compare import compare_records

        code, text, data = compare_records(repo, old, new, ignore=ignore)
        typer.echo(json.dumps(data, indent=2) if json_out else text)
        raise typer.Exit(code)
    try:
        result = compare(old, new, ignore=ignore)
    except ValueError as exc:
        _fail(exitcodes.USAGE, str(exc))
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(format_comparison(result))
        _print_profiles(old, new)
    gate = _profile_gate(new, max_class_share, show=False)
    raise typer.Exit(result.exit_code() or gate)


def _print_profiles(old: dict, new: dict) -> None:
    from dsv4kit.profile.breakdown import format_diff, record_profile

    a, b = record_profile(old), record_profile(new)
    if a is not None and b is not None:
        typer.echo("\n" + format_diff(a, b))
    elif a is not None or b is not None:
        typer.echo(f"\nonly {'A' if a is not None else 'B'} carries a profile (bench --profile); no breakdown to compare")


@app.command("publish")
@interruptible("dsv4kit records publish", "nothing was published")
def publish_cmd(
    spill_dir: Path = typer.Argument(..., metavar="DIR", help="A spill directory a sweep kept (its run id, under ~/.local/state/dsv4kit/spill or $DSV4KIT_SPILL_DIR)."),
    results_repo: ResultsRepo = None,
    json_out: JsonOut = False,
) -> None:
    """Publish a kept spill as one commit and tag; the spill is removed once it is published.
    A sweep that did not finish is published as an incomplete record (never a baseline)."""
    from dsv4kit.records import spill_publish
    from dsv4kit.core.paths import results_repo_or_default

    repo = results_repo_or_default(results_repo)
    doing(f"publishing {spill_dir} into {repo}", "nothing was published")
    try:
        published, record = spill_publish.publish_spill(spill_dir, repo)
    except spill_publish.SpillPublishError as exc:
        _fail(exc.exit_code, str(exc))
    if published.worktree_warning:
        typer.echo(f"warning: the work tree of {repo} was not updated (`git -C {repo} reset --hard` brings it "
                   f"along; the next publish does it too): {published.worktree_warning}", err=True)
    if json_out:
        typer.echo(json.dumps({"run_id": record["run_id"], "tag": published.tag, "commit": published.commit,
                               "already_published": published.already,
                               "incomplete": bool(record.get("incomplete")), "results_repo": str(repo)}, indent=2))
    elif published.already:
        typer.echo(f"{record['run_id']} was already published (commit {published.commit[:12]}, tag {published.tag} "
                   f"in {repo}); its spill {spill_dir} was removed")
    else:
        typer.echo(f"published {record['run_id']}{' (INCOMPLETE)' if record.get('incomplete') else ''}: commit "
                   f"{published.commit[:12]}, tag {published.tag} in {repo}")


@app.command("plot")
@interruptible("dsv4kit records plot", "no plot was written")
def plot_cmd(
    record_ids: List[str] = typer.Argument(None, metavar="[IDS]...", help="Records to plot (default: all)."),
    output: Output = None,
    old_out: Optional[Path] = typer.Option(None, "--out", hidden=True, help="Deprecated spelling of --output."),
    metric: str = typer.Option("decode_tok_s", "--metric", help="decode_tok_s (default), output_throughput, decode_tok_s_per_gpu, ..."),
    results_repo: ResultsRepo = None,
    json_out: JsonOut = False,
) -> None:
    """Write a PNG of tok/s against concurrency, one line per record (e.g. 8K vs 128K context)."""
    from dsv4kit.records.plot import plot_records
    from dsv4kit.records.record import SUMMARY_METRICS, RecordError
    from dsv4kit.records.results_repo import ResultsRepoError, list_records as entries_of, read_entry

    if old_out is not None:
        deprecated("--out", "--output/-o")
        if output is not None:
            _fail(exitcodes.USAGE, "give --output once (--out is its deprecated spelling)")
        output = old_out
    if output is None:
        _fail(exitcodes.USAGE, "give --output PATH (or -o PATH): the PNG file to write")
    check_output(output)
    out = output
    if metric not in SUMMARY_METRICS:
        _fail(exitcodes.USAGE, f"--metric {metric!r} is not one of {', '.join(SUMMARY_METRICS)}")
    repo = _repo(results_repo)
    if record_ids:
        records = [_load(repo, ident) for ident in record_ids]
    else:
        try:
            records = [read_entry(repo, e) for e in entries_of(repo)]
        except (RecordError, ResultsRepoError) as exc:
            _fail(exitcodes.USAGE, str(exc))
        if not records:
            _fail(exitcodes.USAGE, f"no records in {repo} to plot")
    doing(f"drawing {out}", "no plot was written")
    try:
        path = plot_records(records, out, metric=metric)
    except RuntimeError as exc:
        _fail(exitcodes.ENVIRONMENT, str(exc))
    if json_out:
        from dsv4kit.core.cli_common import json_result

        typer.echo(json.dumps(json_result({"output": str(path), "metric": metric,
                                           "records": [r.get("run_id") for r in records]}, exitcodes.OK), indent=2))
    else:
        typer.echo(f"wrote {path}")
