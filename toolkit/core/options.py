"""The options several commands share, declared once: a typed alias each, with one short help text
(the long story is in docs/cli.md). A command takes one as ``inventory: Inventory = None``.

Typer reads ``Annotated[type, typer.Option(...)]`` and the parameter's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from dsv4kit.core.paths import RESULTS_DIR_DEFAULT_TEXT, RESULTS_REPO_DEFAULT_TEXT

JSON_HELP = "Print a machine-readable summary as JSON on stdout (progress goes to stderr)."
OUTPUT_HELP = "Write the report (or the chart) to this file, checked for writability before any work."

#: ``--json``: the summary on stdout (docs/cli.md says what each command prints).
JsonOut = Annotated[bool, typer.Option("--json", help=JSON_HELP)]

#: ``--inventory``/``-i``: the Ansible inventory the command reads.
Inventory = Annotated[Optional[Path], typer.Option(
    "--inventory", "-i", help="Inventory file (default: $DSV4KIT_INVENTORY, else inventory/hosts.yml).")]

#: ``--host``: one inventory host.
Host = Annotated[Optional[str], typer.Option("--host", help="Inventory host (default: the only one; monitor: dsv4_monitoring_host).")]

#: ``--trust-new-host-key``: record an unknown host key on first connect.
TrustNewHostKey = Annotated[bool, typer.Option(
    "--trust-new-host-key",
    help="Accept and record an unknown host key (its fingerprint is printed); a changed key is always refused.")]

#: ``--results-repo``: the git repository of bench and eval records.
ResultsRepo = Annotated[Optional[Path], typer.Option(
    "--results-repo", help=f"Results git repository (default: {RESULTS_REPO_DEFAULT_TEXT}).")]

#: ``--results-dir``: where validation reports are kept.
ResultsDir = Annotated[Optional[Path], typer.Option(
    "--results-dir", help=f"Where validation reports are kept (default: {RESULTS_DIR_DEFAULT_TEXT}).")]

#: ``--output``/``-o``: the file a command writes (a report, a chart).
Output = Annotated[Optional[Path], typer.Option("--output", "-o", help=OUTPUT_HELP)]

#: ``--timeout``: how long the command's remote work may take (each command's default differs).
Timeout = Annotated[float, typer.Option(
    "--timeout", min=1.0, help="Seconds the command's remote work may take; past them it is stopped (docs/cli.md).")]

#: ``--ctx``: a context length in tokens.
Ctx = Annotated[Optional[int], typer.Option(
    "--ctx", help="Context length in tokens (what it sets in each command: docs/cli.md).")]

CONCURRENCY_HELP = "Requests in flight at once (bench and validate: a comma-separated list, e.g. 1,16,64)."
#: ``--concurrency``/``-c``: comma-separated concurrencies (bench, validate's verdict).
Concurrencies = Annotated[Optional[str], typer.Option("--concurrency", "-c", help=CONCURRENCY_HELP)]
#: ``--concurrency``/``-c``: one concurrency (profile).
Concurrency = Annotated[int, typer.Option("--concurrency", "-c", help=CONCURRENCY_HELP)]

#: ``--input-len``, ``--output-len``: request lengths of the bench client.
InputLen = Annotated[Optional[int], typer.Option(
    "--input-len", help="Prompt tokens per request (default: what fits the context; docs/cli.md).")]
OutputLen = Annotated[Optional[int], typer.Option(
    "--output-len", help="Generated tokens per request (bench default 512, profile 1024).")]

#: ``--seed``: the seed of the generated requests.
Seed = Annotated[int, typer.Option("--seed", help="Seed of the generated requests (the same seed sends the same ones).")]

#: ``--server-timeout``: the wait for the servers after a restart.
ServerTimeout = Annotated[float, typer.Option(
    "--server-timeout", min=1.0, help="Seconds to wait for the servers after a restart.")]

#: ``--restart/--no-restart``: restart the units when their context length differs.
Restart = Annotated[bool, typer.Option(
    "--restart/--no-restart", help="Restart the serving units when their context length differs (default), or fail.")]

#: ``--ab KEY=A,B``: two arms, a restart through the playbook before each.
AB = Annotated[Optional[str], typer.Option(
    "--ab", metavar="KEY=A,B",
    help="Compare arm B against arm A of KEY: a unit environment variable, a server flag or dsv4_fp4_indexer.")]

#: ``--max-class-share CLASS=PCT%``: the gate on a profile's kernel classes.
MaxClassShare = Annotated[Optional[List[str]], typer.Option(
    "--max-class-share", metavar="CLASS=PCT%",
    help="Gate: exit 1 when CLASS takes more than PCT% of decode kernel time (e.g. indexer=2%); repeatable.")]

#: ``--verbose``/``-v``: more of the driven tool's output (repeatable).
Verbose = Annotated[int, typer.Option(
    "--verbose", "-v", count=True, help="More of the driven tool's output (repeatable: -vvv is Ansible's debugging).")]

#: ``--limit``/``-l``: the inventory hosts or groups a command reaches.
Limit = Annotated[Optional[List[str]], typer.Option(
    "--limit", "-l", metavar="HOSTS", help="Only these hosts or groups (comma-separated or repeated).")]

#: ``--dry-run``: print the plan of a command that restarts the serving units; change nothing.
DryRun = Annotated[bool, typer.Option(
    "--dry-run", help="Print the plan (boxes, units, flags, order) and exit 0; the box is not touched.")]
