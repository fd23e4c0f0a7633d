"""The doctor's checks, in the order a bring-up needs them: the control machine, the inventory,
then per box SSH, sudo without a password, the GPUs and the serving units (with their
/health). Each gives a :class:`Check`: pass or fail, what was seen, the fix, and the exit code a
failure means (core/exitcodes.py). A box whose SSH fails gets no further checks.

The remote checks go through ``core.ssh`` (host keys checked against known_hosts, every command
under a timeout), and /health of the router and both servers through the bench's box-side
readiness wait.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Optional

from dsv4kit.core import exitcodes

MIN_PYTHON = (3, 10)
MIN_ANSIBLE_CORE = (2, 19)  # pyproject.toml's pin


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    exit_code: int = exitcodes.OK
    host: Optional[str] = None

    def line(self) -> str:
        where = f" [{self.host}]" if self.host else ""
        text = f"{'PASS' if self.ok else 'FAIL'}  {self.name}{where}: {self.detail}"
        return text if self.ok else f"{text}\n      fix: {self.fix}"

    def to_dict(self) -> dict:
        return asdict(self)


def _passed(name: str, detail: str, host: Optional[str] = None) -> Check:
    return Check(name, True, detail, host=host)


def _failed(name: str, detail: str, fix: str, code: int, host: Optional[str] = None) -> Check:
    return Check(name, False, detail, fix, code, host)


# --------------------------------------------------------------------------- the control machine
def control_machine() -> list[Check]:
    from importlib import metadata

    checks = []
    version = ".".join(map(str, sys.version_info[:3]))
    checks.append(_passed("python", f"{version} at {sys.executable}") if sys.version_info[:2] >= MIN_PYTHON else
                  _failed("python", f"{version} is older than {'.'.join(map(str, MIN_PYTHON))}",
                          "install Python 3.10 or newer and reinstall dsv4kit in a venv made with it",
                          exitcodes.ENVIRONMENT))
    try:
        ansible = metadata.version("ansible-core")
        numbers = tuple(int(p) for p in ansible.split(".")[:2] if p.isdigit())
        checks.append(_passed("ansible-core", ansible) if numbers >= MIN_ANSIBLE_CORE else
                      _failed("ansible-core", f"{ansible} is older than {'.'.join(map(str, MIN_ANSIBLE_CORE))}",
                              "pip install -U 'ansible-core>=2.19' in this venv", exitcodes.ENVIRONMENT))
    except metadata.PackageNotFoundError:
        checks.append(_failed("ansible-core", "not installed", "pip install -e . (it brings ansible-core)",
                              exitcodes.ENVIRONMENT))
    ssh = shutil.which("ssh")
    checks.append(_passed("ssh client", ssh) if ssh else
                  _failed("ssh client", "no ssh on PATH (ansible-playbook needs it)",
                          "apt-get install openssh-client", exitcodes.ENVIRONMENT))
    try:
        import dsv4kit

        checks.append(_passed("dsv4kit", f"{metadata.version('dsv4kit')} from {dsv4kit.__file__}"))
    except metadata.PackageNotFoundError:
        checks.append(_failed("dsv4kit", "imported but not installed (no package metadata)",
                              "pip install -e . in the checkout", exitcodes.ENVIRONMENT))
    return checks


# --------------------------------------------------------------------------- the inventory
def inventory(path, limit: Optional[list]) -> tuple[Check, list]:
    """The inventory check and the hosts to check next (--limit: host or group names)."""
    from dsv4kit.core.cli_common import limited_hosts
    from dsv4kit.core.inventory import InventoryError, load_inventory

    try:
        inv = load_inventory(path)
    except InventoryError as exc:
        return _failed("inventory", str(exc), "fix the file named above (its variables: docs/provisioning.md)",
                       exitcodes.USAGE), []
    hosts = limited_hosts(inv, limit) if limit else list(inv.hosts.values())
    if not hosts:
        return _failed("inventory", f"--limit {','.join(limit)} matches no host or group",
                       "give host or group names of the inventory", exitcodes.USAGE), []
    return _passed("inventory", f"{len(inv.hosts)} host(s), the schema holds; checking "
                                f"{', '.join(h.name for h in hosts)}"), hosts


# --------------------------------------------------------------------------- one box
def box(host, *, timeout: float, trust_new_host_key: bool, say: Callable[[str], None]) -> Iterator[Check]:
    """SSH, sudo, GPUs, units and their /health on one box, in that order."""
    from dsv4kit.core.exitcodes import Abort
    from dsv4kit.core.ssh import RemoteError, open_session

    name = host.name
    try:
        session = open_session(host, trust_new_host_key=trust_new_host_key, say=say)
    except (RemoteError, Abort, ValueError) as exc:
        code = getattr(exc, "exit_code", exitcodes.UNREACHABLE)
        yield _failed("ssh", str(exc), _ssh_fix(host), code, name)
        return
    with session:
        step = "ssh"
        try:
            login = session.run("id -un", timeout=timeout, check=False).stdout.strip() or "?"
            yield _passed("ssh", f"logged in as {login} at {session.endpoint.describe()}", name)
            step = "sudo"
            yield _sudo(session, login, timeout, name)
            step = "gpus"
            yield _gpus(session, host, timeout, name)
            step = "units"
            yield from _units(session, host, timeout, name, say)
        except RemoteError as exc:  # a command past --timeout, a connection lost
            yield _failed(step, str(exc), "see the box's state (a hung command, a lost connection); raise "
                          "--timeout if it is only slow", exc.exit_code, name)


def _ssh_fix(host) -> str:
    user = host.get("ansible_user") or "<user>"
    address = host.get("ansible_host") or host.name
    port = host.get("ansible_port") or 22
    return (f"check that `ssh -p {port} {user}@{address} true` works from here (address, port, key file "
            f"ansible_ssh_private_key_file, known_hosts dsv4_known_hosts)")


def _sudo(session, login: str, timeout: float, name: str) -> Check:
    done = session.run("sudo -n true", timeout=timeout, check=False)
    if done.exit_code == 0:
        return _passed("sudo", f"{login} may use sudo without a password", name)
    said = (done.stderr or done.stdout).strip().splitlines()
    return _failed("sudo", f"`sudo -n true` failed (exit {done.exit_code}): {said[-1] if said else 'no message'}",
                   f"let {login} use sudo without a password (a NOPASSWD line in /etc/sudoers.d), or run "
                   f"`dsv4kit provision -K`, which asks for it", exitcodes.ENVIRONMENT, name)


def _gpus(session, host, timeout: float, name: str) -> Check:
    expected = host.get("dsv4_gpu_count")
    done = session.run("nvidia-smi -L", timeout=timeout, check=False)
    if done.exit_code != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return _failed("gpus", f"`nvidia-smi -L` failed (exit {done.exit_code}): {said[-1] if said else 'no message'}",
                       "install the driver: `dsv4kit provision --tags nvidia_driver` (then reboot if it asks)",
                       exitcodes.ENVIRONMENT, name)
    seen = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    if expected is not None and len(seen) != int(expected):
        return _failed("gpus", f"nvidia-smi lists {len(seen)} GPU(s), the inventory expects {expected} "
                               f"(dsv4_gpu_count)",
                       "check the missing GPU (`nvidia-smi -L`, `lspci | grep -i nvidia`, dmesg for Xid or "
                       "fallen-off-the-bus), or correct dsv4_gpu_count", exitcodes.ENVIRONMENT, name)
    return _passed("gpus", f"{len(seen)} GPU(s), as the inventory expects", name)


def _units(session, host, timeout: float, name: str, say) -> Iterator[Check]:
    from dsv4kit.bench.restart_plan import serving_units

    units = serving_units()
    done = session.run("systemctl is-active " + " ".join(shlex.quote(u) for u in units),
                       timeout=timeout, check=False)
    states = done.stdout.split()
    if len(states) != len(units):
        said = (done.stderr or done.stdout).strip().splitlines()
        yield _failed("units", f"`systemctl is-active` gave no state per unit: {said[-1] if said else 'no output'}",
                      "is systemd running on the box? `systemctl status`", exitcodes.ENVIRONMENT, name)
        return
    down = [f"{u} is {s}" for u, s in zip(units, states) if s != "active"]
    if down:
        first = next(u for u, s in zip(units, states) if s != "active")
        yield _failed("units", "; ".join(down),
                      f"see `journalctl -u {first} -n 50` on the box, then `sudo systemctl restart {first}` or "
                      f"`dsv4kit provision --tags sglang_service`", exitcodes.CHECK_FAILED, name)
        return
    yield _passed("units", f"{', '.join(units)} active", name)
    yield _health(session, host, timeout, name, say)


#: The serving ports the health check asks, and the unit that answers on each.
_PORTS = (("dsv4_router_port", "dsv4-router.service"), ("dsv4_prefill_port", "dsv4-prefill.service"),
          ("dsv4_decode_port", "dsv4-decode.service"))


def _health(session, host, timeout: float, name: str, say) -> Check:
    """GET /health on the router, prefill and decode ports (the router's alone is 200 even with no
    worker), through the bench's box-side readiness wait."""
    from dsv4kit.bench.config import BenchAbort
    from dsv4kit.serving.remote import Remote

    ports = {int(host.get(var)): unit for var, unit in _PORTS if host.get(var)}
    where = ", ".join(f"127.0.0.1:{port} ({unit})" for port, unit in ports.items())
    remote = Remote(session, host, say)
    try:
        remote.setup()
    except BenchAbort as exc:  # no venv python to run the readiness wait with
        remote.cleanup()
        return _failed("health", str(exc), "run `dsv4kit provision` (the sglang_venv stage)", exc.exit_code, name)
    try:
        remote.wait_health(sorted(ports), timeout, None)
    except BenchAbort as exc:
        return _failed("health", str(exc), f"see `journalctl -u UNIT -n 50` on the box for the port(s) named "
                                           f"above; they are {where}", exitcodes.CHECK_FAILED, name)
    finally:
        remote.cleanup()
    return _passed("health", f"/health is 200 on {where}", name)


def exit_code(checks: list[Check]) -> int:
    """The first failed check's code (checks run in the order a bring-up needs them); 0 if none failed."""
    return next((c.exit_code for c in checks if not c.ok), exitcodes.OK)
