"""What ``dsv4kit provision`` does: check, resolve 'auto' kernel flags, run the playbook.

``provision`` raises ``Abort`` with the documented exit code (2 bad inventory/options, 3 a host
unreachable or its key unknown, 5 ansible-playbook missing) before Ansible runs; the summary's own
``exit_code`` says how the play ended (6 a task failed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from dsv4kit.core import exitcodes
from dsv4kit.core.cli_common import check_hosts, doing
from dsv4kit.core.exitcodes import Abort


def provision(path: Path, *, limit: Optional[Sequence[str]], tags: Optional[Sequence[str]],
              skip_tags: Optional[Sequence[str]], check: bool, diff: bool, results_dir: Optional[Path],
              ask_become_pass: bool, ask_vault_pass: bool, vault_id: Optional[Sequence[str]],
              say: Callable[[str], None], results_repo: Optional[Path] = None,
              extra_vars: Optional[Sequence[str]] = None, verbosity: int = 0):
    """Run playbooks/site.yml on the inventory at ``path``; the play's ``Summary``.

    ``results_repo``: where the quality records 'auto' needs are; ``extra_vars``: the user's ``-e``
    values, checked before anything runs; ``verbosity``: ``-v`` count.
    """
    from dsv4kit.core.inventory import InventoryError, load_inventory
    from dsv4kit.provision.playbook import (ProvisionError, check_extra_vars, check_limit, check_tags, check_tools,
                                            run_playbook)
    from dsv4kit.provision.secrets import PlaybookSecrets
    from dsv4kit.records.quality_evidence import finder
    from dsv4kit.rollout.plan import PlanError, resolve_for_provision

    try:
        doing("checking the inventory and the options")
        load_inventory(path)
        check_limit(path, limit)
        check_tags(check_tools(), tags=tags, skip_tags=skip_tags)
        check_extra_vars(extra_vars)
        # The same checks as validate and bench: inventory, key files, known_hosts (exit 2 or 3).
        check_hosts(path, limit=limit or [], trust_new_host_key=None)
        doing("resolving 'auto' kernel flags from the hosts' validation reports and quality records")
        unreachable: dict[str, str] = {}
        resolved = resolve_for_provision(path, limit=limit, results_dir=results_dir, tags=tags,
                                         skip_tags=skip_tags, say=say, quality=finder(results_repo),
                                         unreachable=unreachable)
        limit = _leave_out(path, limit, unreachable, say)
        doing("running ansible-playbook", "ansible-playbook was stopped; the box may be partly provisioned "
                                          "(every stage is idempotent: run provision again)")
        secrets = PlaybookSecrets.ask(ask_become_pass=ask_become_pass, ask_vault_pass=ask_vault_pass,
                                      vault_ids=vault_id)
        summary = run_playbook(path, limit=limit, tags=tags, skip_tags=skip_tags, check=check, diff=diff,
                               progress=say, extra_vars=resolved, secrets=secrets, user_extra_vars=extra_vars,
                               verbosity=verbosity)
        return _with_left_out(summary, unreachable)
    except (PlanError, ProvisionError) as exc:
        raise Abort(exc.exit_code, str(exc)) from None
    except InventoryError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None


def _leave_out(path: Path, limit: Optional[Sequence[str]], unreachable: dict, say: Callable[[str], None]):
    """``limit`` without the hosts SSH could not reach while resolving 'auto': the others are provisioned.

    Abort(UNREACHABLE) when no host is left."""
    if not unreachable:
        return limit
    from dsv4kit.core.cli_common import limited_hosts
    from dsv4kit.core.inventory import load_inventory

    targets = [h.name for h in limited_hosts(load_inventory(path), limit or [])]
    left = [name for name in targets if name not in unreachable]
    down = ", ".join(sorted(unreachable))
    for name, why in sorted(unreachable.items()):
        say(f"{name}: unreachable, left out of this run: {why}")
    if not left:
        raise Abort(exitcodes.UNREACHABLE, f"no host can be reached ({down}); nothing was provisioned")
    say(f"provisioning {', '.join(left)} without {down} (as `--limit {','.join(left)}` would); "
        f"once {down} is back: `dsv4kit provision --limit {','.join(sorted(unreachable))}`")
    return [",".join(list(limit or ["all"]) + [f"!{name}" for name in sorted(unreachable)])]


def _with_left_out(summary, unreachable: dict):
    """The play's summary with the hosts left out counted unreachable (the run exits 3)."""
    from dsv4kit.provision.playbook import COUNTERS, Failure

    for name in sorted(unreachable):
        summary.hosts[name] = {**{c: 0 for c in COUNTERS}, "unreachable": 1}
        summary.failures.append(Failure(name, "resolving 'auto' kernel flags (left out of the play)", "UNREACHABLE"))
    return summary
