"""``dsv4kit rollout``: the state of the kernel rollout in an SGLang venv.

``dsv4kit rollout status`` reports on this interpreter's environment; with ``--python PATH`` it
runs ``PATH -m dsv4kit.rollout status --json`` (the SGLang venv's interpreter, where the dsv4kit
wheel is installed) under a timeout and renders that; with ``--host NAME`` it asks the box's venv
over SSH, with the serving units' environment (:mod:`dsv4kit.rollout.remote`). The report itself lives in
:mod:`dsv4kit.rollout.status`, which needs only the standard library.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path
from typing import Optional

import typer

from dsv4kit.core import exitcodes
from dsv4kit.core.cli_common import check_hosts, doing, interruptible, json_result
from dsv4kit.core.options import Host, Inventory, JsonOut, ResultsDir, ResultsRepo, Timeout, TrustNewHostKey
from dsv4kit.rollout.status import DEFAULT_DECISION_FILE, render, status_report

app = typer.Typer(help="Kernel rollout into SGLang (plugin, flags, targets): status, plan.",
                  no_args_is_help=True)


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _report_from(python: Path, timeout: float, decision: str = "") -> dict:
    # Absolute (not resolved: a venv's python is a symlink out of the venv), since it runs from "/".
    python = python.absolute()
    if not python.exists():
        _fail(f"--python {python}: no such file", exitcodes.USAGE)
    if python.is_dir() or not os.access(python, os.X_OK):
        _fail(f"--python {python}: not an executable interpreter", exitcodes.USAGE)
    cmd = [str(python), "-m", "dsv4kit.rollout.status", "status", "--json", "--decision", decision]
    doing(f"waiting for {python}'s report (it was stopped)")
    try:
        # cwd "/": "python -m" puts the working directory first on sys.path, and a source
        # checkout there (its *.egg-info) would shadow the venv's installed dsv4kit metadata.
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd="/")
    except subprocess.TimeoutExpired:
        _fail(f"{' '.join(cmd)} did not finish within {timeout:g}s (--timeout)", exitcodes.TIMEOUT)
    except OSError as exc:
        # Not a program this machine can run (a text file, a binary of another architecture) is
        # the user's input (2), as a non-executable file is; a broken venv's interpreter is 5.
        bad_input = exc.errno in (errno.ENOEXEC, errno.EACCES, errno.EISDIR)
        _fail(f"--python {python}: not an executable interpreter ({exc.strerror})" if bad_input
              else f"cannot run {python}: {exc}", exitcodes.USAGE if bad_input else exitcodes.ENVIRONMENT)
    try:
        return json.loads(done.stdout)
    except ValueError:
        pass
    stderr = (done.stderr or "").strip()
    if "No module named dsv4kit" in stderr or "No module named 'dsv4kit" in stderr:
        _fail(f"dsv4kit is not installed for {python}; install the wheel there with "
              "'pip install --no-deps dsv4kit-*.whl'", exitcodes.ENVIRONMENT)
    _fail(f"{' '.join(cmd)} exited {done.returncode} without a report:\n{stderr[-2000:]}",
          exitcodes.TOOL_FAILED)
    raise AssertionError("unreachable")


@app.command("status")
@interruptible("dsv4kit rollout status", "nothing was changed")
def status(
    json_out: JsonOut = False,
    python: Optional[Path] = typer.Option(
        None, "--python", help="Interpreter of the SGLang venv to inspect (e.g. "
        "/opt/dsv4/venv/bin/python); it runs 'python -m dsv4kit.rollout status --json'. "
        "Default: this interpreter.", dir_okay=False),
    host: Host = None,
    inventory: Inventory = None,
    trust_new_host_key: TrustNewHostKey = False,
    timeout: Timeout = 60.0,
    decision: Optional[str] = typer.Option(
        None, "--decision", help="The decision file kernel_rollout wrote ('' for none). Default: "
        f"{DEFAULT_DECISION_FILE}; with --host, the one under the host's dsv4_prefix."),
) -> None:
    """Which SGLang version, whether the dsv4kit plugin is installed, which flags are set, and
    for each target whether it would be replaced or why not.

    Reads SGLang's files (it imports nothing from SGLang); for a flag that is on, a child
    process checks that the dsv4kit kernel modules import (they need torch and triton there).
    Flags are read from the environment of the command: run it with the server's environment.
    With --host NAME the box is asked over SSH (host key checked against known_hosts), its flags
    read from the serving units' environment files.
    Exit codes: 0 consistent (flagged targets replaced, or no flag set), 1 a flag is set but a
    target would stay stock, 2 bad input, 3 host unreachable, 4 timeout, 5 SGLang or dsv4kit
    missing there.
    """
    if python is not None and host is not None:
        _fail("give --python or --host, not both", exitcodes.USAGE)
    if not timeout < float("inf"):
        _fail(f"--timeout must be a finite number of seconds, got {timeout}", exitcodes.USAGE)
    if host is not None:
        from dsv4kit.rollout.remote import environment_line, remote_report

        target = check_hosts(inventory, host=host, trust_new_host_key=trust_new_host_key)[0]
        doing(f"asking {target.name} over SSH", "the remote command was stopped; nothing was changed")
        report = remote_report(target, timeout=timeout, trust_new_host_key=trust_new_host_key,
                               say=lambda line: typer.echo(line, err=True), decision=decision)
        if json_out:
            typer.echo(json.dumps(_enveloped(report), indent=2))
        else:
            typer.echo(environment_line(report, target))
            typer.echo(render(report))
        raise typer.Exit(int(report.get("exit_code", exitcodes.TOOL_FAILED)))
    decision = DEFAULT_DECISION_FILE if decision is None else decision
    report = (_report_from(python, timeout, decision) if python is not None
              else status_report(decision_path=decision or None))
    typer.echo(json.dumps(_enveloped(report), indent=2) if json_out else render(report))
    raise typer.Exit(int(report.get("exit_code", exitcodes.TOOL_FAILED)))


def _enveloped(report: dict) -> dict:
    """The rollout report in the envelope of every --json output; its first problem is the error."""
    code = int(report.get("exit_code", exitcodes.TOOL_FAILED))
    problems = report.get("problems") or []
    return json_result(report, code, "; ".join(problems[:3]) or None)


@app.command("plan")
@interruptible("dsv4kit rollout plan", "nothing was changed")
def plan(
    host: Host = None,
    inventory: Inventory = None,
    from_report: Optional[Path] = typer.Option(None, "--from-report", help="Take the verdict from this validation report instead of the host's latest.", dir_okay=False),
    results_dir: ResultsDir = None,
    results_repo: ResultsRepo = None,
    json_out: JsonOut = False,
) -> None:
    """The kernel flags (and dsv4_fp4_indexer) provisioning would set on the host, and the evidence behind each.

    An 'auto' flag (dsv4_kernel_flags) is on only with both: the kernel verdict of the host's
    newest full validation report (or --from-report) recommends it, and a passing `dsv4kit eval
    --ab FLAG=0,1` record in --results-repo holds for the host as it is (docs/quality.md). Evidence
    that does not hold keeps the flag stock and says why. With --from-report, every kernel flag and
    dsv4_fp4_indexer are planned as 'auto' would plan them. Exit codes: 0 planned, 2 bad input (a
    file that is not a validation report), 3 host unreachable, 5 the host's GPU or driver cannot
    be read.
    """
    from dsv4kit.core.inventory import InventoryError, load_inventory
    from dsv4kit.records.quality_evidence import finder
    from dsv4kit.rollout import fp4_plan, plan as kernel_plan

    try:
        target = load_inventory(inventory).host(host)
        target.check_connectable()
        if from_report is not None:
            # An explicit report decides every kernel flag and the FP4 setting, as 'auto' would.
            target.vars = {**target.vars, fp4_plan.SETTING: kernel_plan.AUTO, "dsv4_kernel_flags": {
                **(target.get("dsv4_kernel_flags") or {}),
                **{flag: kernel_plan.AUTO for flag in kernel_plan.known_flags()}}}
        result = kernel_plan.plan_host(target, results_dir=results_dir, from_report=from_report,
                                       say=lambda line: typer.echo(line, err=True), quality=finder(results_repo))
    except (InventoryError, kernel_plan.PlanError) as exc:
        code = getattr(exc, "exit_code", exitcodes.USAGE)
        if json_out:  # the summary a script reads says it too
            typer.echo(json.dumps(json_result({"host": host}, code, str(exc)), indent=2))
        _fail(str(exc), code)
    if json_out:
        typer.echo(json.dumps(json_result(result, exitcodes.OK), indent=2))
    else:
        typer.echo("\n".join(kernel_plan.render(result)))
    raise typer.Exit(exitcodes.OK)
