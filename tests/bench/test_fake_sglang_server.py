"""The stand-in server's own transport must not be the bottleneck a real SGLang server lacks."""

from __future__ import annotations

import os
import signal
import socket

from tests.bench_support import FakeServer


def test_the_stand_in_queues_as_many_connections_as_the_client_opens_at_once(tmp_path):
    # The bench client opens one connection per request, C at once. With the accept loop starved
    # (here: paused outright), every connect must still complete from the listen backlog, as it
    # does against uvicorn's 2048; socketserver's default of 5 drops the rest for a ~1 s SYN retry.
    (tmp_path / "model").mkdir()
    server = FakeServer(tmp_path / "server", tmp_path / "model").start()
    sockets: list[socket.socket] = []
    try:
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            late = 0
            for _ in range(64):
                try:
                    sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=0.3))
                except OSError:  # timed out: the SYN was dropped
                    late += 1
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert late == 0, f"{late} of 64 simultaneous connections were not queued by the stand-in's listen backlog"
    finally:
        for sock in sockets:
            sock.close()
        server.stop()
