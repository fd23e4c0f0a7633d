"""torch's rendezvous store on the address it was given, when that address is loopback.

torch 2.13's ``TCPStore`` server listens on every interface (``[::]``) whatever host name it gets,
so the store SGLang opens at ``tcp://127.0.0.1:PORT`` is reachable from the network. With
``DSV4KIT_LOOPBACK_STORE=1`` (the serving units' service.env sets it), :func:`install` makes the
server side of ``torch.distributed.rendezvous._create_c10d_store`` listen on a socket bound to the
loopback address it was asked for (``master_listen_fd``). Other addresses, clients, and a port
this process already serves are left to torch. Standard library at import; torch only inside.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket

ENV = "DSV4KIT_LOOPBACK_STORE"
logger = logging.getLogger(__name__)
_installed = False


def _loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _bound_socket(hostname: str, port: int):
    family = socket.AF_INET6 if ":" in hostname else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1" if hostname == "localhost" else hostname, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        return None
    return sock


def install(environ=None) -> bool:
    """Wrap the store factory when ``$DSV4KIT_LOOPBACK_STORE`` is 1; True when wrapped (idempotent)."""
    global _installed
    environ = os.environ if environ is None else environ
    if environ.get(ENV) != "1":
        return False
    if _installed:
        return True
    import importlib

    # The module, not the function torch.distributed re-exports under the same name.
    rendezvous = importlib.import_module("torch.distributed.rendezvous")

    original = rendezvous._create_c10d_store

    def create_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        if rank != 0 or not _loopback(str(hostname)) or rendezvous._torchelastic_use_agent_store():
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        sock = _bound_socket(str(hostname), int(port))
        if sock is None:  # already served here (multi-tenant) or taken: torch says which
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        fd = sock.detach()  # the store's server owns it from here
        return rendezvous.TCPStore(host_name=hostname, port=port, world_size=world_size, is_master=True,
                                   timeout=timeout, multi_tenant=True, master_listen_fd=fd, use_libuv=use_libuv)

    rendezvous._create_c10d_store = create_store
    _installed = True
    logger.info("dsv4kit: torch's rendezvous store listens on loopback only for loopback addresses")
    return True
