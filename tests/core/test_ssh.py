"""dsv4kit.core.ssh against the real loopback sshd: host-key policy, credentials, timeouts, transfers."""

from __future__ import annotations

import subprocess
import time

import pytest

from dsv4kit.core import exitcodes

from dsv4kit.core import ssh
from dsv4kit.core.inventory import InventoryError, load_inventory
from tests.remote_inventory import closed_port, keygen, write_inventory


def _host(tmp_path, server, **overrides):
    return load_inventory(write_inventory(tmp_path / "inv", server, **overrides)).host()


@pytest.fixture
def session(tmp_path, loopback_ssh):
    with ssh.open_session(_host(tmp_path, loopback_ssh)) as s:
        yield s


def test_run_streams_lines_and_keeps_exit_code(session):
    lines = []
    result = session.run("echo one; echo two >&2; printf three; exit 0", timeout=20, stream=lines.append)
    # (stderr may start with noise from the login shell's rc files on the box; ours is last)
    assert result.exit_code == 0 and result.stdout == "one\nthree" and result.stderr.endswith("two\n")
    assert [l for l in lines if l in ("one", "two", "three")] in (["one", "two", "three"], ["one", "three", "two"])
    assert session.host_key_fingerprint.startswith("SHA256:")
    failed = session.run("echo oops >&2; exit 7", timeout=20, check=False)
    assert failed.exit_code == 7 and failed.stderr.endswith("oops\n")
    with pytest.raises(ssh.RemoteCommandFailed, match="exited with 7") as info:
        session.run("exit 7", timeout=20)
    assert info.value.exit_code == exitcodes.TOOL_FAILED


def test_env_and_cwd_are_set_and_secrets_never_shown(session, tmp_path):
    result = session.run("echo \"$GREETING\"; pwd", timeout=20, cwd=str(tmp_path),
                         env={"GREETING": "it's a b"})
    assert result.stdout.splitlines() == ["it's a b", str(tmp_path)]
    with pytest.raises(ssh.RemoteCommandFailed) as info:
        session.run("exit 3", timeout=20, env={"HF_TOKEN": "hunter2-value", "API_KEY": "k3y-value"})
    assert "hunter2-value" not in str(info.value) and "k3y-value" not in str(info.value)
    assert "HF_TOKEN='***'" in str(info.value) or "HF_TOKEN=***" in str(info.value)


def test_a_missing_cwd_stops_the_command_with_env_given(session, tmp_path):
    marker = tmp_path / "ran"
    result = session.run(f"touch {marker}", timeout=20, cwd=str(tmp_path / "absent"),
                         env={"A": "first", "B": "second"}, check=False)
    assert result.exit_code != 0 and not marker.exists()


def test_env_values_never_reach_a_command_line(session):
    # Every user of the box can read command lines (ps); the value must reach the command only.
    secret = f"tok-{time.time():.6f}"
    # The command lines are listed before anything puts the value in an argument (grep would).
    script = ("snap=$(mktemp); for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done "
              "> \"$snap\"; grep -c -F \"$SECRET_TOKEN\" \"$snap\"; rm -f \"$snap\"; "
              "echo \"value=$SECRET_TOKEN\"; cat; echo stdin-closed")
    result = session.run(script, timeout=20, env={"SECRET_TOKEN": secret, "OTHER": "x y"}, check=False)
    lines = result.stdout.splitlines()
    assert lines[0] == "0", f"the value is on a command line: {result.stdout}"
    assert lines[1:] == [f"value={secret}", "stdin-closed"]
    with pytest.raises(ValueError, match="SECRET_TOKEN: the value must be one line"):
        session.run("true", timeout=20, env={"SECRET_TOKEN": "two\nlines"})


def test_timeout_kills_the_remote_process_group(session):
    marker = f"{time.time() % 1000:.3f}".replace(".", "")  # a sleep length no one else uses
    started = time.monotonic()
    with pytest.raises(ssh.RemoteTimeout, match="timed out after 1s") as info:
        # A child in the background and one in the foreground: both must go.
        session.run(f"sleep 3{marker} & sleep 4{marker}", timeout=1)
    assert info.value.exit_code == exitcodes.TIMEOUT
    assert time.monotonic() - started < 10
    # The box is this machine: nothing of the command may be left running.
    left = subprocess.run(["pgrep", "-f", f"^sleep [34]{marker}$"], capture_output=True, text=True)
    assert left.stdout == "", f"processes survived the timeout: {left.stdout}"
    # The session is still usable afterwards.
    assert session.run("echo alive", timeout=20).stdout == "alive\n"


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_timeout_must_be_positive_and_finite(session, timeout):
    with pytest.raises(ValueError, match="positive finite"):
        session.run("true", timeout=timeout)


def test_put_and_get_round_trip(session, tmp_path):
    src = tmp_path / "payload.bin"
    src.write_bytes(bytes(range(256)) * 100)
    remote = tmp_path / "remote" / "copy.bin"
    remote.parent.mkdir()
    session.put(src, remote)
    back = tmp_path / "back.bin"
    session.get(remote, back)
    assert back.read_bytes() == src.read_bytes()
    with pytest.raises(ssh.RemoteCommandFailed, match="cannot fetch"):
        session.get(tmp_path / "missing.json", tmp_path / "x.json")


def test_unreachable_closed_port(tmp_path, loopback_ssh):
    host = _host(tmp_path, loopback_ssh, ansible_port=closed_port())
    with pytest.raises(ssh.Unreachable, match="cannot connect.*refused") as info:
        ssh.open_session(host)
    assert info.value.exit_code == exitcodes.UNREACHABLE


def test_bad_credentials(tmp_path, loopback_ssh):
    wrong = keygen(tmp_path / "wrong_key")
    host = _host(tmp_path, loopback_ssh, ansible_ssh_private_key_file=str(wrong))
    with pytest.raises(ssh.AuthenticationFailed, match=f"authentication failed with key file {wrong}") as info:
        ssh.open_session(host)
    assert info.value.exit_code == exitcodes.UNREACHABLE


def test_missing_key_file_is_an_inventory_error(tmp_path, loopback_ssh):
    host = _host(tmp_path, loopback_ssh, ansible_ssh_private_key_file=str(tmp_path / "nope"))
    with pytest.raises(InventoryError, match="does not exist"):
        ssh.open_session(host)


def test_changed_host_key_is_refused_even_with_trust(tmp_path, loopback_ssh):
    other = keygen(tmp_path / "other_host_key")
    known = tmp_path / "known_hosts"
    pub = other.with_suffix(".pub").read_text().split()
    known.write_text(f"[127.0.0.1]:{loopback_ssh.port} {pub[0]} {pub[1]}\n")
    before = known.read_text()
    host = _host(tmp_path, loopback_ssh, dsv4_known_hosts=str(known))
    for trust in (False, True):
        with pytest.raises(ssh.HostKeyMismatch, match="HOST KEY CHANGED.*ssh-keygen -R") as info:
            ssh.open_session(host, trust_new_host_key=trust)
        assert info.value.exit_code == exitcodes.UNREACHABLE
    assert known.read_text() == before  # never rewritten


def test_unknown_host_key_refused_then_trusted_explicitly(tmp_path, loopback_ssh):
    known = tmp_path / "ssh" / "known_hosts"  # does not exist yet
    host = _host(tmp_path, loopback_ssh, dsv4_known_hosts=str(known))
    with pytest.raises(ssh.UnknownHostKey, match="not in .*--trust-new-host-key") as info:
        ssh.open_session(host)
    assert info.value.exit_code == exitcodes.UNREACHABLE
    assert not known.exists()

    notices = []
    with ssh.open_session(host, trust_new_host_key=True, say=notices.append) as s:
        assert s.host_key_trusted_now
        fp = s.host_key_fingerprint
    expected = subprocess.run(["ssh-keygen", "-lf", str(loopback_ssh.host_key.with_suffix(".pub"))],
                              capture_output=True, text=True, check=True).stdout.split()[1]
    assert fp == expected
    assert any(fp in n and str(known) in n for n in notices)
    assert known.read_text().startswith(f"[127.0.0.1]:{loopback_ssh.port} ssh-ed25519 ")
    # OpenSSH itself now accepts the recorded key.
    argv = loopback_ssh.ssh_argv("true")
    argv[argv.index(f"UserKnownHostsFile={loopback_ssh.known_hosts}")] = f"UserKnownHostsFile={known}"
    assert subprocess.run(argv, capture_output=True).returncode == 0
    # And the next connection needs no trust flag and records nothing new.
    with ssh.open_session(host) as s:
        assert not s.host_key_trusted_now
    assert len(known.read_text().splitlines()) == 1


def test_box_side_timeout_ends_the_command_when_the_controller_is_gone(tmp_path, loopback_ssh):
    """If the controlling process dies without killing anything, the box still ends the command."""
    import os
    import signal
    import sys

    inventory = write_inventory(tmp_path / "inv", loopback_ssh)
    sleep = f"7{int(time.time() * 1000) % 100000}.5"
    code = (
        "from dsv4kit.core import ssh\n"
        "from dsv4kit.core.inventory import load_inventory\n"
        f"s = ssh.open_session(load_inventory({str(inventory)!r}).host())\n"
        f"s.run('sleep {sleep}', timeout=1, stream=print)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for _ in range(100):
            if subprocess.run(["pgrep", "-f", f"^sleep {sleep}$"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the remote command never started")
        proc.send_signal(signal.SIGKILL)  # no chance to clean up
        proc.wait(timeout=10)
        # 1 s + the box-side grace: the command is gone without anyone killing it from here.
        deadline = time.monotonic() + 1 + ssh._REMOTE_GRACE_S + 10
        while time.monotonic() < deadline:
            if subprocess.run(["pgrep", "-f", f"^sleep {sleep}$"], capture_output=True).returncode != 0:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the remote command outlived its box-side timeout")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_hashed_known_hosts_entries_verify(tmp_path, loopback_ssh):
    known = tmp_path / "known_hosts"
    known.write_text(loopback_ssh.host_key_line())
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|")  # hashed: the host name is not readable
    with ssh.open_session(_host(tmp_path, loopback_ssh, dsv4_known_hosts=str(known))) as s:
        assert s.run("echo ok", timeout=20).stdout == "ok\n"


def test_a_port_that_accepts_tcp_but_never_speaks_ssh_is_a_named_timeout(tmp_path, loopback_ssh):
    """Something listens (a hung sshd, a firewall's tarpit) but no SSH banner ever comes: exit 3,
    within the connect timeout, saying so (not paramiko's 'No existing session')."""
    import socket
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        host = _host(tmp_path, loopback_ssh, ansible_port=silent.getsockname()[1], dsv4_connect_timeout=2)
        started = time.monotonic()
        with pytest.raises(ssh.RemoteError) as info:
            ssh.open_session(host)
        assert time.monotonic() - started < 8
        assert info.value.exit_code == exitcodes.UNREACHABLE, info.value  # as provision says it
        message = str(info.value)
        assert "accepts TCP connections but no SSH server answered within 2s" in message, message
        assert "No existing session" not in message
    finally:
        silent.close()
