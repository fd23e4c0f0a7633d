"""SSH to an inventory host: verified host keys, commands with hard timeouts, file transfer.

Fabric (over paramiko) underneath. Where to connect is resolved as Ansible's ssh connection
(OpenSSH) resolves it (:func:`resolve`): ``ansible_host`` (else the inventory name) is looked up in
``~/.ssh/config``, whose ``HostName``, ``Port``, ``User``, ``IdentityFile``, ``IdentitiesOnly``,
``HostKeyAlias``, ``ProxyJump`` and ``ProxyCommand`` apply; ``ansible_port`` and ``ansible_user``,
when set, win, and a ``-o ProxyJump=``/``-J`` in ``ansible_ssh_common_args`` or
``ansible_ssh_extra_args`` wins over the file. docs/provisioning.md lists what is not honoured.
Host keys (of the box and of every jump host) are checked against ``Host.known_hosts`` and never
accepted silently. An unknown key is refused unless the caller opts in with
``trust_new_host_key`` (the key is then appended to that known_hosts file and its SHA256
fingerprint printed and kept on the session); a changed key is always refused.

Every command runs in its own session (``setsid``) under GNU ``timeout`` on the box, so a timeout
on either side kills the whole remote process group, not just the shell that started it.

Errors carry an exit code from ``dsv4kit.core.exitcodes`` (``RemoteError.exit_code``). Messages name
the host, the port, the key file and the known_hosts file, never key material or secret values.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import re
import select
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from dsv4kit.core import exitcodes

if TYPE_CHECKING:  # fabric/paramiko are imported lazily: this module is imported by the CLI only
    import paramiko

    from dsv4kit.core.inventory import Host


class RemoteError(Exception):
    """Something went wrong talking to the box. ``exit_code`` is the CLI exit status to use."""

    exit_code = exitcodes.UNREACHABLE


class Unreachable(RemoteError):
    """No SSH connection: refused, timed out, name not resolved, or no SSH server answering."""


class AuthenticationFailed(RemoteError):
    """The SSH server refused our credentials."""


class HostKeyMismatch(RemoteError):
    """The server's host key differs from the one in known_hosts (never accepted)."""


class UnknownHostKey(RemoteError):
    """The server's host key is not in known_hosts and trusting new keys was not asked for."""


class RemoteTimeout(RemoteError):
    """A remote command ran past its timeout; its process group was killed."""

    exit_code = exitcodes.TIMEOUT


class HandshakeTimeout(RemoteError):
    """The port accepted the TCP connection but no SSH server answered within the connect timeout:
    the host is unreachable (3), as Ansible reports the same hung sshd in ``provision``."""

    exit_code = exitcodes.UNREACHABLE


class MissingRemoteTool(RemoteError):
    """The box lacks a tool every remote command needs (``setsid``, GNU ``timeout``)."""

    exit_code = exitcodes.ENVIRONMENT


class RemoteCommandFailed(RemoteError):
    """A remote command exited non-zero (raised only with ``check=True``)."""

    exit_code = exitcodes.TOOL_FAILED

    def __init__(self, message: str, result: "RemoteResult"):
        super().__init__(message)
        self.result = result


@dataclass
class RemoteResult:
    exit_code: int
    stdout: str
    stderr: str
    seconds: float = 0.0


# Names of environment variables whose values are never shown in messages or logs.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW", re.IGNORECASE)
_PGID_MARKER = "__dsv4kit_pgid__="
# Extra seconds the box-side `timeout` waits beyond the local deadline: the local side kills the
# process group first and reports; the box-side timer is the backstop when we are gone.
_REMOTE_GRACE_S = 5


def fingerprint(key: "paramiko.PKey") -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """The name a host key is filed under in known_hosts: ``addr`` or ``[addr]:port``."""
    return address if port == 22 else f"[{address}]:{port}"


def redact_env(env: Optional[dict]) -> dict:
    """A copy of ``env`` safe to print: values of *KEY*/*TOKEN*/*SECRET*/*PASSW* names masked."""
    return {k: ("***" if _SECRET_NAME.search(k) else v) for k, v in (env or {}).items()}


def _check_env(env: dict) -> None:
    for name, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"not a valid environment variable name: {name!r}")
        if any(c in str(value) for c in "\n\r\0"):
            raise ValueError(f"environment variable {name}: the value must be one line")


def _env_prefix(env: Optional[dict]) -> str:
    """``export NAME=value; ...`` as text: what a command with ``env`` is shown as (values masked
    by the caller). The command itself gets the values through stdin, see :func:`_env_reader`."""
    if not env:
        return ""
    _check_env(env)
    return "".join(f"export {k}={shlex.quote(str(v))}; " for k, v in env.items())


def _env_reader(env: Optional[dict]) -> str:
    """Shell text that reads ``env``'s values from stdin, one line each, and exports them: the
    values never appear on a command line (which every user of the box can read in ``ps``)."""
    if not env:
        return ""
    _check_env(env)
    return "".join(f"IFS= read -r {k}; export {k}; " for k in env)


def ssh_config_path() -> Path:
    """The OpenSSH client configuration Ansible's ssh connection reads: ``~/.ssh/config``."""
    return Path(os.path.expanduser("~/.ssh/config"))


@dataclass
class Endpoint:
    """Where one SSH hop goes, resolved (:func:`resolve`)."""

    alias: str  # the name looked up in ~/.ssh/config (ansible_host, else the inventory name)
    hostname: str
    port: int
    user: str
    key_files: list[str]
    only_key_files: bool  # the named key files alone: no agent, no default keys
    host_key_alias: Optional[str]  # HostKeyAlias: the name the host key is filed under instead
    jumps: list["Endpoint"]  # ProxyJump hops, first hop first
    proxy_command: Optional[str] = None

    @property
    def known_hosts_name(self) -> str:
        """The known_hosts name of this hop's key: the HostKeyAlias as is (OpenSSH adds no port to
        it), else ``hostname`` or ``[hostname]:port``."""
        return self.host_key_alias or known_hosts_name(self.hostname, self.port)

    @property
    def target(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    def describe(self) -> str:
        via = ", ".join(j.target for j in self.jumps) or (f"ProxyCommand {self.proxy_command}" if self.proxy_command else "")
        return self.target + (f" via {via}" if via else "")


def _lookup(alias: str) -> dict:
    import paramiko

    path = ssh_config_path()
    if not path.is_file():
        return {"hostname": alias}
    try:
        return dict(paramiko.SSHConfig.from_path(str(path)).lookup(alias))
    except Exception as exc:  # noqa: BLE001 - paramiko raises several kinds on a bad line
        raise Unreachable(f"cannot read {path} (for {alias!r}): {exc}") from None


def _jump_option(args: str) -> Optional[str]:
    """A ProxyJump given on ssh's command line in ``args`` (``-J x`` or ``-o ProxyJump=x``)."""
    words = shlex.split(args or "")
    for index, word in enumerate(words):
        value = None
        if word == "-J" and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith("-J") and len(word) > 2:
            value = word[2:]
        elif word == "-o" and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith("-o") and len(word) > 2:
            value = word[2:]
        if value is None:
            continue
        if word.startswith("-J"):
            return value
        key, _, option = value.replace("=", " ", 1).partition(" ")
        if key.lower() == "proxyjump":
            return option.strip()
    return None


def _endpoint(alias: str, *, port: Optional[int], user: Optional[str], key_file: Optional[str],
              jump: Optional[str], depth: int = 0) -> Endpoint:
    config = _lookup(alias)
    keys = [key_file] if key_file else [os.path.expanduser(k) for k in config.get("identityfile", [])]
    endpoint = Endpoint(
        alias=alias, hostname=config.get("hostname", alias),
        port=int(port if port is not None else config.get("port", 22)),
        user=str(user or config.get("user") or getpass.getuser()),
        key_files=keys,
        only_key_files=bool(key_file) or str(config.get("identitiesonly", "no")).lower() == "yes",
        host_key_alias=config.get("hostkeyalias"), jumps=[],
        proxy_command=None if str(config.get("proxycommand", "none")).lower() == "none" else config["proxycommand"],
    )
    hops = jump if jump is not None else config.get("proxyjump")
    if hops and hops.lower() != "none":
        if depth > 8:
            raise Unreachable(f"ProxyJump for {alias!r}: more than 8 nested jump hosts (a loop in {ssh_config_path()}?)")
        endpoint.proxy_command = None  # ssh: ProxyJump and ProxyCommand exclude each other; the first wins
        for hop in hops.split(","):
            hop_user, _, rest = hop.strip().rpartition("@")
            hop_host, hop_port = rest, None
            if rest.startswith("["):  # [v6addr]:port
                hop_host, _, tail = rest[1:].partition("]")
                hop_port = int(tail[1:]) if tail.startswith(":") else None
            elif rest.count(":") == 1:
                hop_host, hop_port = rest.split(":")[0], int(rest.split(":")[1])
            endpoint.jumps.append(_endpoint(hop_host, port=hop_port, user=hop_user or None, key_file=None,
                                            jump=None, depth=depth + 1))
        # A hop's own ProxyJump comes first: ssh reaches it through that.
        endpoint.jumps = [j for hop in endpoint.jumps for j in (*hop.jumps, hop)]
        for hop in endpoint.jumps:
            hop.jumps = []
    return endpoint


def resolve(host: "Host") -> Endpoint:
    """Where ``host`` is reached, as Ansible's ssh connection would reach it (module docstring)."""
    given = host.vars
    jump = None
    for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):  # ssh: the first value given wins
        jump = jump or _jump_option(str(given.get(name) or ""))
    key = host.key_file
    return _endpoint(host.address, port=int(given["ansible_port"]) if "ansible_port" in given else None,
                     user=str(given["ansible_user"]) if given.get("ansible_user") else None,
                     key_file=str(key) if key is not None else None, jump=jump)


def _host_key_policy(session: "RemoteSession", *, box: bool = True):
    import paramiko

    class VerifyPolicy(paramiko.MissingHostKeyPolicy):
        """RejectPolicy, unless trusting new keys was asked for explicitly."""

        def missing_host_key(self, client, hostname, key):
            if box:  # a jump host's key is checked the same way, but is not the box's
                session.host_key_fingerprint = fingerprint(key)
            known = session.known_hosts
            if not session.trust_new_host_key:
                raise UnknownHostKey(
                    f"host key of {hostname} ({key.get_name()} {fingerprint(key)}) is not in "
                    f"{known}. Check the fingerprint out of band (on the box: ssh-keygen -lf "
                    f"/etc/ssh/ssh_host_{_short_type(key)}_key.pub), then re-run with "
                    f"--trust-new-host-key to record it."
                )
            _append_known_host(known, hostname, key)
            session.host_key_trusted_now = True
            session._say(
                f"trusted new host key for {hostname}: {key.get_name()} {fingerprint(key)} "
                f"(recorded in {known})"
            )

    return VerifyPolicy()


def _short_type(key) -> str:
    name = key.get_name()
    return {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(name, "ecdsa" if "ecdsa" in name else "*")


def _append_known_host(path: Path, hostname: str, key) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    existing = path.read_text() if path.exists() else ""
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    with open(path, "a") as fh:
        if existing and not existing.endswith("\n"):
            fh.write("\n")
        fh.write(line)
    os.chmod(path, 0o600)


class RemoteSession:
    """One SSH connection to an inventory host. Use ``open_session``; close (or ``with``) after."""

    def __init__(self, host: "Host", *, trust_new_host_key: bool = False,
                 say: Callable[[str], None] | None = None):
        self.host = host
        self.trust_new_host_key = trust_new_host_key
        self.known_hosts = host.known_hosts
        self.host_key_fingerprint: Optional[str] = None
        self.host_key_trusted_now = False
        self._say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._conn = None
        self._gateways: list = []
        self.endpoint = resolve(host)

    # -- connection ---------------------------------------------------------------------------
    @property
    def target(self) -> str:
        return self.endpoint.describe()

    def _connection(self, endpoint: Endpoint, gateway, *, box: bool):
        """A fabric Connection to ``endpoint`` (through ``gateway``), host keys checked."""
        import fabric
        import paramiko

        timeout = self.host.connect_timeout
        connect_kwargs = {"banner_timeout": timeout, "auth_timeout": timeout}
        if endpoint.key_files:
            connect_kwargs["key_filename"] = list(endpoint.key_files)
        if endpoint.only_key_files:
            # A named key is the only credential tried: predictable, and no agent surprises.
            connect_kwargs.update(look_for_keys=False, allow_agent=False)
        # An empty SSH config for fabric: resolve() has applied ~/.ssh/config already.
        config = fabric.Config(ssh_config=paramiko.SSHConfig())
        conn = fabric.Connection(
            endpoint.hostname, user=endpoint.user, port=endpoint.port, config=config,
            connect_timeout=max(1, int(round(timeout))), connect_kwargs=connect_kwargs, inline_ssh_env=True,
            gateway=gateway if gateway is not None else endpoint.proxy_command,
        )
        client = conn.client
        client._system_host_keys = paramiko.HostKeys()  # only host.known_hosts counts
        if self.known_hosts.is_file():
            try:
                client.load_host_keys(str(self.known_hosts))
            except Exception as exc:  # noqa: BLE001 - a broken line raises InvalidHostKey, no SSHException
                raise UnknownHostKey(f"cannot read known_hosts {self.known_hosts}: {exc}") from None
        if endpoint.host_key_alias:  # paramiko looks the key up under the address; ssh under the alias
            keys = client.get_host_keys()
            for kind, key in (keys.lookup(endpoint.host_key_alias) or {}).items():
                keys.add(known_hosts_name(endpoint.hostname, endpoint.port), kind, key)
        client.set_missing_host_key_policy(_host_key_policy(self, box=box))
        return conn

    def connect(self) -> "RemoteSession":
        import logging

        import paramiko

        # paramiko logs handshake failures with tracebacks from its own thread; the error we raise
        # says it once. (Handlers configured by the caller still receive the records.)
        logger = logging.getLogger("paramiko")
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
        host, endpoint = self.host, self.endpoint
        key = ", ".join(endpoint.key_files) or None
        gateway = None
        for hop in self.endpoint.jumps:  # ProxyJump: each hop through the one before it
            gateway = self._connection(hop, gateway, box=False)
            self._gateways.append(gateway)
        conn = self._connection(self.endpoint, gateway, box=True)
        self._conn = conn
        where = f"{self.target} ({host.name})"
        started = time.monotonic()
        try:
            conn.open()
        except RemoteError:
            self.close()
            raise
        except paramiko.BadHostKeyException as exc:
            self.close()
            name = endpoint.known_hosts_name
            raise HostKeyMismatch(
                f"HOST KEY CHANGED for {name} ({host.name}): {self.known_hosts} has "
                f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}, the server presents "
                f"{exc.key.get_name()} {fingerprint(exc.key)}. Refusing to connect (this can be a "
                f"man-in-the-middle). If the box was reinstalled, verify the new key out of band and "
                f"remove the old entry: ssh-keygen -R '{name}' -f {self.known_hosts}"
            ) from None
        except paramiko.PasswordRequiredException:
            self.close()
            raise AuthenticationFailed(
                f"{where}: key file {key} is passphrase-protected; load it into ssh-agent and "
                f"drop ansible_ssh_private_key_file, or use a key without a passphrase"
            ) from None
        except paramiko.AuthenticationException as exc:
            self.close()
            cred = f"key file {key}" if key else "the ssh-agent and ~/.ssh default keys"
            raise AuthenticationFailed(
                f"{where}: authentication failed with {cred} ({exc}). Is the public key in "
                f"~{endpoint.user}/.ssh/authorized_keys on the box?"
            ) from None
        except (socket.timeout, TimeoutError) as exc:
            self.close()
            raise Unreachable(f"{where}: connection timed out after {host.connect_timeout:g}s ({exc})") from None
        except socket.gaierror as exc:
            self.close()
            raise Unreachable(f"{where}: cannot resolve {endpoint.hostname!r}: {exc}") from None
        except paramiko.SSHException as exc:
            transport = conn.client.get_transport()
            spoke = bool(getattr(transport, "remote_version", "")) if transport is not None else False
            self.close()
            if not spoke and time.monotonic() - started >= 0.8 * host.connect_timeout:
                raise HandshakeTimeout(
                    f"{where}: the port accepts TCP connections but no SSH server answered within "
                    f"{host.connect_timeout:g}s (no SSH banner; dsv4_connect_timeout): is sshd hung, or is "
                    f"something else listening on port {endpoint.port}?") from None
            if "No authentication methods" in str(exc):
                raise AuthenticationFailed(f"{where}: no credentials to offer ({exc}); set ansible_ssh_private_key_file") from None
            raise Unreachable(f"{where}: SSH handshake failed: {exc}") from None
        except OSError as exc:
            self.close()
            reason = exc.strerror or str(exc)
            if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
                reason = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()}))
            raise Unreachable(f"{where}: cannot connect: {reason}") from None
        transport = conn.transport
        if self.host_key_fingerprint is None and transport is not None:
            self.host_key_fingerprint = fingerprint(transport.get_remote_server_key())
        if transport is not None:
            transport.set_keepalive(30)
        return self

    def close(self) -> None:
        for conn in [self._conn, *reversed(self._gateways)]:
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
        self._conn = None
        self._gateways = []

    def __enter__(self) -> "RemoteSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _transport(self):
        if self._conn is None or self._conn.transport is None or not self._conn.transport.is_active():
            raise Unreachable(f"{self.target}: the SSH connection is closed")
        return self._conn.transport

    # -- commands -----------------------------------------------------------------------------
    def run(self, command: str, *, timeout: float, env: dict | None = None, cwd: str | None = None,
            stream: Callable[[str], None] | None = None, check: bool = True) -> RemoteResult:
        """Run ``command`` (a shell command line) on the box and wait for it, at most ``timeout`` s.

        The command runs in a new session under ``setsid`` and box-side ``timeout``; past the local
        deadline its whole process group is killed (TERM, then KILL) and RemoteTimeout is raised.
        ``stream`` gets each output line (stdout and stderr) as it arrives. With ``check`` a non-zero
        exit raises RemoteCommandFailed. ``env`` is set for the command only, passed through stdin
        (not the command line); values of names that look secret are masked in every message.
        The command's stdin is at end of file.
        """
        if not 0 < timeout < float("inf"):  # also refuses NaN; int(inf) below would overflow
            raise ValueError(f"timeout must be a positive finite number of seconds, got {timeout!r}")
        # The values are read first, whatever happens next: a failed `cd` must not leave them on
        # stdin (nor run the command elsewhere).
        inner = _env_reader(env) + (f"cd {shlex.quote(cwd)} || exit 1; " if cwd else "") + command
        remote_limit = int(timeout) + _REMOTE_GRACE_S
        # sh ($$) is the new session's leader, so $$ is the process-group id to kill. `timeout`
        # (exec'd, same pid) kills its whole group when the box-side limit expires.
        leader = (
            f'echo "{_PGID_MARKER}$$" >&2; '
            f"exec timeout -s TERM -k 5 {remote_limit} sh -c {shlex.quote(inner)}"
        )
        wrapped = f"exec setsid -w sh -c {shlex.quote(leader)}"
        shown = (_env_prefix(redact_env(env)) + command) if env else command

        channel = self._transport().open_session()
        started = time.monotonic()
        deadline = started + timeout
        pgid: list[Optional[int]] = [None]

        def marker(line: str) -> bool:
            # Our own first stderr line names the process group; it is not the command's output.
            if pgid[0] is None and line.startswith(_PGID_MARKER):
                pgid[0] = int(line[len(_PGID_MARKER):].strip() or 0) or None
                return True
            return False

        out, err = _LineBuffer(stream), _LineBuffer(stream, drop=marker)
        try:
            channel.exec_command(wrapped)
            if env:
                channel.sendall("".join(f"{v}\n" for v in env.values()).encode())
            channel.shutdown_write()  # the command's stdin: the env values, then end of file
            while True:
                got = False
                while channel.recv_ready():
                    out.feed(channel.recv(65536))
                    got = True
                while channel.recv_stderr_ready():
                    err.feed(channel.recv_stderr(65536))
                    got = True
                # sshd may send the exit status before the last output; EOF means all output is in.
                done = channel.closed or (channel.exit_status_ready() and channel.eof_received)
                if done and not channel.recv_ready() and not channel.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    self._kill_group(pgid[0])
                    raise RemoteTimeout(
                        f"{self.host.name}: command timed out after {timeout:g}s and its process "
                        f"group{f' {pgid[0]}' if pgid[0] else ''} was killed: {shown}"
                    )
                if not got:
                    select.select([channel], [], [], 0.05)
            code = channel.recv_exit_status()
        except KeyboardInterrupt:
            self._kill_group(pgid[0])
            raise
        finally:
            channel.close()
        out.flush()
        err.flush()
        elapsed = time.monotonic() - started
        result = RemoteResult(exit_code=code, stdout=out.text, stderr=err.text, seconds=elapsed)
        if code == 124 and elapsed >= timeout:
            raise RemoteTimeout(f"{self.host.name}: command timed out after {timeout:g}s on the box: {shown}")
        if code in (126, 127):
            missing = re.search(r"exec: (setsid|timeout): not found", result.stderr)
            if missing:
                raise MissingRemoteTool(
                    f"{self.host.name}: '{missing.group(1)}' is missing on the box "
                    "(util-linux and coreutils provide setsid and timeout)")
        if code == -1:
            raise Unreachable(f"{self.host.name}: the connection dropped while running: {shown}")
        if check and code != 0:
            tail = (result.stderr.strip() or result.stdout.strip())[-2000:]
            raise RemoteCommandFailed(
                f"{self.host.name}: command exited with {code}: {shown}" + (f"\n{tail}" if tail else ""), result
            )
        return result

    def _kill_group(self, pgid: Optional[int]) -> None:
        """TERM, then KILL, the remote process group (best effort, on a fresh channel)."""
        if not pgid or pgid <= 1:
            return
        # Zombies (killed, not yet reaped) do not count as alive.
        alive = f"ps -e -o pgid=,stat= | awk '$1 == {pgid} && $2 !~ /^Z/ {{ found = 1 }} END {{ exit !found }}'"
        script = (
            f"kill -TERM -- -{pgid} 2>/dev/null || exit 0; "
            f"for i in 1 2 3 4 5 6 7 8 9 10; do {alive} || exit 0; sleep 0.3; done; "
            f"kill -KILL -- -{pgid} 2>/dev/null; exit 0"
        )
        try:
            channel = self._transport().open_session()
            channel.settimeout(15)
            channel.exec_command(script)
            channel.recv_exit_status()
            channel.close()
        except Exception as exc:  # the box-side `timeout` still ends the group
            self._say(f"warning: could not kill remote process group {pgid} on {self.host.name}: {exc}")

    # -- files --------------------------------------------------------------------------------
    def put(self, local_path, remote_path, *, timeout: float = 600.0) -> None:
        """Copy a local file to the box (SFTP). Any single transfer stall over ``timeout`` fails."""
        self._transfer("put", local_path, remote_path, timeout)

    def get(self, remote_path, local_path, *, timeout: float = 600.0) -> None:
        """Copy a file from the box (SFTP). Any single transfer stall over ``timeout`` fails."""
        self._transfer("get", remote_path, local_path, timeout)

    def _transfer(self, direction: str, src, dst, timeout: float) -> None:
        self._transport()
        try:
            self._conn.sftp().get_channel().settimeout(timeout)
            if direction == "put":
                self._conn.put(str(src), remote=str(dst))
            else:
                self._conn.get(str(src), local=str(dst))
        except (socket.timeout, TimeoutError):
            raise RemoteTimeout(f"{self.host.name}: copying {src} to {dst} stalled for {timeout:g}s") from None
        except (OSError, EOFError) as exc:
            what = f"cannot copy {src} to {dst}" if direction == "put" else f"cannot fetch {src}"
            raise RemoteCommandFailed(f"{self.host.name}: {what}: {exc}", RemoteResult(1, "", str(exc))) from None


class _LineBuffer:
    """Decodes output and hands each complete line to ``stream`` as it arrives.

    ``drop(line)`` may claim a line (it is then neither kept nor streamed).
    """

    def __init__(self, stream: Callable[[str], None] | None, drop: Callable[[str], bool] | None = None):
        import codecs

        self.stream = stream
        self.drop = drop
        self.lines: list[str] = []
        self.partial = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes) -> None:
        text = self.partial + self._decoder.decode(data)
        *complete, self.partial = text.split("\n")
        for line in complete:
            self._line(line.rstrip("\r") + "\n")

    def flush(self) -> None:
        rest = self.partial + self._decoder.decode(b"", final=True)
        self.partial = ""
        if rest:
            self._line(rest)

    def _line(self, line: str) -> None:
        if self.drop is not None and self.drop(line.rstrip("\n")):
            return
        self.lines.append(line)
        if self.stream is not None:
            self.stream(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "".join(self.lines)


def open_session(host: "Host", *, trust_new_host_key: bool = False,
                 say: Callable[[str], None] | None = None) -> RemoteSession:
    """Connect to ``host`` (host key verified against ``host.known_hosts``) and return the session.

    Raises Unreachable, AuthenticationFailed, HostKeyMismatch or UnknownHostKey (exit code 3).
    ``say`` receives notices such as a newly trusted key's fingerprint (default: stderr).
    """
    host.check_connectable()
    return RemoteSession(host, trust_new_host_key=trust_new_host_key, say=say).connect()
