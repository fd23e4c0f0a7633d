"""``dsv4kit provision``: run playbooks/site.yml against the inventory and summarize per host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from dsv4kit import exitcodes
from dsv4kit.cli_common import check_hosts, doing, interruptible


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
    check: bool = typer.Option(False, "--check", help="Dry run: report what would change, change nothing."),
    diff: bool = typer.Option(False, "--diff", help="Show the differences in changed files."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout (Ansible's output goes to stderr)."),
    results_dir: Path = typer.Option(Path("results/validation"), "--results-dir", help="Where `dsv4kit validate` keeps reports: 'auto' kernel flags follow the host's latest (docs/rollout.md)."),
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
    from dsv4kit.inventory import InventoryError, default_inventory_path, load_inventory
    from dsv4kit.kernel_plan import PlanError, resolve_for_provision
    from dsv4kit.provision import ProvisionError, check_limit, check_tags, check_tools, format_summary, run_playbook
    from dsv4kit.provision_secrets import PlaybookSecrets

    path = inventory if inventory is not None else default_inventory_path()
    echo_progress = (lambda line: typer.echo(line, err=True)) if json_out else typer.echo

    try:
        doing("checking the inventory and the options")
        load_inventory(path)
        check_limit(path, limit)
        check_tags(check_tools(), tags=tags, skip_tags=skip_tags)
        # The same checks as validate and bench: inventory, key files, known_hosts (exit 2 or 3).
        check_hosts(path, limit=limit or [], trust_new_host_key=None)
        doing("resolving 'auto' kernel flags from the hosts' validation reports")
        extra_vars = resolve_for_provision(path, limit=limit, results_dir=results_dir, tags=tags,
                                           skip_tags=skip_tags, say=echo_progress)
        doing("running ansible-playbook", "ansible-playbook was stopped; the box may be partly provisioned "
                                          "(every stage is idempotent: run provision again)")
        secrets = PlaybookSecrets.ask(ask_become_pass=ask_become_pass, ask_vault_pass=ask_vault_pass, vault_ids=vault_id)
        summary = run_playbook(path, limit=limit, tags=tags, skip_tags=skip_tags, check=check, diff=diff,
                               progress=echo_progress, extra_vars=extra_vars, secrets=secrets)
    except PlanError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code)
    except InventoryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exitcodes.USAGE)
    except ProvisionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code)
    table = format_summary(summary)
    if json_out:
        typer.echo(table, err=True)
        typer.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        typer.echo("")
        typer.echo(table)
    raise typer.Exit(summary.exit_code)
