"""``dsv4kit validate``: the kernel validation table, here (``--local``) or on a box (``--gpu N``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dsv4kit.core import exitcodes
from dsv4kit.core.cli_common import doing, fail, interruptible
from dsv4kit.core.options import (Concurrencies, Ctx, Host, Inventory, JsonOut, Output, ResultsDir, Timeout,
                                   TrustNewHostKey)


_OPTION = {"host": "--host", "installed": "--installed", "trust_new_host_key": "--trust-new-host-key",
           "results_dir": "--results-dir", "wheel": "--wheel", "timeout": "--timeout", "inventory": "--inventory"}


@interruptible("dsv4kit validate")
def validate(
    ctx: typer.Context,
    local: bool = typer.Option(False, "--local", help="Run on this machine: its GPU, or the Triton CPU interpreter when there is none."),
    gpu: Optional[int] = typer.Option(None, "--gpu", min=0, help="Run on this GPU index of the box (CUDA_VISIBLE_DEVICES=N). With --host and no --gpu: the host's dsv4_validate_gpu."),
    host: Host = None,
    inventory: Inventory = None,
    timeout: Timeout = 1800.0,
    cases: Optional[str] = typer.Option(None, "--cases", help="Comma-separated SUITE or SUITE:SPEC items, e.g. 'indexer' or 'indexer:16x32x2048'. Default: every suite's default cases."),
    json_out: JsonOut = False,
    output: Output = None,
    interpret: Optional[bool] = typer.Option(None, "--interpret/--no-interpret", help="Force (or forbid) Triton's CPU interpreter. Default for --local: the interpreter only when no GPU is visible. A remote run never falls back silently."),
    installed: bool = typer.Option(False, "--installed", help="Remote: use the dsv4kit already rolled out into the box's SGLang venv instead of shipping this checkout's wheel."),
    trust_new_host_key: TrustNewHostKey = False,
    results_dir: ResultsDir = None,
    wheel: Optional[Path] = typer.Option(None, "--wheel", help="Remote: ship this prebuilt dsv4kit wheel instead of building one from this checkout."),
    verdict: bool = typer.Option(True, "--verdict/--no-verdict", help="End with the kernel verdict: ours against SGLang's stock default at the decode shapes (--ctx, -c); provision's 'auto' flags follow it."),
    verdict_ctx: Ctx = None,
    concurrency: Concurrencies = None,
) -> None:
    """Run the kernel validation table and exit non-zero on any failed case.

    --local runs here. --gpu N runs on the box over SSH, in its SGLang venv, on GPU N;
    --host H alone runs on H's inventory dsv4_validate_gpu.

    Remote: this checkout's wheel goes to a scratch dir on the box (--installed: the rolled-out one).

    Host keys are checked against known_hosts; reports go to --results-dir. See docs/validation.md.
    """
    if ctx.args:
        fail(exitcodes.USAGE, f"unexpected argument(s) {' '.join(ctx.args)}: --json takes no value (it prints the "
                              f"report on stdout); write the report to a file with --output PATH (-o PATH)")
    _check_values(cases, verdict_ctx)
    if local and gpu is not None:
        fail(exitcodes.USAGE, "give exactly one of --local or --gpu N")
    _refuse_ignored(ctx, local, verdict)
    if not local and gpu is None and host is None:
        fail(exitcodes.USAGE, "give --local, --gpu N, or --host NAME (which runs on that host's "
                              "dsv4_validate_gpu from the inventory)")
    def print_report(report: dict) -> None:
        typer.echo(json.dumps(report, indent=2, sort_keys=True, default=str))

    def to_stderr(line: str) -> None:
        typer.echo(line, err=True)

    if local:
        from dsv4kit.validate.local import run_local

        raise typer.Exit(run_local(cases=cases, output=output, interpret=interpret, verdict=verdict, ctx=verdict_ctx,
                                   concurrency=concurrency, emit=to_stderr if json_out else typer.echo,
                                   on_report=print_report if json_out else None))

    from dsv4kit.validate import remote as remote_validate

    doing("validating on the box", "the remote process group was killed; no report was kept")
    code = remote_validate.run(
        gpu=gpu, host=host, inventory=inventory, timeout=timeout, cases=cases,
        output_path=output, interpret=bool(interpret), installed=installed,
        trust_new_host_key=trust_new_host_key, results_dir=results_dir, wheel=wheel,
        output=remote_validate.Output(out=to_stderr, err=to_stderr) if json_out else None,
        on_report=print_report if json_out else None,
        verdict=verdict, ctx=verdict_ctx, concurrency=concurrency,
    )
    raise typer.Exit(code)


def _check_values(cases: Optional[str], verdict_ctx: Optional[int]) -> None:
    if cases is not None and not cases.replace(",", "").strip():
        fail(exitcodes.USAGE, f"--cases {cases!r} names no case; give SUITE or SUITE:SPEC items (e.g. 'indexer'), "
                              f"or leave --cases out to run every suite's default cases")
    if verdict_ctx is not None and verdict_ctx < 1:
        fail(exitcodes.USAGE, f"--ctx must be a context length of at least 1 token, got {verdict_ctx}")


def _refuse_ignored(ctx: typer.Context, local: bool, verdict: bool) -> None:
    """Exit 2 on an option the run would ignore: a remote-only one with --local, the verdict's
    shapes with --no-verdict."""
    given = {name for name in (*_OPTION, "verdict_ctx", "concurrency") if ctx.get_parameter_source(name).name != "DEFAULT"}
    remote_only = sorted(given & set(_OPTION))
    if local and remote_only:
        them = "them" if len(remote_only) > 1 else "it"
        fail(exitcodes.USAGE, f"{', '.join(_OPTION[n] for n in remote_only)} only apply to a run on the box (--gpu N or "
                              f"--host NAME); --local ignores {them}: leave {them} out")
    if not verdict and given & {"verdict_ctx", "concurrency"}:
        fail(exitcodes.USAGE, "--ctx and -c/--concurrency set the kernel verdict's shapes; --no-verdict skips the "
                              "verdict: give one or the other")
