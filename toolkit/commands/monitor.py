"""``dsv4kit monitor``: the box's dashboard and Prometheus pages, and the alerts firing now.

Exit codes: 0 only the Watchdog fires; 1 another alert fires, or the Watchdog does not; 2 bad
input; 3 the box or its Prometheus is unreachable; 4 timeout; 6 Prometheus or Alertmanager
answered with an error; 130 interrupted.
"""

from __future__ import annotations

import json

import typer

from dsv4kit.core.cli_common import check_hosts, doing, interruptible
from dsv4kit.core.options import Host, Inventory, JsonOut, Timeout, TrustNewHostKey


@interruptible("dsv4kit monitor")
def monitor(
    host: Host = None,
    timeout: Timeout = 15.0,
    inventory: Inventory = None,
    json_out: JsonOut = False,
    trust_new_host_key: TrustNewHostKey = False,
) -> None:
    """Print the Grafana dashboard, Prometheus and Alertmanager URLs (with the SSH tunnel to open
    when the box keeps them on its loopback) and the alerts firing now. See docs/monitoring.md."""
    from dsv4kit.core import exitcodes
    from dsv4kit.core.exitcodes import Abort
    from dsv4kit.monitor import status

    if not 0 < timeout <= 600:
        raise Abort(exitcodes.USAGE, f"--timeout must be between 0 and 600 seconds, got {timeout:g}")
    doing("reading the inventory")
    from dsv4kit.core.inventory import InventoryError, load_inventory
    from dsv4kit.monitor.endpoints import monitoring_host_name

    try:
        inv = load_inventory(inventory)
        name = host or monitoring_host_name(inv)
        opened = bool(inv.host(name).get("dsv4_monitoring_open", False))
    except (InventoryError, ValueError) as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    if not opened:  # read over SSH: the same checks as every command that reaches a box
        check_hosts(inventory, host=name, trust_new_host_key=trust_new_host_key)
    doing("reading the alerts")
    outcome = status.collect(inventory, host=name, timeout=timeout, trust_new_host_key=trust_new_host_key,
                             say=lambda m: typer.echo(m, err=True))
    typer.echo(json.dumps(outcome, indent=2) if json_out else status.format_text(outcome))
    raise typer.Exit(outcome["exit_code"])
