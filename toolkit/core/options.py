"""The options several commands share, declared once: a typed alias each, with one short help text
(the long story is in docs/cli.md). A command takes one as ``inventory: Inventory = None``.

Typer reads ``Annotated[type, typer.Option(...)]`` and the parameter's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4kit.core.paths import RESULTS_DIR_DEFAULT_TEXT, RESULTS_REPO_DEFAULT_TEXT

JSON_HELP = "Print a machine-readable summary as JSON on stdout (progress goes to stderr)."
OUTPUT_HELP = "Write the report to this file (checked for writability before any work)."

#: ``--json``: the summary on stdout (docs/cli.md says what each command prints).
JsonOut = Annotated[bool, typer.Option("--json", help=JSON_HELP)]

#: ``--inventory``/``-i``: the Ansible inventory the command reads.
Inventory = Annotated[Optional[Path], typer.Option(
    "--inventory", "-i", help="Inventory file (default: $DSV4KIT_INVENTORY, else inventory/hosts.yml).")]

#: ``--host``: one inventory host.
Host = Annotated[Optional[str], typer.Option("--host", help="Inventory host (default: the only host).")]

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
