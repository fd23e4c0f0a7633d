"""``dsv4kit monitor``'s work: the monitoring host's pages and the alerts firing now.

Exit codes of :func:`collect`'s outcome: 0 only the Watchdog fires; 1 another alert fires, or the
Watchdog does not (alerting itself is broken); 3 the box or its Prometheus cannot be reached;
4 a timeout; 6 Prometheus or Alertmanager answered with an error."""

from __future__ import annotations

from typing import Callable, Optional

from dsv4kit.core import exitcodes
from dsv4kit.core.exitcodes import Abort
from dsv4kit.monitor import alerts as api
from dsv4kit.monitor.endpoints import endpoints, monitoring_host_name


def collect(inventory_path, *, host: Optional[str] = None, timeout: float = 15.0, trust_new_host_key: bool = False,
            say: Callable[[str], None] = lambda s: None) -> dict:
    from dsv4kit.core.inventory import InventoryError, load_inventory

    try:
        inv = load_inventory(inventory_path)
        target = inv.host(host) if host else inv.host(monitoring_host_name(inv))
    except (InventoryError, ValueError) as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    where = endpoints(target)
    prom = f"http://127.0.0.1:{where.ports['prometheus']}"
    manager = f"http://127.0.0.1:{where.ports['alertmanager']}"
    say(f"reading the alerts of {target.name}'s Prometheus"
        + (" (over SSH: it listens on the box's loopback)" if not where.open else ""))
    try:
        if where.open:
            prom, manager = f"http://{where.address}:{where.ports['prometheus']}", \
                f"http://{where.address}:{where.ports['alertmanager']}"
            rules = api.get_json(prom + api.PROMETHEUS_PATH, timeout)
            held = api.get_json(manager + api.ALERTMANAGER_PATH, timeout)
        else:
            from dsv4kit.core.ssh import open_session

            with open_session(target, trust_new_host_key=trust_new_host_key) as session:
                rules = api.get_json_over_ssh(session, prom + api.PROMETHEUS_PATH, timeout)
                held = api.get_json_over_ssh(session, manager + api.ALERTMANAGER_PATH, timeout)
        fired = api.firing(rules)
        delivered = api.delivered(held)
    except api.ApiError as exc:
        raise Abort(exitcodes.TOOL_FAILED, str(exc)) from None
    except TimeoutError as exc:
        raise Abort(exitcodes.TIMEOUT, f"{target.name}: no answer within {timeout:g} s ({exc})") from None
    except OSError as exc:
        raise Abort(exitcodes.UNREACHABLE, f"{target.name}: Prometheus or Alertmanager cannot be reached: {exc}") from None
    watchdog = any(a["alertname"] == api.WATCHDOG for a in fired)
    problems = [a for a in fired if a["alertname"] != api.WATCHDOG]
    ok = watchdog and not problems
    return {"ok": ok, "exit_code": exitcodes.OK if ok else exitcodes.CHECK_FAILED, "host": target.name,
            "open": where.open, "urls": where.urls(), "tunnel": where.tunnel_command(),
            "watchdog_firing": watchdog, "firing": problems, "alertmanager_alerts": delivered}


def format_text(outcome: dict) -> str:
    lines = [f"monitoring host: {outcome['host']}"]
    if outcome["tunnel"]:
        lines.append(f"it listens on its loopback; open a tunnel first:\n  {outcome['tunnel']}")
    for name, url in outcome["urls"].items():
        lines.append(f"  {name:<12} {url}")
    if not outcome["watchdog_firing"]:
        lines.append("the Watchdog is not firing: alerting itself is broken (rules not loaded?)")
    if outcome["firing"]:
        lines.append(f"{len(outcome['firing'])} alert(s) firing:")
        for alert in outcome["firing"]:
            lines.append(f"  {alert['alertname']}: {alert['summary']} (since {alert['since']})")
    else:
        lines.append("no alert firing (the Watchdog aside)")
    missing = sorted({a["alertname"] for a in outcome["firing"]} - set(outcome["alertmanager_alerts"]))
    if missing:
        lines.append(f"not yet in Alertmanager: {', '.join(missing)}")
    return "\n".join(lines)
