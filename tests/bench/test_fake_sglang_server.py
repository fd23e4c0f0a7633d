"""The stand-in server's own transport must not be the bottleneck a real SGLang server lacks."""

from __future__ import annotations

import os
import signal
import socket
import urllib.error
import urllib.request

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


def test_a_flush_empties_the_stand_in_models_prefix_cache(tmp_path, tokenizer_dir):
    # The bench flushes before every point and gates on a cold cache (cached_tokens 0): the
    # stand-in must then prefill a long prompt again, as a real server does, and not answer the
    # next repetition's identical prompts at a warm cache's speed.
    server = FakeServer(tmp_path / "server", tokenizer_dir, context_length=8192).start()
    try:
        server.post("/_test/config", {"model": {"prefill_us_per_token": 1}})
        long_prompt = {"input_ids": list(range(5, 2005)), "sampling_params": {"max_new_tokens": 1}}

        def flush() -> int:
            request = urllib.request.Request(f"http://127.0.0.1:{server.port}/flush_cache", data=b"{}", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code

        def cold_after(*paths: str) -> int:
            for path in paths:
                if path == "/generate":
                    server.post(path, long_prompt)
                else:
                    assert flush() == expected_flush
            return server.stats()["cold_prefills"]

        expected_flush = 200

        assert cold_after("/generate") == 1
        assert cold_after("/generate") == 1  # cached: same first 1,024 ids, no flush
        assert cold_after("/flush_cache", "/generate") == 2
        server.post("/_test/config", {"flush_status": 400})  # a refused flush keeps the cache
        expected_flush = 400
        assert cold_after("/flush_cache", "/generate") == 2
    finally:
        server.stop()
