"""``dsv4kit doctor``: is this machine, the inventory and each box ready? One line per check."""

from __future__ import annotations

import json

import typer

from dsv4kit.core.cli_common import doing, interruptible, json_result
from dsv4kit.core.options import Inventory, JsonOut, Limit, Timeout, TrustNewHostKey


@interruptible("dsv4kit doctor", "nothing was changed")
def doctor(
    inventory: Inventory = None,
    limit: Limit = None,
    timeout: Timeout = 30.0,
    json_out: JsonOut = False,
    trust_new_host_key: TrustNewHostKey = False,
) -> None:
    """Check, in order: this machine (python, ansible-core, ssh, dsv4kit), the inventory, then per
    box SSH, sudo without a password, the GPUs (nvidia-smi against dsv4_gpu_count) and the serving
    units (systemctl is-active, /health of the router and both servers). Each line says pass or
    fail and the fix. Nothing is changed. Exit codes: 0 all pass; else the first failed check's: 1 a unit down or
    /health failing, 2 the inventory, 3 SSH, 4 a remote command past --timeout, 5 this machine,
    sudo or the GPUs (docs/cli.md)."""
    from dsv4kit.doctor import checks

    say = (lambda line: typer.echo(line, err=True)) if json_out else typer.echo
    results = []

    def record(check) -> None:
        results.append(check)
        say(check.line())

    doing("checking this machine")
    for check in checks.control_machine():
        record(check)
    found, hosts = checks.inventory(inventory, limit)
    record(found)
    for host in hosts:
        doing(f"checking {host.name}")
        for check in checks.box(host, timeout=timeout, trust_new_host_key=trust_new_host_key,
                                say=lambda line: typer.echo(line, err=True)):
            record(check)
    code = checks.exit_code(results)
    failed = [c for c in results if not c.ok]
    if json_out:
        typer.echo(json.dumps(json_result({"checks": [c.to_dict() for c in results]}, code,
                                          failed and f"{failed[0].name}: {failed[0].detail}"), indent=2))
    else:
        say(f"\n{len(results) - len(failed)} of {len(results)} checks passed")
    raise typer.Exit(code)
