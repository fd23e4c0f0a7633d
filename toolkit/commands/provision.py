"""``dsv4kit provision``: run playbooks/site.yml against the inventory and summarize per host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from dsv4kit.core import exitcodes
from dsv4kit.core.cli_common import interruptible, json_result
from dsv4kit.core.exitcodes import Abort
from dsv4kit.core.options import Inventory, JsonOut, Limit, ResultsDir, ResultsRepo, Verbose


@interruptible("dsv4kit provision", "nothing was run")
def provision(
    inventory: Inventory = None,
    limit: Limit = None,
    tags: Optional[List[str]] = typer.Option(
        None, "--tags", "-t",
        help="Only these stages (the playbook's tags, e.g. nvidia_driver, sglang_service: docs/provisioning.md); "
        "an unknown one is exit 2.",
    ),
    skip_tags: Optional[List[str]] = typer.Option(None, "--skip-tags", help="Skip these stages (e.g. flash_attn; checked like --tags)."),
    check: bool = typer.Option(False, "--check", "-C", help="Dry run: report what would change, change nothing (as ansible-playbook -C)."),
    extra_vars: Optional[List[str]] = typer.Option(
        None, "--extra-vars", "-e",
        help="Variables over the inventory, as ansible-playbook -e takes them (key=value, JSON/YAML, @FILE; "
        "repeatable); dsv4_* ones are checked against the schema.",
    ),
    verbose: Verbose = 0,
    diff: bool = typer.Option(False, "--diff", help="Show the differences in changed files."),
    json_out: JsonOut = False,
    results_dir: ResultsDir = None,
    results_repo: ResultsRepo = None,
    ask_become_pass: bool = typer.Option(False, "--ask-become-pass", "-K", help="Ask for the sudo password on the box (as ansible-playbook -K)."),
    ask_vault_pass: bool = typer.Option(False, "--ask-vault-pass", help="Ask for the Ansible Vault password of vaulted inventory values."),
    vault_id: Optional[List[str]] = typer.Option(None, "--vault-id", help="An Ansible Vault identity, as ansible-playbook takes it (label@FILE, label@prompt; repeatable)."),
    list_tasks: bool = typer.Option(False, "--list-tasks", help="Only list the tasks the run would do (ansible-playbook --list-tasks); nothing runs."),
    list_hosts: bool = typer.Option(False, "--list-hosts", help="Only list the hosts the run would reach (ansible-playbook --list-hosts); nothing runs."),
    syntax_check: bool = typer.Option(False, "--syntax-check", help="Only check the playbook's syntax (ansible-playbook --syntax-check); nothing runs."),
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
    modes = [flag for flag, on in (("--list-tasks", list_tasks), ("--list-hosts", list_hosts),
                                   ("--syntax-check", syntax_check)) if on]
    if modes:
        raise typer.Exit(_ansible_only(path, modes, limit=limit, tags=tags, skip_tags=skip_tags,
                                       extra_vars=extra_vars, vault_id=vault_id, json_out=json_out))
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


def _ansible_only(path: Path, modes: List[str], *, limit, tags, skip_tags, extra_vars, vault_id,
                  json_out: bool) -> int:
    """``ansible-playbook MODES`` over the same playbook, inventory and selection as the run, after
    the same checks of the inventory and the options; nothing runs on the box. 0, or 6 (its error)."""
    import os
    import subprocess

    from dsv4kit.core.inventory import InventoryError, load_inventory
    from dsv4kit.core.paths import REPO_ROOT
    from dsv4kit.provision.playbook import (ProvisionError, build_command, check_extra_vars, check_limit,
                                            check_tags, check_tools, default_playbook)

    try:
        load_inventory(path)
        check_limit(path, limit)
        check_tags(check_tools(), tags=tags, skip_tags=skip_tags)
        check_extra_vars(extra_vars)
        command = build_command(path, default_playbook(), limit=limit, tags=tags, skip_tags=skip_tags,
                                vault_ids=vault_id, user_extra_vars=extra_vars) + modes
    except ProvisionError as exc:
        raise Abort(exc.exit_code, str(exc)) from None
    except InventoryError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    env.setdefault("ANSIBLE_CONFIG", str(REPO_ROOT / "ansible.cfg"))
    done = subprocess.run(command, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=600)
    code = exitcodes.OK if done.returncode == 0 else exitcodes.TOOL_FAILED
    if json_out:
        typer.echo(done.stdout + done.stderr, err=True)
        typer.echo(json.dumps(json_result({"mode": modes, "output": done.stdout}, code,
                                          (done.stderr.strip().splitlines() or [""])[-1] or None), indent=2))
    else:
        typer.echo(done.stdout.rstrip("\n"))
        if done.stderr.strip():
            typer.echo(done.stderr.rstrip("\n"), err=True)
    return code
