"""Where a box's monitoring pages are: the monitoring host of the inventory, its ports (the
monitoring role's defaults, or the inventory's values of the same names) and whether they are
reached directly (dsv4_monitoring_open) or through an SSH tunnel to the box's loopback."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

#: The monitoring role's ports (playbooks/roles/monitoring/defaults/main.yml; a test keeps them equal).
DEFAULT_PORTS = {"grafana": 3000, "prometheus": 9090, "alertmanager": 9093}
PORT_VARS = {"grafana": "monitoring_grafana_port", "prometheus": "monitoring_prometheus_port",
             "alertmanager": "monitoring_alertmanager_port"}
BOX_GROUP = "dsv4_boxes"


@dataclass(frozen=True)
class Endpoints:
    host: str           # the inventory host that runs Prometheus
    address: str        # its ansible_host
    ssh_user: str
    ssh_port: int
    open: bool          # listening on every address; else the box's loopback only
    grafana: bool
    ports: dict

    def urls(self) -> dict:
        """The pages as this machine reaches them: the box's address when open, else the local end
        of :meth:`tunnel_command` (the same port numbers on 127.0.0.1)."""
        where = self.address if self.open else "127.0.0.1"
        names = [n for n in ("grafana", "prometheus", "alertmanager") if n != "grafana" or self.grafana]
        urls = {name: f"http://{where}:{self.ports[name]}/" for name in names}
        if "grafana" in urls:
            urls["dashboard"] = f"{urls['grafana']}d/dsv4-pd/"
        return urls

    def tunnel_command(self) -> str | None:
        """The ssh command that forwards the loopback ports here; None when the box is open."""
        if self.open:
            return None
        forwards = " ".join(f"-L {p}:127.0.0.1:{p}" for n, p in sorted(self.ports.items())
                            if n != "grafana" or self.grafana)
        port = f" -p {self.ssh_port}" if self.ssh_port != 22 else ""
        return f"ssh -N{port} {forwards} {shlex.quote(f'{self.ssh_user}@{self.address}')}"


def monitoring_host_name(inventory) -> str:
    """dsv4_monitoring_host, else the first host of the box group (the role's rule), else the only host."""
    hosts = list(inventory.hosts.values())
    named = {str(h.get("dsv4_monitoring_host") or "") for h in hosts} - {""}
    if len(named) > 1:
        raise ValueError(f"{inventory.path}: dsv4_monitoring_host differs between hosts: {', '.join(sorted(named))}")
    if named:
        return inventory.host(named.pop()).name
    boxes = [h.name for h in hosts if BOX_GROUP in h.groups]
    if boxes:
        return boxes[0]
    return inventory.host(None).name


def endpoints(host) -> Endpoints:
    ports = {name: int(host.get(var, DEFAULT_PORTS[name])) for name, var in PORT_VARS.items()}
    return Endpoints(host=host.name, address=host.address, ssh_user=host.user, ssh_port=host.port,
                     open=bool(host.get("dsv4_monitoring_open", False)),
                     grafana=bool(host.get("dsv4_grafana_enabled", True)), ports=ports)
