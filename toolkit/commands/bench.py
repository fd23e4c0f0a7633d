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
import sys
from typing import TYPE_CHECKING, List, Optional

import typer

from dsv4kit.core.cli_common import check_hosts, doing, interruptible
from dsv4kit.core.options import (AB, Concurrencies, Ctx, DryRun, Host, InputLen, Inventory, JsonOut, MaxClassShare,
                                   OutputLen, ResultsRepo, Restart, Seed, ServerTimeout, TrustNewHostKey, Verbose)

if TYPE_CHECKING:  # imported when the command runs, so that --help stays fast
    from dsv4kit.bench import run as bench_run


@interruptible("dsv4kit bench", "nothing was run or recorded")
def bench(
    invocation: typer.Context,
    ctx: Ctx,
    concurrency: Concurrencies = "1,16,64",
    input_len: InputLen = None,
    output_len: OutputLen = None,
    repeat: int = typer.Option(3, "--repeat", min=1, help="Repetitions of every point (>= 2 gives intervals; a comparison verdict needs >= 3 valid ones a side)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="Requests per point (default max(32, 10*C), or max(8, 2*C) from input-len 32768; at least --min-concurrency-ratio x C)."),
    warmup_requests: Optional[int] = typer.Option(None, "--warmup-requests", min=0, help="Warm-up requests per point (default max(C, 8))."),
    seed: Seed = 42,
    host: Host = None,
    inventory: Inventory = None,
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Compare against this record (run id, tag or record.json path); exit 1 on a regression."),
    baseline_ctx: Optional[int] = typer.Option(None, "--baseline-ctx", help="Compare against this host's newest record at this context length (only the context may differ: docs/benchmarking.md)."),
    results_repo_path: ResultsRepo = None,
    json_out: JsonOut = False,
    point_timeout: float = typer.Option(3600.0, "--point-timeout", min=1.0, help="Seconds one point may run before its remote process group is killed (the sweep then aborts)."),
    server_timeout: ServerTimeout = 1800.0,
    metrics_interval: float = typer.Option(0.1, "--metrics-interval", min=0.01, max=10.0, help="Seconds between two scrapes of the servers' /metrics during a point (the exact-occupancy window needs 20 of them; the record keeps them all)."),
    restart: Restart = True,
    min_concurrency_ratio: float = typer.Option(0.8, "--min-concurrency-ratio", min=0.0, max=1.0, help="Gate: achieved/requested concurrency at least this."),
    max_cache_hit_pct: float = typer.Option(1.0, "--max-cache-hit-pct", min=0.0, max=100.0, help="Gate: prefix-cache hit rate at most this (%) on a flushed cache."),
    retok_tolerance: float = typer.Option(0.05, "--retok-tolerance", min=0.0, max=1.0, help="Gate: |retokenized/reported output tokens - 1| at most this."),
    ab: AB = None,
    dry_run: DryRun = False,
    restarts: int = typer.Option(0, "--restarts", min=0, help="Restart the units (systemctl restart) this many times between repetitions, spread evenly, so a verdict holds start-to-start variance."),
    idle_timeout: float = typer.Option(120.0, "--idle-timeout", min=0.0, help="Seconds to wait before each point for the servers to run and queue nothing; still busy (another client's load) fails the point (gate idle)."),
    trust_new_host_key: TrustNewHostKey = False,
    verbose: Verbose = 0,
    prefill: bool = typer.Option(False, "--prefill", help="Also measure cold prefill tokens/s at each --prefill-lengths prompt length, into the same record (docs/benchmarking.md)."),
    prefill_lengths: Optional[str] = typer.Option(None, "--prefill-lengths", help="With --prefill: comma-separated prompt lengths. Default: 1024, 8192, 32768 and ctx - 1024, those that fit the context."),
    profile: Optional[int] = typer.Option(None, "--profile", metavar="STEPS", min=1, max=256, help="After the points, profile STEPS decode steps at the largest concurrency and keep the breakdown in the record (docs/profiling.md)."),
    api: str = typer.Option("generate", "--api", metavar="generate|chat", help="The route measured: generate (SGLang's /generate, the default) or chat (the OpenAI /v1/chat/completions; docs/cli.md)."),
    max_class_share: MaxClassShare = None,
) -> None:
    """Run the throughput sweep with the real sglang.benchmark.serving client on the box.

    The headline is the decode server's own generated tokens per second, taken only while it ran
    exactly C requests, queued none and prefilled nothing (its /metrics). Each point is gated
    (completed, errors, retokenized output, TTFT > 0, input lengths, achieved concurrency, exact
    occupancy, the served model, max_running_requests, KV capacity, cold cache, same server); a
    gate without its evidence fails. The sweep becomes one record:
    one commit and one annotated tag (bench/<host>/<ctx>/<UTC stamp>) in the results repository.
    Finished points are spilled locally at once; a sweep that fails after some points publishes
    them as an incomplete record.

    Exit codes: 0 ok; 1 an invalid point or a regression; 2 bad input; 3 unreachable; 4 timeout; 5
    something missing; 6 the client, ansible or git failed; 7 inconclusive; 130 interrupted.
    """
    from dsv4kit.bench import run as bench_run

    doing("checking the inputs before connecting")
    request = _request(invocation, locals())
    plan = bench_run.plan(request, warn=_say)
    if dry_run:
        _dry_run(plan, json_out)
    # The same checks as provision and validate: inventory, key file, known_hosts (exit 2 or 3).
    check_hosts(plan.inventory_path, host=plan.target.name, trust_new_host_key=trust_new_host_key)
    doing("running the sweep")
    outcome = bench_run.execute(plan, progress=_say, argv=sys.argv)
    _print_outcome(plan, outcome, json_out)
    raise typer.Exit(outcome.exit_code)


def _dry_run(plan: bench_run.BenchPlan, json_out: bool) -> None:
    from dsv4kit.bench import restart_plan

    typer.echo(restart_plan.output(restart_plan.for_bench(plan), json_out))
    raise typer.Exit(0)


def _profile_hook(steps: Optional[int], max_class_share: Optional[List[str]]):
    """``--profile STEPS``: the hook the sweep runs after its points (None without it)."""
    from dsv4kit.core import exitcodes
    from dsv4kit.core.exitcodes import Abort

    if steps is None:
        if max_class_share:
            raise Abort(exitcodes.USAGE, "--max-class-share needs --profile STEPS (it gates the record's profile)")
        return None
    from dsv4kit.profile.run import bench_hook

    return bench_hook(steps, max_class_share or [])


def _say(message: str) -> None:
    typer.echo(message, err=True)


def _request(invocation: typer.Context, options: dict) -> bench_run.BenchRequest:
    """The request from the command's parameters: the same names, but for the three derived here."""
    import dataclasses

    from dsv4kit.bench import run as bench_run

    names = {f.name for f in dataclasses.fields(bench_run.BenchRequest)}
    given = {k: v for k, v in options.items() if k in names}
    given["verbose"] = bool(options["verbose"])
    return bench_run.BenchRequest(
        **given, results_repo=options["results_repo_path"],
        ratio_given=invocation.get_parameter_source("min_concurrency_ratio").name != "DEFAULT",
        profile_hook=_profile_hook(options["profile"], options["max_class_share"]))


def _print_outcome(plan: bench_run.BenchPlan, outcome: bench_run.BenchOutcome, json_out: bool) -> None:
    from dsv4kit.bench import run as bench_run
    from dsv4kit.bench.sweep import format_summary
    from dsv4kit.records.compare import format_comparison

    record = outcome.result.record
    if json_out:
        typer.echo(json.dumps(bench_run.summary(plan, outcome), indent=2))
        return
    typer.echo(format_summary(record))
    typer.echo(bench_run.recorded_line(outcome.result, outcome.published, plan.repo))
    if not record["validity_passed"]:
        typer.echo(f"{record['invalid_points']} point(s) INVALID (see the gates above); they are marked "
                   f"invalid in the record and left out of the summary")
    if outcome.comparison is not None:
        typer.echo("")
        typer.echo(format_comparison(outcome.comparison))
    if plan.request.baseline_ctx is not None:
        typer.echo(bench_run.format_retention(plan.baseline, record))
    if record.get("profile") is not None:
        from dsv4kit.profile.breakdown import record_report

        text, breaches = record_report(record, [])
        typer.echo("\n" + text)
        for breach in (record["profile"].get("gate") or {}).get("breaches") or []:
            typer.echo(f"gate failed: {breach}")
