"""Listening TCP sockets of processes, read from /proc/net/tcp{,6} and /proc/PID/fd (as ``ss -ltnp``
shows them), for the closed-box tests: which address each process listens on."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Listener:
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)


def _listening_inodes() -> dict[str, tuple[str, int]]:
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            found[fields[9]] = (_address(hex_address), int(hex_port, 16))
    return found


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo += children.get(current, [])
    return found


def listeners(*pids: int) -> list[Listener]:
    """Every listening TCP socket held by ``pids`` or their descendants."""
    inodes = _listening_inodes()
    result = set()
    for pid in set().union(*(_descendants(p) for p in pids)) if pids else set():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                address, port = inodes[target[8:-1]]
                result.add(Listener(pid, address, port))
    return sorted(result, key=lambda l: (l.pid, l.port))
