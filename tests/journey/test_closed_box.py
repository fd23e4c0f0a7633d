"""A closed box, proven on real sockets: torch's own rendezvous store, started the way SGLang starts
it (``init_process_group`` at ``tcp://127.0.0.1:PORT``) in a process with the serving units'
environment, listens on loopback only. Without dsv4kit's loopback store it listens on every
address, and the same check says so."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.listening import listeners
from tests.service_units import render_units
from dsv4kit.core.unit_env import read_env_file

STORE = r"""
import datetime, sys
import dsv4kit.sglang_plugin as plugin
plugin.register()   # what SGLang's plugin loader does in every process
import torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
print("ready", flush=True)
sys.stdin.read()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def service_env(tmp_path_factory) -> dict:
    """The environment file the role writes for the serving units."""
    units = render_units(tmp_path_factory.mktemp("closed") / "prefix")
    return read_env_file(str(units.parents[1] / "dsv4kit/service.env"))


def _store_listeners(env: dict) -> list:
    proc = subprocess.Popen([sys.executable, "-c", STORE, str(_free_port())], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
        time.sleep(0.2)
        return listeners(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_torchs_store_listens_on_loopback_only_with_the_units_environment(service_env):
    keep = {k: v for k, v in service_env.items() if k in ("DSV4KIT_LOOPBACK_STORE", "GLOO_SOCKET_IFNAME",
                                                          "MC_TCP_BIND_ADDRESS", "SGLANG_HOST_IP")}
    found = _store_listeners({**os.environ, **keep})
    assert found, "the store opened no listening socket"
    open_ = [l for l in found if not l.loopback]
    assert not open_, f"listening beyond loopback: {open_}"


def test_without_it_torch_listens_everywhere_and_the_check_catches_it(service_env):
    env = {k: v for k, v in os.environ.items() if k != "DSV4KIT_LOOPBACK_STORE"}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    found = _store_listeners(env)
    assert any(not l.loopback for l in found), found
