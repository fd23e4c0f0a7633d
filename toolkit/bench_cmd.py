"""``dsv4kit bench``: the throughput sweep, recorded as one commit + tag in the results repository.

Exit codes: 0 every point valid (and no regression against the baseline); 1 a point failed a
validity gate, or the baseline comparison found a regression or could give no verdict because a
fact only the box tells (GPU model, client version) differs (the record is still published, with
the invalid points marked); 2 bad input (arguments, inventory, baseline, results path, or a
baseline that is not comparable, all found before connecting); 3 box unreachable; 4 a point or
the restart timed out; 5 something is missing (git or ansible-playbook here; venv, SGLang, a
running server on the box); 6 the client or ansible or git failed; 7 the baseline comparison
(or, with --ab, arm B against arm A) was inconclusive (fewer than 3 valid repetitions a side, or
too noisy to tell: never a pass); 130 interrupted. On 3-6 the points that had finished are
published as an incomplete record (never a baseline); on 2 and 130 nothing is recorded, except a
Ctrl-C after the record was committed, which says so.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from dsv4kit import exitcodes
from dsv4kit.cli_common import check_hosts, doing, interruptible

DEFAULT_RESULTS_REPO = Path("results/bench")


def default_results_repo() -> Path:
    return Path(os.environ.get("DSV4KIT_RESULTS_REPO", DEFAULT_RESULTS_REPO))


def _fail(code: int, message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _find_baseline(repo: Path, host_name: str, context_length: int) -> dict:
    from dsv4kit import results_repo
    from dsv4kit.bench import safe_name

    if not repo.exists():
        _fail(exitcodes.USAGE, f"--baseline-ctx: results repository {str(repo)!r} does not exist yet")
    prefix = f"{safe_name(host_name)}-ctx{context_length}-"
    entries = [e for e in results_repo.list_records(repo) if e.run_id.startswith(prefix)]
    if not entries:
        _fail(exitcodes.USAGE, f"--baseline-ctx {context_length}: no record for host {host_name!r} at context "
                               f"length {context_length} in {repo} (run `dsv4kit bench --ctx {context_length}` first)")
    # Only a valid, complete record serves as a baseline: the newest such one.
    skipped = []
    for entry in reversed(entries):
        record = results_repo.read_entry(repo, entry)
        reason = baseline_problem(record)
        if reason is None:
            return record
        skipped.append(f"{entry.run_id} ({reason})")
    _fail(exitcodes.USAGE, f"--baseline-ctx {context_length}: no valid record for host {host_name!r} at context "
                           f"length {context_length} in {repo}; only valid records serve as baselines, and these "
                           f"are not: {', '.join(skipped)}")


def baseline_problem(record: dict) -> Optional[str]:
    """Why ``record`` may not serve as a baseline (None: it may): an invalid point or an incomplete sweep."""
    if record.get("incomplete"):
        return "incomplete: the sweep stopped before its last point"
    if record.get("ab"):
        return "an A/B record (two arms in one record); compare its arms with `dsv4kit records show`"
    if not record.get("validity_passed"):
        return f"{record.get('invalid_points')} invalid point(s)"
    return None


@interruptible("dsv4kit bench", "nothing was run or recorded")
def bench(
    invocation: typer.Context,
    ctx: int = typer.Option(..., "--ctx", help="Context length (tokens) the decode server must run with; e.g. 131072. The serving units are restarted with it if they run with another."),
    concurrency: str = typer.Option("1,16,64", "--concurrency", "-c", help="Comma-separated max-concurrency points."),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="Prompt tokens per request (fixed). Default: ctx - max(1024, output-len)."),
    output_len: Optional[int] = typer.Option(None, "--output-len", help="Generated tokens per request (fixed, ignore_eos). Default 512."),
    repeat: int = typer.Option(3, "--repeat", min=1, help="Repetitions of every point (>= 2 gives intervals; a comparison verdict needs >= 3 valid ones a side)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="Requests per point. Default: max(32, 10*C), or max(8, 2*C) when input-len >= 32768. Fewer than --min-concurrency-ratio x C is refused (the concurrency gate could not pass)."),
    warmup_requests: Optional[int] = typer.Option(None, "--warmup-requests", min=0, help="Warm-up requests per point (default max(C, 8))."),
    seed: int = typer.Option(42, "--seed", help="Client seed (prompts are identical across points; the cache is flushed)."),
    host: Optional[str] = typer.Option(None, "--host", help="Inventory host (default: the only host)."),
    inventory: Optional[Path] = typer.Option(None, "--inventory", "-i", help="Inventory file (default: inventory/hosts.yml or $DSV4KIT_INVENTORY)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Compare against this record (run id, tag or record.json path); exit 1 on a regression."),
    baseline_ctx: Optional[int] = typer.Option(None, "--baseline-ctx", help="Compare against the newest record of this host at this context length (the context length may differ; nothing else may, so give --input-len/--output-len that fit both). Checked before connecting."),
    results_repo_path: Path = typer.Option(None, "--results-repo", help="Results git repository (created if absent; git and write access are checked before connecting). Default: results/bench or $DSV4KIT_RESULTS_REPO."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout (progress stays on stderr)."),
    point_timeout: float = typer.Option(3600.0, "--point-timeout", min=1.0, help="Seconds one point may run before its remote process group is killed (the sweep then aborts)."),
    server_timeout: float = typer.Option(1800.0, "--server-timeout", min=1.0, help="Seconds to wait for the servers after a restart."),
    metrics_interval: float = typer.Option(0.25, "--metrics-interval", min=0.01, max=10.0, help="Seconds between two scrapes of the servers' /metrics during a point (the running-batch gate and the record's samples)."),
    restart: bool = typer.Option(True, "--restart/--no-restart", help="Restart the serving units when their context length differs (default), or fail."),
    min_concurrency_ratio: float = typer.Option(0.8, "--min-concurrency-ratio", min=0.0, max=1.0, help="Gate: achieved/requested concurrency at least this."),
    max_cache_hit_pct: float = typer.Option(1.0, "--max-cache-hit-pct", min=0.0, max=100.0, help="Gate: prefix-cache hit rate at most this (%) on a flushed cache."),
    retok_tolerance: float = typer.Option(0.05, "--retok-tolerance", min=0.0, max=1.0, help="Gate: |retokenized/reported output tokens - 1| at most this."),
    ab: Optional[str] = typer.Option(None, "--ab", metavar="KEY=A,B", help="A/B in one record: KEY is an environment variable of the serving units (e.g. SGLANG_SM120_TRITON_INDEXER=0,1) or a server flag (e.g. --attention-backend=triton,dsv4). Repetitions run interleaved A B A B with a server restart (the playbook) before every arm; the record holds both arms and the verdict of B against A (exit 0 B no worse, 1 B regressed or a point invalid, 7 inconclusive)."),
    trust_new_host_key: bool = typer.Option(False, "--trust-new-host-key", help="Accept and record an unknown host key (a changed key is always refused)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Stream the client's own output."),
) -> None:
    """Run the throughput sweep with the real sglang.benchmark.serving client on the box.

    The headline is the decode tok/s the server delivered in each point's steady-state window.
    Each point is gated (completed, errors, retokenized output, TTFT > 0, input lengths, achieved
    concurrency, the server's running batch from /metrics, max_running_requests, KV capacity,
    cold cache, same server); a gate without its evidence fails. The sweep becomes one record:
    one commit and one annotated tag (bench/<host>/<ctx>/<UTC stamp>) in the results repository.
    Finished points are spilled locally at once; a sweep that fails after some points publishes
    them as an incomplete record.

    Exit codes: 0 ok; 1 an invalid point or a regression; 2 bad input; 3 unreachable; 4 timeout;
    5 something missing; 6 the client, ansible or git failed; 7 the comparison was inconclusive;
    130 interrupted.
    """
    from dsv4kit import bench as sweep
    from dsv4kit import results_repo
    from dsv4kit.bench_args import check_lengths, check_prompts
    from dsv4kit.bench_gates import GateConfig
    from dsv4kit.compare import compare, format_comparison, key_differences
    from dsv4kit.inventory import InventoryError, default_inventory_path, load_inventory
    from dsv4kit.records import RecordError

    def progress(message: str) -> None:
        typer.echo(message, err=True)

    for name, value in (("--point-timeout", point_timeout), ("--server-timeout", server_timeout)):
        if not math.isfinite(value):
            _fail(exitcodes.USAGE, f"{name} must be a finite number of seconds, got {value}")
    repo = results_repo_path or default_results_repo()
    inventory_path = inventory or default_inventory_path()
    doing("checking the inputs before connecting")
    check_lengths(ctx, input_len, output_len)  # in the user's terms, before any derived length
    check_prompts(num_prompts, concurrency, min_concurrency_ratio,
                  ratio_given=invocation.get_parameter_source("min_concurrency_ratio").name != "DEFAULT")
    try:
        isl, osl = sweep.default_lengths(ctx, input_len, output_len)
        cfg = sweep.SweepConfig(
            context_length=ctx, concurrency=sweep.parse_concurrency(concurrency), input_len=isl, output_len=osl,
            repeat=repeat, num_prompts=num_prompts, warmup_requests=warmup_requests, seed=seed,
            point_timeout_s=point_timeout, server_timeout_s=server_timeout, restart=restart, verbose=verbose,
            metrics_interval_s=metrics_interval,
            gates=GateConfig(retok_tolerance=retok_tolerance, min_concurrency_ratio=min_concurrency_ratio,
                             max_cache_hit_pct=max_cache_hit_pct),
        )
        sweep.check_config(cfg)
    except sweep.BenchAbort as exc:
        _fail(exc.exit_code, str(exc))
    if baseline and baseline_ctx is not None:
        _fail(exitcodes.USAGE, "give --baseline or --baseline-ctx, not both")
    ab_spec = None
    if ab is not None:
        if baseline or baseline_ctx is not None:
            _fail(exitcodes.USAGE, "--ab compares its two arms with each other; it takes no --baseline/--baseline-ctx")
        try:
            ab_spec = sweep.parse_ab(ab)
        except sweep.BenchAbort as exc:
            _fail(exc.exit_code, str(exc))
        if repeat < 3:
            typer.echo(f"warning: --ab with --repeat {repeat}: a verdict needs at least 3 valid repetitions per arm, "
                       f"so this will be inconclusive (exit 7)", err=True)
    try:
        results_repo.check_writable(repo)  # before the sweep: a bad path must not cost a sweep
    except results_repo.GitNotFound as exc:
        _fail(exitcodes.ENVIRONMENT, f"--results-repo: {exc}")
    except results_repo.ResultsRepoError as exc:
        _fail(exitcodes.USAGE, f"--results-repo: {exc}")
    try:
        inv = load_inventory(inventory_path)
        target = inv.host(host)
        sweep.check_host(target)
        if ab_spec is not None:
            from dsv4kit import provision

            try:  # every arm restarts the serving units through the playbook
                provision.check_tags(provision.check_tools(), tags=sweep.arm_extra_vars(target, ctx, ab_spec, "A")[0])
            except provision.ProvisionError as exc:
                _fail(exc.exit_code, f"--ab restarts the serving units for every arm: {exc}")
        if restart:
            warning = sweep.check_restart_tools(target, ctx)
            if warning:
                typer.echo(f"warning: {warning}", err=True)
    except InventoryError as exc:
        _fail(exitcodes.USAGE, str(exc))
    except sweep.BenchAbort as exc:
        _fail(exc.exit_code, str(exc))

    old = None
    ignore: tuple[str, ...] = ()
    try:
        if baseline:
            old = results_repo.read_record(repo, baseline)
            problem = baseline_problem(old)
            if problem:
                _fail(exitcodes.USAGE, f"baseline {old['run_id']} cannot serve as a baseline: {problem}; only "
                                       f"valid records serve as baselines")
        elif baseline_ctx is not None:
            old = _find_baseline(repo, target.name, baseline_ctx)
            ignore = ("context_length",)
    except (RecordError, results_repo.ResultsRepoError) as exc:
        _fail(exitcodes.USAGE, f"baseline: {exc}")
    if old is not None:
        differences = key_differences(old, sweep.planned_record(cfg, target),
                                      ignore=(*ignore, *sweep.BOX_KEY_FIELDS))
        if differences:
            hint = (" With --baseline-ctx give --input-len and --output-len that fit both context lengths "
                    "(the default input length is --ctx minus 1024)." if ignore else "")
            _fail(exitcodes.USAGE, f"baseline {old['run_id']} is not comparable with this sweep, so nothing was run: "
                                   + "; ".join(f"{d['field']} {d['old']!r} there, {d['new']!r} here" for d in differences)
                                   + "." + hint)

    from dsv4kit.ssh import RemoteError, open_session

    # The same checks as provision and validate: inventory, key file, known_hosts (exit 2 or 3).
    check_hosts(inventory_path, host=target.name, trust_new_host_key=trust_new_host_key)
    doing("running the sweep")
    spill_root = sweep.default_spill_root()

    def publish(result) -> "results_repo.Published":
        record = result.record
        return results_repo.publish(repo, run_id=result.run_id, tag=result.tag, files=result.files(),
                                    message=f"bench {result.run_id}\n\nhost {target.name}, context length {ctx}, "
                                            f"concurrency {cfg.concurrency}, {cfg.input_len}/{cfg.output_len} "
                                            f"tokens, {cfg.repeat} repetition(s); valid: {record['validity_passed']}"
                                            + ("; INCOMPLETE" if record.get("incomplete") else ""))

    def publish_partial(exc: Exception) -> str:
        """A sweep that stopped after some points: publish them as an incomplete record."""
        partial = getattr(exc, "partial", None)
        if partial is None:
            return "nothing was recorded"
        spilled = spill_root / partial.run_id
        try:
            published = publish(partial)
        except (results_repo.ResultsRepoError, KeyboardInterrupt) as publish_error:
            return (f"the {len(partial.record['points'])} completed point(s) could not be published "
                    f"({publish_error}); they are kept in {spilled}")
        sweep.Spill(spilled).remove()
        return (f"the {len(partial.record['points'])} completed point(s) were recorded as INCOMPLETE record "
                f"{partial.run_id} (tag {published.tag}); it never serves as a baseline")

    try:
        with open_session(target, trust_new_host_key=trust_new_host_key, say=progress) as session:
            result = sweep.run_sweep(cfg, host=target, session=session, inventory_path=inventory_path,
                                     progress=progress, argv=sys.argv, spill_root=spill_root, ab=ab_spec)
    except KeyboardInterrupt:
        _fail(exitcodes.INTERRUPTED, f"interrupted: the sweep was stopped; nothing was recorded in {repo} "
                                     f"(points that had finished are kept under {spill_root})")
    except sweep.BenchAbort as exc:
        _fail(exc.exit_code, f"{exc}\n{publish_partial(exc)}")
    except RemoteError as exc:
        _fail(exc.exit_code, f"{exc} (sweep aborted; {publish_partial(exc)})")
    except InventoryError as exc:
        _fail(exitcodes.USAGE, str(exc))

    record = result.record
    spilled = spill_root / result.run_id
    try:
        published = publish(result)
    except KeyboardInterrupt:
        _fail(exitcodes.INTERRUPTED, f"interrupted before the record was published; nothing was recorded in {repo} "
                                     f"(the sweep is kept in {spilled})")
    except results_repo.ResultsRepoError as exc:
        _fail(exitcodes.TOOL_FAILED, f"{exc} (nothing was recorded in {repo}; the sweep is kept in {spilled})")
    sweep.Spill(spilled).remove()
    recorded = f"recorded {result.run_id}: commit {published.commit[:12]}, tag {published.tag} in {repo}"
    if published.worktree_warning:
        progress(f"warning: {recorded}, but the work tree of {repo} was not updated "
                 f"(`git -C {repo} reset --hard` brings it along): {published.worktree_warning}")
    if published.interrupted:
        progress(recorded)
        _fail(exitcodes.INTERRUPTED, "interrupted after the record was committed: it is published and complete "
                                     "(the summary and any comparison were skipped)")

    comparison = None
    if old is not None:
        comparison = compare(old, record, ignore=ignore)

    # A baseline that turns out not comparable on a field only the box tells (GPU model, client
    # version, kernel flags the servers ran with) gives no verdict: a failed check (1), like a regression; it never masks an invalid point.
    # An inconclusive comparison is never a pass: its own code (7), below an invalid point or a regression.
    code = exitcodes.OK
    if not record["validity_passed"] or (comparison is not None and comparison.outcome in ("regressed",
                                                                                          "not-comparable")):
        code = exitcodes.CHECK_FAILED
    elif comparison is not None and comparison.outcome == "inconclusive":
        code = exitcodes.INCONCLUSIVE
    if ab_spec is not None and code == exitcodes.OK:
        code = {"regressed": exitcodes.CHECK_FAILED, "inconclusive": exitcodes.INCONCLUSIVE}.get(
            record["ab"]["outcome"], exitcodes.OK)

    if json_out:
        typer.echo(json.dumps({
            "run_id": result.run_id, "tag": published.tag, "commit": published.commit,
            "results_repo": str(repo), "record_path": f"records/{result.run_id}/record.json",
            "validity_passed": record["validity_passed"], "invalid_points": record["invalid_points"],
            "points": [{"max_concurrency": p["max_concurrency"], "repetition": p["repetition"],
                        "valid": p["validity"]["passed"], "failed_gates": p["validity"]["failed"],
                        "decode_tok_s": p["derived"]["decode_tok_s"], "arm": p.get("arm")} for p in record["points"]],
            "summary": record["summary"],
            "comparison": comparison.to_dict() if comparison is not None else None,
            "ab": record.get("ab"),
            "exit_code": code,
        }, indent=2))
    else:
        typer.echo(sweep.format_summary(record))
        typer.echo(recorded)
        if not record["validity_passed"]:
            typer.echo(f"{record['invalid_points']} point(s) INVALID (see the gates above); they are marked "
                       f"invalid in the record and left out of the summary")
        if comparison is not None:
            typer.echo("")
            typer.echo(format_comparison(comparison))
    raise typer.Exit(code)
