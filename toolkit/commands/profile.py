"""``dsv4kit profile``: where the decode GPU time goes on the live server, by kernel class.

Exit codes: 0 ok; 1 a --max-class-share limit was exceeded; 2 bad input; 3 unreachable; 4 the
load or the traces timed out; 5 the decode server has no profiler endpoint (or SGLang is
missing); 6 the profile or the client failed (a rejected request, a trace over --max-trace-mb);
130 interrupted (the server is asked to stop profiling first).
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from dsv4kit.core.cli_common import check_hosts, check_output, doing, interruptible
from dsv4kit.core.options import (Concurrency, Ctx, DryRun, Host, InputLen, Inventory, JsonOut, MaxClassShare, Output,
                                   OutputLen, Restart, Timeout, TrustNewHostKey)


@interruptible("dsv4kit profile", "the server was asked to stop profiling; nothing was written")
def profile(
    ctx: Ctx,
    concurrency: Concurrency = 16,
    compare_ctx: Optional[int] = typer.Option(None, "--compare-ctx", help="Also profile at this context length (same request lengths) and report the context tax (docs/profiling.md)."),
    num_steps: int = typer.Option(8, "--num-steps", help="Decode steps to profile (1-256)."),
    input_len: InputLen = None,
    output_len: OutputLen = None,
    max_trace_mb: float = typer.Option(256.0, "--max-trace-mb", help="Refuse (and delete) a rank's compressed trace above this size."),
    max_class_share: MaxClassShare = None,
    steady_timeout: float = typer.Option(900.0, "--steady-timeout", min=1.0, help="Seconds to wait for the load to be steady (all requests decoding)."),
    timeout: Timeout = 600.0,
    restart: Restart = True,
    dry_run: DryRun = False,
    host: Host = None,
    inventory: Inventory = None,
    output: Output = None,
    json_out: JsonOut = False,
    trust_new_host_key: TrustNewHostKey = False,
) -> None:
    """Profile a bounded number of decode steps of the live decode server under a steady load
    from the real bench client, and break the decode GPU time down by kernel class (MoE GEMM,
    dense GEMM, NCCL, sparse-MLA attention, indexer, top-k, elementwise/glue, copies, other).
    See docs/profiling.md."""
    from dsv4kit.profile import breakdown, run

    def say(message: str) -> None:
        typer.echo(message, err=True)

    doing("checking the inputs before connecting")
    png = check_output(output) if output is not None else None
    request = run.ProfileRequest(
        ctx=ctx, concurrency=concurrency, compare_ctx=compare_ctx, num_steps=num_steps, input_len=input_len,
        output_len=output_len, max_trace_mb=max_trace_mb, steady_timeout=steady_timeout, timeout=timeout,
        restart=restart, host=host, inventory=inventory, max_class_share=max_class_share or [],
        trust_new_host_key=trust_new_host_key)
    plan = run.plan(request)
    if dry_run:
        from dsv4kit.bench import restart_plan

        typer.echo(restart_plan.output(restart_plan.for_profile(plan), json_out))
        raise typer.Exit(0)
    check_hosts(plan.inventory_path, host=plan.target.name, trust_new_host_key=trust_new_host_key)
    outcome = run.execute(plan, progress=say)
    if png is not None:
        from dsv4kit.profile.plot import stacked_bars

        stacked_bars([(f"ctx {p['context_length']}", p) for p in outcome["profiles"]], png)
        say(f"wrote {png}")
    if json_out:
        typer.echo(json.dumps(outcome, indent=2))
    else:
        for p in outcome["profiles"]:
            typer.echo(breakdown.format_table(p, title=f"decode at context {p['context_length']}, C={p['concurrency']}"))
            typer.echo("")
        if outcome["context_tax"] is not None:
            typer.echo(breakdown.format_comparison(outcome["context_tax"]))
    for breach in outcome["gate"]["breaches"]:
        say(f"gate failed: {breach}")
    raise typer.Exit(outcome["exit_code"])
