"""SSH reaches a host the way Ansible's ssh connection does: through ``~/.ssh/config`` (Host alias,
HostName, Port, User, IdentityFile, ProxyJump), with the inventory's own ``ansible_port`` and
``ansible_user`` winning, against the real loopback sshd (tests/sshd.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsv4kit.core import exitcodes, ssh
from dsv4kit.core.cli_common import check_hosts
from dsv4kit.core.exitcodes import Abort
from dsv4kit.core.inventory import load_inventory
from tests.remote_inventory import closed_port, write_inventory

ALIAS = "dsv4-box-behind-an-alias"  # resolves nowhere: only ~/.ssh/config knows where it is


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME of the test's own, so ~/.ssh/config is the one the test writes."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home


def ssh_config(home: Path, text: str) -> None:
    (home / ".ssh/config").write_text(text)
    os.chmod(home / ".ssh/config", 0o600)


def entry(name: str, server, **extra) -> str:
    lines = [f"Host {name}", "  HostName 127.0.0.1", f"  Port {server.port}", f"  User {server.user}",
             f"  IdentityFile {server.client_key}", *[f"  {k} {v}" for k, v in extra.items()]]
    return "\n".join(lines) + "\n"


def alias_inventory(tmp_path: Path, server, **overrides) -> Path:
    """A host known only by its alias: no ansible_port, ansible_user or key file in the inventory."""
    values = dict(ansible_host=ALIAS, ansible_port=None, ansible_user=None, ansible_ssh_private_key_file=None,
                  dsv4_known_hosts=str(server.known_hosts))
    values.update(overrides)
    return write_inventory(tmp_path / "inv", server, **values)


def logins(server) -> int:
    return server.log.read_text().count("Accepted publickey")


def test_a_host_alias_in_ssh_config_is_followed(tmp_path, loopback_ssh, home):
    ssh_config(home, entry(ALIAS, loopback_ssh))
    host = load_inventory(alias_inventory(tmp_path, loopback_ssh)).host()
    check_hosts(host.source)  # its host key is found under the HostName and Port the config gives
    with ssh.open_session(host) as session:
        assert session.run("echo reached", timeout=30).stdout.strip() == "reached"
        assert session.target == f"{loopback_ssh.user}@127.0.0.1:{loopback_ssh.port}"


def test_the_inventory_port_wins_over_ssh_config(tmp_path, loopback_ssh, home):
    ssh_config(home, entry(ALIAS, loopback_ssh))
    port = closed_port()
    known = tmp_path / "known_hosts"
    known.write_text(loopback_ssh.host_key_line().replace(f":{loopback_ssh.port} ", f":{port} "))
    host = load_inventory(alias_inventory(tmp_path, loopback_ssh, ansible_port=port,
                                          dsv4_known_hosts=str(known))).host()
    assert ssh.resolve(host).port == port  # as ansible_port is passed to ssh as -o Port=
    with pytest.raises(ssh.Unreachable, match=f"127.0.0.1:{port}"):
        ssh.open_session(host)


def test_proxyjump_goes_through_the_jump_host(tmp_path, loopback_ssh, home):
    ssh_config(home, entry("jump", loopback_ssh) + entry(ALIAS, loopback_ssh, ProxyJump="jump"))
    host = load_inventory(alias_inventory(tmp_path, loopback_ssh)).host()
    assert [hop.alias for hop in ssh.resolve(host).jumps] == ["jump"]
    before = logins(loopback_ssh)
    with ssh.open_session(host) as session:
        assert session.run("echo through", timeout=30).stdout.strip() == "through"
    assert logins(loopback_ssh) - before == 2  # one login on the jump host, one on the box through it


def test_proxyjump_in_ansible_ssh_common_args(tmp_path, loopback_ssh, home):
    ssh_config(home, entry("bastion", loopback_ssh) + entry(ALIAS, loopback_ssh))
    host = load_inventory(alias_inventory(tmp_path, loopback_ssh,
                                          ansible_ssh_common_args="-o StrictHostKeyChecking=yes -o ProxyJump=bastion")).host()
    before = logins(loopback_ssh)
    with ssh.open_session(host) as session:
        session.run("true", timeout=30)
    assert logins(loopback_ssh) - before == 2


def test_an_unknown_jump_host_key_is_refused_before_connecting(tmp_path, loopback_ssh, home):
    ssh_config(home, entry("jump", loopback_ssh, HostKeyAlias="jump-key") + entry(ALIAS, loopback_ssh, ProxyJump="jump"))
    host = load_inventory(alias_inventory(tmp_path, loopback_ssh)).host()
    with pytest.raises(Abort) as info:
        check_hosts(host.source)
    assert info.value.exit_code == exitcodes.UNREACHABLE
    assert "the host key of jump-key (jump host jump of lo) is not in" in str(info.value)


def test_proxycommand_is_used(tmp_path, loopback_ssh, home):
    through = (f"ssh -i {loopback_ssh.client_key} -o UserKnownHostsFile={loopback_ssh.known_hosts} "
               f"-o StrictHostKeyChecking=yes -o BatchMode=yes -p {loopback_ssh.port} "
               f"{loopback_ssh.user}@127.0.0.1 -W %h:%p")
    ssh_config(home, entry(ALIAS, loopback_ssh, ProxyCommand=through))
    host = load_inventory(alias_inventory(tmp_path, loopback_ssh)).host()
    before = logins(loopback_ssh)
    with ssh.open_session(host) as session:
        assert session.run("echo proxied", timeout=30).stdout.strip() == "proxied"
    assert logins(loopback_ssh) - before == 2  # ssh -W logged in once, then dsv4kit through it
