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


def test_the_standin_refreshes_its_gauges_on_sglangs_cadence_and_counts_every_request():
    """0.5.23 writes the scheduler gauges on a prefill batch, every 40 decode passes and when idle
    (docs/sglang-contract.md §9.3); counters move at once. So must the stand-in."""
    import argparse

    from dsv4kit.serving.box.metrics import parse_exposition, select_metrics
    from tests.fake_sglang_server import State

    args = argparse.Namespace(model_path="/m", context_length=4096, token_delay_ms=1, error_every=0, cached_tokens=0,
                              vocab_size=10, decode_cap=0, prefill_ms=0, serial_prefill=False, batch_slowdown=0,
                              omit="", max_running_requests=256, max_total_num_tokens=1000, tp_size=4,
                              enable_priority_scheduling=False, enable_metrics_for_all_schedulers=False)
    state = State(args)

    def read():
        return select_metrics(parse_exposition(state.metrics()))[0]

    state.enter("running", 0, 3)
    state.publish_gauges()  # a prefill batch
    state.enter("running", 0, 2)  # two more join without one (a PD decode server's transfers)
    state.count_http("/generate", "POST")
    state.count_http("/metrics", "GET")
    assert read()["num_running_reqs"] == 3 and read()["requests_started_total"] == 1
    state.passes = 39.9
    assert read()["num_running_reqs"] == 3  # not yet 40 decode passes since the last write
    state.passes = 40.0
    assert read()["num_running_reqs"] == 5
    state.enter("running", 0, -5)
    assert read()["num_running_reqs"] == 0  # the idle check publishes at once
