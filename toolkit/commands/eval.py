"""``dsv4kit eval``: prove the served model still answers right (docs/quality.md).

Exit codes: 0 every check passed; 1 a check failed (the record is still published, marked); 2 bad
input (arguments, inventory, tasks file line, a context above the served one); 3 box unreachable;
4 a restart or a check timed out; 5 something missing (no serving stack, no logprobs from the
server, another model served, the tasks download offline); 6 a driven tool failed (ansible, git,
the box-side script); 7 inconclusive (never a pass); 130 interrupted (nothing recorded).
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from dsv4kit.core.cli_common import check_hosts, doing, interruptible
from dsv4kit.core.options import (AB, Ctx, DryRun, Host, Inventory, JsonOut, ResultsRepo, Seed, ServerTimeout,
                                   TrustNewHostKey)


@interruptible("dsv4kit eval", "nothing was recorded")
def eval_cmd(
    ctx: Ctx = None,
    quick: bool = typer.Option(False, "--quick", help="A smoke test (about 2 minutes on the box): fewer logprob prompts, needles at 2 context lengths, 50 task items. Its record never turns an 'auto' flag on."),
    tasks: str = typer.Option("gsm8k", "--tasks", metavar="gsm8k|PATH|none", help="Task items in GSM8K's JSONL format: gsm8k (downloaded on the box, sha256 checked), a local PATH, or none (docs/quality.md)."),
    questions: Optional[int] = typer.Option(None, "--questions", help="Task items asked (default 200, --quick 50; 5 more are the few-shot examples)."),
    seed: Seed = 42,
    ab: AB = None,
    dry_run: DryRun = False,
    host: Host = None,
    inventory: Inventory = None,
    results_repo: ResultsRepo = None,
    json_out: JsonOut = False,
    server_timeout: ServerTimeout = 1800.0,
    arm_timeout: float = typer.Option(3600.0, "--arm-timeout", min=1.0, help="Seconds one arm's checks may run on the box."),
    trust_new_host_key: TrustNewHostKey = False,
) -> None:
    """Ask the served model through the router (as users reach it) and judge its answers:
    decode against re-prefill logprobs (KL), arm against arm (top-k agreement), pass keys hidden
    at several depths up to the served context, and paired few-shot task accuracy (McNemar). Each
    check passes, fails or is inconclusive against the thresholds in docs/quality.md; the worst
    decides. One eval record goes into the results repository, with a needle heatmap per arm.

    Exit codes: 0 pass; 1 a check failed; 2 bad input; 3 unreachable; 4 timeout; 5 something
    missing; 6 a driven tool failed; 7 inconclusive; 130 interrupted.
    """
    from dsv4kit.quality import run

    def say(message: str) -> None:
        typer.echo(message, err=True)

    doing("checking the inputs before connecting")
    request = run.EvalRequest(ctx=ctx, quick=quick, tasks=tasks, questions=questions, seed=seed, ab=ab, host=host,
                              inventory=inventory, results_repo=results_repo, server_timeout=server_timeout,
                              arm_timeout=arm_timeout, trust_new_host_key=trust_new_host_key)
    plan = run.plan(request, warn=say)
    if dry_run:
        from dsv4kit.bench import restart_plan

        typer.echo(restart_plan.output(restart_plan.for_eval(plan), json_out))
        raise typer.Exit(0)
    check_hosts(plan.inventory_path, host=plan.target.name, trust_new_host_key=trust_new_host_key)
    doing("asking the served model", "nothing was recorded")
    outcome = run.execute(plan, progress=say, argv=sys.argv)
    if json_out:
        typer.echo(json.dumps(run.summary(plan, outcome), indent=2))
    else:
        from dsv4kit.records.eval_record import format_record

        typer.echo(format_record(outcome.record))
        typer.echo(f"recorded {outcome.record['run_id']}: commit {outcome.published.commit[:12]}, tag "
                   f"{outcome.record['tag']} in {plan.repo}")
    raise typer.Exit(outcome.exit_code)
