"""``dsv4kit bench``: the throughput sweep, recorded as one commit + tag in the results repository.

Exit codes: 0 every point valid (and no regression against the baseline); 1 a point failed a
validity gate, or the baseline comparison found a regression or could give no verdict because a
fact only the box tells (GPU model, client version) differs (the record is still published, with
the invalid points marked); 2 bad input (arguments, inventory, baseline, results path, or a
baseline that is not comparable, all found before connecting); 3 box unreachable; 4 a point or
the restart timed out; 5 something is missing (git or ansible-playbook here; venv, SGLang, a
running server on the box); 6 the client or ansible or git failed; 130 interrupted. On 2-6 and
130 nothing is recorded, except a Ctrl-C after the record was committed, which says so.
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
    return results_repo.read_record(repo, entries[-1].run_id)


@interruptible("dsv4kit bench", "nothing was run or recorded")
def bench(
    invocation: typer.Context,
    ctx: int = typer.Option(..., "--ctx", help="Context length (tokens) the decode server must run with; e.g. 131072. The serving units are restarted with it if they run with another."),
    concurrency: str = typer.Option("1,16,64", "--concurrency", "-c", help="Comma-separated max-concurrency points."),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="Prompt tokens per request (fixed). Default: ctx - max(1024, output-len)."),
    output_len: Optional[int] = typer.Option(None, "--output-len", help="Generated tokens per request (fixed, ignore_eos). Default 512."),
    repeat: int = typer.Option(3, "--repeat", min=1, help="Repetitions of every point (>= 2 gives intervals; 3 recommended)."),
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
    restart: bool = typer.Option(True, "--restart/--no-restart", help="Restart the serving units when their context length differs (default), or fail."),
    min_concurrency_ratio: float = typer.Option(0.8, "--min-concurrency-ratio", min=0.0, max=1.0, help="Gate: achieved/requested concurrency at least this."),
    max_cache_hit_pct: float = typer.Option(1.0, "--max-cache-hit-pct", min=0.0, max=100.0, help="Gate: prefix-cache hit rate at most this (%) on a flushed cache."),
    retok_tolerance: float = typer.Option(0.05, "--retok-tolerance", min=0.0, max=1.0, help="Gate: |retokenized/reported output tokens - 1| at most this."),
    trust_new_host_key: bool = typer.Option(False, "--trust-new-host-key", help="Accept and record an unknown host key (a changed key is always refused)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Stream the client's own output."),
) -> None:
    """Run the throughput sweep with the real sglang.benchmark.serving client on the box.

    Each point is gated (completed, errors, retokenized output, TTFT > 0, input lengths, achieved
    concurrency, cold cache, same server). The sweep becomes one record: one commit and one
    annotated tag (bench/<host>/<ctx>/<UTC stamp>) in the results repository, written only
    after the whole sweep ran.
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
            gates=GateConfig(retok_tolerance=retok_tolerance, min_concurrency_ratio=min_concurrency_ratio,
                             max_cache_hit_pct=max_cache_hit_pct),
        )
        sweep.check_config(cfg)
    except sweep.BenchAbort as exc:
        _fail(exc.exit_code, str(exc))
    if baseline and baseline_ctx is not None:
        _fail(exitcodes.USAGE, "give --baseline or --baseline-ctx, not both")
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
    try:
        with open_session(target, trust_new_host_key=trust_new_host_key, say=progress) as session:
            result = sweep.run_sweep(cfg, host=target, session=session, inventory_path=inventory_path,
                                     progress=progress, argv=sys.argv)
    except KeyboardInterrupt:
        _fail(exitcodes.INTERRUPTED, "interrupted: the sweep was stopped; nothing was recorded")
    except sweep.BenchAbort as exc:
        _fail(exc.exit_code, str(exc))
    except RemoteError as exc:
        _fail(exc.exit_code, f"{exc} (sweep aborted; nothing was recorded)")
    except InventoryError as exc:
        _fail(exitcodes.USAGE, str(exc))

    record = result.record
    try:
        published = results_repo.publish(repo, run_id=result.run_id, tag=result.tag, files=result.files(),
                                         message=f"bench {result.run_id}\n\nhost {target.name}, context length {ctx}, "
                                                 f"concurrency {cfg.concurrency}, {cfg.input_len}/{cfg.output_len} "
                                                 f"tokens, {cfg.repeat} repetition(s); valid: {record['validity_passed']}")
    except KeyboardInterrupt:
        _fail(exitcodes.INTERRUPTED, "interrupted before the record was published; nothing was recorded")
    except results_repo.ResultsRepoError as exc:
        _fail(exitcodes.TOOL_FAILED, f"{exc} (nothing was recorded)")
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
    # version) gives no verdict: a failed check (1), like a regression; it never masks an invalid point.
    code = exitcodes.OK
    if not record["validity_passed"] or (comparison is not None
                                         and (comparison.regressions or not comparison.comparable)):
        code = exitcodes.CHECK_FAILED

    if json_out:
        typer.echo(json.dumps({
            "run_id": result.run_id, "tag": published.tag, "commit": published.commit,
            "results_repo": str(repo), "record_path": f"records/{result.run_id}/record.json",
            "validity_passed": record["validity_passed"], "invalid_points": record["invalid_points"],
            "points": [{"max_concurrency": p["max_concurrency"], "repetition": p["repetition"],
                        "valid": p["validity"]["passed"], "failed_gates": p["validity"]["failed"],
                        "decode_tok_s": p["derived"]["decode_tok_s"]} for p in record["points"]],
            "summary": record["summary"],
            "comparison": comparison.to_dict() if comparison is not None else None,
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
