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
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from dsv4kit.core.cli_common import check_hosts, doing, interruptible
from dsv4kit.core.options import Inventory, TrustNewHostKey

if TYPE_CHECKING:  # imported when the command runs, so that --help stays fast
    from dsv4kit.bench import run as bench_run


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
    inventory: Inventory = None,
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Compare against this record (run id, tag or record.json path); exit 1 on a regression."),
    baseline_ctx: Optional[int] = typer.Option(None, "--baseline-ctx", help="Compare against the newest record of this host at this context length (the context length may differ; nothing else may, so give --input-len/--output-len that fit both). Checked before connecting."),
    results_repo_path: Path = typer.Option(None, "--results-repo", help="Results git repository (created if absent; git and write access are checked before connecting). Default: results/bench or $DSV4KIT_RESULTS_REPO."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout (progress stays on stderr)."),
    point_timeout: float = typer.Option(3600.0, "--point-timeout", min=1.0, help="Seconds one point may run before its remote process group is killed (the sweep then aborts)."),
    server_timeout: float = typer.Option(1800.0, "--server-timeout", min=1.0, help="Seconds to wait for the servers after a restart."),
    metrics_interval: float = typer.Option(0.1, "--metrics-interval", min=0.01, max=10.0, help="Seconds between two scrapes of the servers' /metrics during a point (the exact-occupancy window needs 20 of them; the record keeps them all)."),
    restart: bool = typer.Option(True, "--restart/--no-restart", help="Restart the serving units when their context length differs (default), or fail."),
    min_concurrency_ratio: float = typer.Option(0.8, "--min-concurrency-ratio", min=0.0, max=1.0, help="Gate: achieved/requested concurrency at least this."),
    max_cache_hit_pct: float = typer.Option(1.0, "--max-cache-hit-pct", min=0.0, max=100.0, help="Gate: prefix-cache hit rate at most this (%) on a flushed cache."),
    retok_tolerance: float = typer.Option(0.05, "--retok-tolerance", min=0.0, max=1.0, help="Gate: |retokenized/reported output tokens - 1| at most this."),
    ab: Optional[str] = typer.Option(None, "--ab", metavar="KEY=A,B", help="A/B in one record: KEY is an environment variable of the serving units (e.g. SGLANG_SM120_TRITON_INDEXER=0,1), a server flag (e.g. --attention-backend=triton,dsv4) or the inventory setting dsv4_fp4_indexer (=false,true). Repetitions run interleaved A B A B with a server restart (the playbook) before every arm; the record holds both arms and the verdict of B against A (exit 0 B no worse, 1 B regressed or a point invalid, 7 inconclusive)."),
    restarts: int = typer.Option(0, "--restarts", min=0, help="Restart the serving units (systemctl restart) this many times between repetitions, spread evenly (--repeat minus 1: before every repetition), so that a verdict includes start-to-start variance. Each start's provenance is recorded."),
    idle_timeout: float = typer.Option(120.0, "--idle-timeout", min=0.0, help="Seconds to wait before each point for the servers to run and queue nothing; still busy (another client's load) fails the point (gate idle)."),
    trust_new_host_key: TrustNewHostKey = False,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Stream the client's own output."),
    prefill: bool = typer.Option(False, "--prefill", help="Also measure cold prefill tokens/s at each --prefill-lengths prompt length (one request at a time, the cache flushed before each), from the prefill server's own counters, into the same record."),
    prefill_lengths: Optional[str] = typer.Option(None, "--prefill-lengths", help="With --prefill: comma-separated prompt lengths. Default: 1024, 8192, 32768 and ctx - 1024, those that fit the context."),
    profile: Optional[int] = typer.Option(None, "--profile", metavar="STEPS", min=1, max=256, help="After the points, profile STEPS decode steps at the largest concurrency and keep the breakdown in the record (docs/profiling.md)."),
    api: str = typer.Option("generate", "--api", metavar="generate|chat", help="The route measured: generate (SGLang's native /generate, prompts as token ids; the default) or chat (the OpenAI /v1/chat/completions users call, prompts as text in the model's chat template, named by the served model name). Same client, same gates and headline; the record says which, and records of different APIs are not compared."),
    max_class_share: Optional[List[str]] = typer.Option(None, "--max-class-share", metavar="CLASS=PCT%", help="With --profile: exit 1 when CLASS takes more than PCT% of decode kernel time (e.g. indexer=2%)."),
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
    # The same checks as provision and validate: inventory, key file, known_hosts (exit 2 or 3).
    check_hosts(plan.inventory_path, host=plan.target.name, trust_new_host_key=trust_new_host_key)
    doing("running the sweep")
    outcome = bench_run.execute(plan, progress=_say, argv=sys.argv)
    _print_outcome(plan, outcome, json_out)
    raise typer.Exit(outcome.exit_code)


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
