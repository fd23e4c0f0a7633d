"""``dsv4kit provision``: run playbooks/site.yml against the inventory and summarize per host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from dsv4kit.core import exitcodes
from dsv4kit.core.cli_common import interruptible, json_result
from dsv4kit.core.exitcodes import Abort


@interruptible("dsv4kit provision", "nothing was run")
def provision(
    inventory: Optional[Path] = typer.Option(
        None, "--inventory", "-i",
        help="Ansible inventory (default: $DSV4KIT_INVENTORY or inventory/hosts.yml).",
    ),
    limit: Optional[List[str]] = typer.Option(None, "--limit", "-l", help="Only these hosts or groups (comma-separated or repeated)."),
    tags: Optional[List[str]] = typer.Option(
        None, "--tags", "-t",
        help="Only these stages: preflight, nvidia_driver, cuda_toolkit, host_tuning, sglang_venv, "
        "model_weights, flash_attn, kernel_rollout, sglang_service. A name that is not a tag of the playbook (or Ansible's "
        "all/always/never/tagged/untagged) is refused (exit 2).",
    ),
    skip_tags: Optional[List[str]] = typer.Option(None, "--skip-tags", help="Skip these stages (e.g. flash_attn; checked like --tags)."),
    check: bool = typer.Option(False, "--check", "-C", help="Dry run: report what would change, change nothing (as ansible-playbook -C)."),
    extra_vars: Optional[List[str]] = typer.Option(
        None, "--extra-vars", "-e",
        help="Variables over the inventory, as ansible-playbook -e takes them: key=value (strings), JSON/YAML, or "
        "@FILE; repeatable. dsv4_* names and types are checked against the schema (exit 2).",
    ),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More of Ansible's output (-vvv: connection debugging), as ansible-playbook -v."),
    diff: bool = typer.Option(False, "--diff", help="Show the differences in changed files."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout (Ansible's output goes to stderr)."),
    results_dir: Optional[Path] = typer.Option(None, "--results-dir", help="Where `dsv4kit validate` keeps reports: 'auto' kernel flags follow the host's latest (docs/rollout.md). Default: $DSV4KIT_RESULTS_DIR, else ~/.local/share/dsv4kit/validation."),
    results_repo: Optional[Path] = typer.Option(None, "--results-repo", help="Where `dsv4kit eval` records: an 'auto' flag also needs a passing eval --ab record of it there (docs/quality.md). Default: results/bench or $DSV4KIT_RESULTS_REPO."),
    ask_become_pass: bool = typer.Option(False, "--ask-become-pass", "-K", help="Ask for the sudo password on the box (as ansible-playbook -K)."),
    ask_vault_pass: bool = typer.Option(False, "--ask-vault-pass", help="Ask for the Ansible Vault password of vaulted inventory values."),
    vault_id: Optional[List[str]] = typer.Option(None, "--vault-id", help="An Ansible Vault identity, as ansible-playbook takes it (label@FILE, label@prompt; repeatable)."),
) -> None:
    """Provision the box(es) in the inventory with Ansible, showing every task as it runs.

    Ends with a per-host table (ok / changed / failed / unreachable). Exit codes: 0 ok, 2 bad
    inventory, key file or option (e.g. an unknown tag), 3 a host was unreachable or its key is not
    in known_hosts (checked before Ansible runs), 5 ansible-playbook missing, 6 a task failed,
    130 interrupted.
    """
    _check_vault_ids(vault_id or [])
    for option, values in (("--tags", tags), ("--skip-tags", skip_tags), ("--limit", limit)):
        _check_not_empty(option, values or [])
    from dsv4kit.core.inventory import default_inventory_path
    from dsv4kit.provision.playbook import format_summary
    from dsv4kit.provision.run import provision as run_provision

    path = inventory if inventory is not None else default_inventory_path()
    summary = run_provision(path, limit=limit, tags=tags, skip_tags=skip_tags, check=check, diff=diff,
                            results_dir=results_dir, results_repo=results_repo, ask_become_pass=ask_become_pass,
                            ask_vault_pass=ask_vault_pass, vault_id=vault_id, extra_vars=extra_vars, verbosity=verbose,
                            say=(lambda line: typer.echo(line, err=True)) if json_out else typer.echo)
    table = format_summary(summary)
    if json_out:
        typer.echo(table, err=True)
        failed = "; ".join(f"{f.host}: {f.task}" for f in summary.failures) if summary.failures else None
        typer.echo(json.dumps(json_result(summary.to_dict(), summary.exit_code, failed and f"failed: {failed}"),
                              indent=2))
    else:
        typer.echo("")
        typer.echo(table)
    raise typer.Exit(summary.exit_code)


def _check_vault_ids(values: List[str]) -> None:
    """Each --vault-id's password file exists (exit 2), before ansible-playbook would fail on it (6)."""
    for value in values:
        source = value.split("@", 1)[1] if "@" in value else value
        if source == "prompt" or not source:
            continue
        path = Path(source).expanduser()
        if not path.is_file():
            raise Abort(exitcodes.USAGE, f"--vault-id {value!r}: the password file {source!r} "
                                         f"{'is not a file' if path.exists() else 'does not exist'} "
                                         f"(give LABEL@FILE or LABEL@prompt)")


def _check_not_empty(option: str, values: List[str]) -> None:
    """An empty value (``--skip-tags ''``, ``--limit a,,b``) would be dropped, and the run would do
    more than asked (every stage, every host): exit 2."""
    for value in values:
        if any(not part.strip() for part in str(value).split(",")):
            raise Abort(exitcodes.USAGE, f"{option} {value!r} has an empty name; give comma-separated names, "
                                         f"or leave {option} out")
