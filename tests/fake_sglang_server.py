"""A loopback stand-in for an SGLang 0.5.23 server, speaking its real HTTP protocol (tests only).

It answers what ``sglang.benchmark.serving --backend sglang`` and ``dsv4kit bench`` ask for:

- ``GET /health``, ``GET /v1/models``, ``GET /model_info``, ``GET /server_info``
  (resolved server args, ``context_length``, ``launch_command``, ``startup_time``,
  ``internal_states``, and a fake ``api_key``/``admin_api_key`` so tests can prove scrubbing);
- ``POST /flush_cache`` (200, counted; the stand-in model's prefix cache is emptied: tests/fake_model.py);
- ``POST /generate`` with ``stream: true``: ``data: {json}\\n\\n`` chunks carrying the
  *cumulative* ``text`` and ``output_ids`` and ``meta_info{id, finish_reason, prompt_tokens,
  completion_tokens, cached_tokens, ...}``, then ``data: [DONE]`` (SGLang's
  ``http_server.py`` stream format). Generated text is words ``w<id>`` separated by spaces, so
  a WordLevel tokenizer over the same words retokenizes it to exactly ``completion_tokens``.

Fault injection (the traps the bench gates must catch):
  ``--error-every N``: every N-th ``/generate`` request is rejected the way SGLang rejects an
  over-long prompt on a stream: HTTP 200, then ``data: {"error": {...}}``, then ``[DONE]``.
  ``--cached-tokens N``: report N cached prompt tokens per request (a warm prefix cache).
  ``--decode-cap N``: at most N requests decode at a time, the rest wait in the queue (what
  ``max_running_requests`` or a full KV pool does), while ``/server_info`` still says 256.
  ``--prefill-ms MS`` with ``--serial-prefill``: each prompt takes MS to prefill, one at a time.
  ``--batch-slowdown K``: a decode step takes ``token_delay_ms * (1 + K * (running - 1))``.
  ``--omit cached_tokens,prompt_tokens,startup_time``: leave those fields out of ``meta_info``
  and ``/server_info`` (the client then silently falls back to 0 / the planned length).
  ``--enable-priority-scheduling``, ``--enable-metrics-for-all-schedulers`` (with ``--tp-size``):
  ``/metrics`` in the shapes 0.5.23 writes with those server flags (see ``State.metrics``).
  ``POST /_test/config {"stalled": true}``: queued requests stop entering the batch (a stuck
  scheduler); ``{"retract": N}``: N more retracted requests (``num_retracted_requests_total``).
  ``POST /_test/config`` with a JSON body changes ``context_length``, ``error_every``,
  ``cached_tokens``, ``token_delay_ms``, ``decode_cap``, ``priority_scheduling``,
  ``all_schedulers``, ``tp_size`` or ``flush_status`` (400: the flush fails, as SGLang's does
  when the server cannot go idle, and the client aborts) at run time; ``"restart": true`` bumps
  ``startup_time`` as a restart would and bumps ``startup_time`` when the context
  length changes (a restart stand-in).

A non-streaming ``/generate`` (what ``dsv4kit eval`` sends) is answered by a small deterministic
model that reads its prompt, with SGLang 0.5.23's logprob fields (tests/fake_model.py); its faults
are set with ``POST /_test/config {"model": {...}}``.

``GET /metrics`` tells the truth about its own batch, in SGLang 0.5.23's Prometheus format and
labels (``--enable-metrics``), on its cadence (docs/sglang-contract.md §9.3): the gauges
``sglang:num_running_reqs`` (decoding), ``num_queue_reqs`` (waiting for a slot or for prefill),
``gen_throughput`` and ``token_usage`` are written on a prefill batch, every
``--gauge-refresh-passes`` (40) decode passes and when idle; the scheduler counters
(``realtime_tokens_total`` by mode, a request's first token counted by its prefill pass, not as
decode; ``cuda_graph_passes_total``) move every pass; the tokenizer counters
(``num_requests_total``, ``generation_tokens_total``, ``prompt_tokens_total``) when a request
finishes; ``http_requests_total{endpoint,method}`` as each request arrives. Faults of bench round
five: ``--decode-counter-scale K`` (the decode counter counts K times the tokens) and
``--counter-reset-at N`` (the scheduler counters restart from 0 once, without a restart). With
speculative decoding, ``spec_verify_calls_total`` adds each request's verify passes when it
finishes. ``--prefill-peer-port P``: the router's dual dispatch in PD (each request also goes to
the prefill server on P). ``POST /_test/config`` also takes ``prefill_ms`` and ``serial_prefill``
(a slow prefill, one prompt at a time) and ``dp_size`` (``/server_info`` reports N DP replicas).
``POST /_test/stats`` returns the wall-clock time of every emitted token, so tests can check a
headline against what was delivered.
Any number of clients may load it at once (a second client's requests count in its batch and
its ``/metrics`` like the bench's own; ``tests/bench_support.ForeignLoad``).

``--api-key-file F``: the server takes the key in F (a ``DSV4_ROUTER_API_KEY=...`` line, as the
router's key file holds it; never on argv) and decides every request with SGLang 0.5.23's own
``decide_request_auth`` (``srt/utils/auth.py`` from the cached wheel): ``/health*`` and ``/metrics``
open, everything else 401 without ``Authorization: Bearer <key>``. ``/_test/*`` stays open.

Listens on 127.0.0.1 only and exits by itself after ``--max-lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

try:
    from tests.standin_http import send
except ImportError:  # run as a script from tests/
    from standin_http import send

# Run as a script (the box's stand-in) or imported as tests.fake_sglang_server (unit tests).
if __package__:
    from . import chat_standin
    from .fake_model import StandInModel
    from .standin_histograms import ServingMetrics
else:
    import chat_standin
    from fake_model import StandInModel
    from standin_histograms import ServingMetrics

FAKE_API_KEY = "sk-dsv4kit-FAKE-SECRET-3f9a"
FAKE_ADMIN_KEY = "admin-dsv4kit-FAKE-SECRET-77c1"


#: SGLang 0.5.23 publishes the scheduler gauges from its idle check at most this often.
IDLE_PUBLISH_S = 30.0

def request_auth(key_file: str):
    """``allowed(method, path, authorization) -> bool`` of a server whose key is in ``key_file``,
    decided by SGLang 0.5.23's ``decide_request_auth`` (its module loaded alone: it imports no torch)."""
    import importlib.util
    from pathlib import Path

    key = next(line.split("=", 1)[1].strip() for line in Path(key_file).read_text().splitlines()
               if line.startswith("DSV4_ROUTER_API_KEY="))
    import sys

    try:
        from tests.sglang_wheel import sglang_site
    except ImportError:
        sys.path.append(str(Path(__file__).resolve().parents[1]))
        from tests.sglang_wheel import sglang_site
    spec = importlib.util.spec_from_file_location("sglang_auth", sglang_site() / "sglang/srt/utils/auth.py")
    auth = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = auth  # its dataclasses look their module up
    spec.loader.exec_module(auth)

    def allowed(method: str, path: str, authorization) -> bool:
        return path.startswith("/_test/") or auth.decide_request_auth(
            method=method, path=path, authorization_header=authorization, api_key=key, admin_api_key=None,
            auth_level=auth.AuthLevel.NORMAL).allowed

    return allowed


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.lock = threading.Lock()
        self.allowed = request_auth(args.api_key_file) if getattr(args, "api_key_file", "") else None
        self.model_path = args.model_path
        self.context_length = args.context_length
        self.token_delay_ms = args.token_delay_ms
        self.error_every = args.error_every
        self.cached_tokens = args.cached_tokens
        self.vocab_size = args.vocab_size
        self.startup_time = time.time()
        self.generate_count = 0
        self.flush_count = 0
        self.flush_times: list[float] = []
        self.flush_status = 200
        self.decode_cap = args.decode_cap
        self.slots = threading.BoundedSemaphore(args.decode_cap) if args.decode_cap else None
        self.prefill_ms = args.prefill_ms
        self.prefill_lock = threading.Lock() if args.serial_prefill else None
        self.batch_slowdown = args.batch_slowdown
        self.omit = {f for f in (args.omit or "").split(",") if f}
        self.max_running_requests = args.max_running_requests
        self.max_total_num_tokens = args.max_total_num_tokens
        self.running = 0
        self.queued = 0
        self.running_tokens = 0
        self.generated_total = 0
        self.prompt_total = 0
        self.token_times: list[float] = []
        self.priority_scheduling = args.enable_priority_scheduling
        self.all_schedulers = args.enable_metrics_for_all_schedulers
        self.tp_size = args.tp_size
        self.running_by_priority: dict = {}
        self.queued_by_priority: dict = {}
        self.known_priorities: set = set()
        self.generated_by_priority: dict = {}
        self.prompt_by_priority: dict = {}
        self.model = StandInModel(args.model_path)
        # The scheduler's per-pass counters (realtime_tokens_total, cuda_graph_passes_total), the
        # tokenizer's per-finished-request count, and the faults of bench round four.
        self.decode_tokens = self.prefill_tokens = self.prefill_cached = self.passes = 0.0
        self.finished = 0
        self.spec_accept_length = getattr(args, "spec_accept_length", 0.0)
        self.served_model_path = getattr(args, "served_model_path", "")
        self.kv_transfer_ms = getattr(args, "kv_transfer_ms", 0.0)
        self.disaggregation_mode = getattr(args, "disaggregation_mode", None) or "null"
        # latency histograms, cache hit rate, SWA use, PD transfer series (tests/standin_histograms.py)
        self.serving = ServingMetrics(self.disaggregation_mode,
                                      publish=getattr(args, "serving_metrics", False))
        self.chat = chat_standin.ChatStandIn(getattr(args, "served_model_name", "") or args.model_path)
        # SGLang's HTTP middleware counts every request it receives by (endpoint, method), as it arrives.
        self.http_requests: dict = {}
        # The scheduler gauges as published: refreshed only where 0.5.23's scheduler refreshes them
        # (a prefill batch, every decode_log_interval decode passes, the idle check); 0: live.
        self.gauge_refresh_passes = getattr(args, "gauge_refresh_passes", 40)
        self.published: dict = {}
        self.next_refresh = 0.0
        # Faults of bench round five: the decode counter grows by this factor of the tokens
        # emitted; once it passes counter_reset_at, the scheduler's counters restart from 0.
        self.decode_counter_scale = getattr(args, "decode_counter_scale", 1.0)
        # Speculative verify passes of finished requests (the tokenizer's spec_verify_calls_total).
        self.spec_verify_total = 0
        # The router's dual dispatch (sglang-router in PD mode): every generation request this
        # server gets is first sent to the prefill server on this port, which counts it as its own.
        self.prefill_peer_port = getattr(args, "prefill_peer_port", 0)
        self.dp_size = 1
        self.counter_reset_at = getattr(args, "counter_reset_at", 0)
        # Planted faults for the monitoring tests: a scheduler that stops taking requests from its
        # queue (``stalled``), and retracted requests (0.5.23's counter appears at the first one).
        self.stalled = False
        self.retracted_total = 0
        self.publish_gauges()

    def publish_gauges(self, admitting: int = 0, priority=None) -> None:
        """Take the scheduler gauges' values now (lock held), as 0.5.23's metrics reporter does.
        ``admitting``: a prefill batch's requests, which its write does not count as running yet
        (0.5.23 counts the running batch before the batch it admits joins it)."""
        now = time.time()
        self.last_publish = now
        by_priority = dict(self.running_by_priority)
        if admitting and priority in by_priority:
            by_priority[priority] -= admitting
        self.published = {"running": self.running - admitting, "queued": self.queued,
                          "running_by_priority": by_priority,
                          "queued_by_priority": dict(self.queued_by_priority),
                          "gen_throughput": float(sum(1 for t in self.token_times[-5000:] if t > now - 1.0)),
                          "token_usage": self.running_tokens / self.max_total_num_tokens}
        self.next_refresh = (int(self.passes) // self.gauge_refresh_passes + 1) * self.gauge_refresh_passes \
            if self.gauge_refresh_passes else 0.0

    def gauges(self) -> dict:
        """The gauge values /metrics shows now (lock held): live without a refresh cadence; else the
        last published ones, refreshed on idle (the scheduler's idle check publishes at once when
        the running gauge disagrees with an empty batch) and every decode_log_interval passes."""
        # The idle check runs whenever no batch runs (a queue it cannot admit included): it publishes
        # at once when the running gauge is stale, else at most every 30 s (metrics_reporter.py,
        # _maybe_log_idle_metrics).
        idle = not self.running
        if not self.gauge_refresh_passes or (idle and (self.published["running"] != 0
                                                        or time.time() > self.last_publish + IDLE_PUBLISH_S)) \
                or self.passes >= self.next_refresh:
            self.publish_gauges()
        return self.published

    def count_http(self, endpoint: str, method: str) -> None:
        with self.lock:
            self.http_requests[(endpoint, method)] = self.http_requests.get((endpoint, method), 0) + 1

    def count_decode(self, tokens: int) -> None:
        """A decode pass's tokens into the scheduler's counter (lock held), with the counter faults."""
        self.decode_tokens += tokens * self.decode_counter_scale
        if self.counter_reset_at and self.decode_tokens >= self.counter_reset_at:
            self.counter_reset_at = 0
            self.decode_tokens = self.prefill_tokens = self.prefill_cached = self.passes = 0.0
            self.next_refresh = 0.0

    def metrics(self) -> str:
        """The Prometheus text SGLang 0.5.23 serves with --enable-metrics (the metrics used here), in
        its collector's shapes: the scheduler gauges carry tp_rank/pp_rank/moe_ep_rank; with
        ``--enable-priority-scheduling`` the total is the ``priority=""`` series and one series per
        priority seen follows it; with ``--enable-metrics-for-all-schedulers`` every TP rank writes
        its own copy (the same batch), not only rank 0."""
        shown = self.gauges()
        ranks = range(self.tp_size) if self.all_schedulers else range(1)
        gauges = [
            ("num_running_reqs", "The number of running requests.", shown["running"], shown["running_by_priority"]),
            ("num_queue_reqs", "The number of requests in the waiting queue.", shown["queued"],
             shown["queued_by_priority"]),
            ("gen_throughput", "The generation throughput (token/s).", shown["gen_throughput"], None),
            ("token_usage", "The token usage.", shown["token_usage"], None),
        ]
        lines = []
        for name, doc, value, by_priority in gauges:
            lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} gauge"]
            for rank in ranks:
                labels = (f'model_name="{self.model_path}",engine_type="unified",tp_rank="{rank}",pp_rank="0",'
                          f'moe_ep_rank="{rank}"')
                if not self.priority_scheduling:
                    lines.append(f"sglang:{name}{{{labels}}} {float(value)}")
                    continue
                lines.append(f'sglang:{name}{{{labels},priority=""}} {float(value)}')
                if by_priority is not None:
                    for priority in sorted(self.known_priorities):
                        lines.append(f'sglang:{name}{{{labels},priority="{priority}"}} '
                                     f'{float(by_priority.get(priority, 0))}')
        streams = {("true", p): v for p, v in self.generated_by_priority.items()}
        prompts = {("true", p): v for p, v in self.prompt_by_priority.items()}
        for name, doc, per in (("prompt_tokens", "Number of prefill tokens processed.", prompts),
                               ("generation_tokens", "Number of generation tokens processed.", streams)):
            lines += [f"# HELP sglang:{name}_total {doc}", f"# TYPE sglang:{name}_total counter"]
            for (streaming, priority), value in sorted(per.items(), key=str) or [(("true", None), 0)]:
                labels = f'model_name="{self.model_path}",engine_type="unified"'
                if self.priority_scheduling:
                    labels += f',priority="{"" if priority is None else priority}"'
                labels += f',is_streaming="{streaming}"'
                lines += [f"sglang:{name}_total{{{labels}}} {float(value)}",
                          f"sglang:{name}_created{{{labels}}} {self.startup_time}"]
        lines += self.pass_metrics()
        rank0 = f'model_name="{self.model_path}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        lines += self.serving.lines(self.model_path, rank0, self.startup_time, shown["token_usage"])
        return "\n".join(lines) + "\n"

    def pass_metrics(self) -> list:
        """0.5.23's per-forward-pass scheduler counters (by ``mode``), the finished-request counter
        and, with speculative decoding, the acceptance-length gauge."""
        labels = f'model_name="{self.model_path}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        lines = ["# HELP sglang:realtime_tokens_total Total number of tokens processed.",
                 "# TYPE sglang:realtime_tokens_total counter"]
        if self.prefill_tokens:
            lines.append(f'sglang:realtime_tokens_total{{{labels},mode="prefill_compute"}} {self.prefill_tokens}')
        if self.prefill_cached:
            lines.append(f'sglang:realtime_tokens_total{{{labels},mode="prefill_cache"}} {self.prefill_cached}')
        if self.decode_tokens:
            lines.append(f'sglang:realtime_tokens_total{{{labels},mode="decode"}} {self.decode_tokens}')
        lines += ["# HELP sglang:cuda_graph_passes_total Total number of forward passes.",
                  "# TYPE sglang:cuda_graph_passes_total counter",
                  f'sglang:cuda_graph_passes_total{{{labels},mode="decode_cuda_graph"}} {self.passes}',
                  "# HELP sglang:num_requests_total Number of requests processed.",
                  "# TYPE sglang:num_requests_total counter",
                  f'sglang:num_requests_total{{model_name="{self.model_path}",engine_type="unified",'
                  f'is_streaming="true"}} {float(self.finished)}',
                  "# HELP sglang:http_requests_total Total number of HTTP requests by endpoint and method",
                  "# TYPE sglang:http_requests_total counter"]
        lines += [f'sglang:http_requests_total{{endpoint="{endpoint}",method="{method}"}} {float(count)}'
                  for (endpoint, method), count in sorted(self.http_requests.items())]
        if self.retracted_total:
            lines += ["# HELP sglang:num_retracted_requests_total Total number of retracted requests.",
                      "# TYPE sglang:num_retracted_requests_total counter",
                      f"sglang:num_retracted_requests_total{{{labels}}} {float(self.retracted_total)}",
                      f"sglang:num_retracted_requests_created{{{labels}}} {self.startup_time}"]
        if self.spec_verify_total:
            lines += ["# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.",
                      "# TYPE sglang:spec_verify_calls_total counter",
                      f'sglang:spec_verify_calls_total{{model_name="{self.model_path}",engine_type="unified"}} '
                      f'{float(self.spec_verify_total)}']
        # 0.5.23 writes the gauge on every stats log, 0 without a drafter (here: with the serving series)
        if self.spec_accept_length or self.serving.publish:
            lines += ["# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding.",
                      "# TYPE sglang:spec_accept_length gauge",
                      f"sglang:spec_accept_length{{{labels}}} {float(self.spec_accept_length)}"]
        return lines

    def enter(self, field: str, priority, delta: int) -> None:
        """Count a request into (or out of) the running or queued total and its priority (lock held)."""
        setattr(self, field, getattr(self, field) + delta)
        per = self.running_by_priority if field == "running" else self.queued_by_priority
        per[priority] = per.get(priority, 0) + delta
        self.known_priorities.add(priority)

    def server_info(self) -> dict:
        return {
            "model_path": self.served_model_path or self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.served_model_path or self.model_path,
            "context_length": self.context_length,
            "tp_size": self.tp_size,
            "dp_size": self.dp_size,
            "ep_size": 1,
            "kv_cache_dtype": "fp8_e4m3",
            "page_size": 256,
            "max_running_requests": self.max_running_requests,
            "cuda_graph_max_bs_decode": 64,
            # the gauges' rewrite cadence, as a launched server reports it (live gauges: every pass)
            "decode_log_interval": self.gauge_refresh_passes or 1,
            "mem_fraction_static": 0.8,
            "attention_backend": "dsv4",
            "disaggregation_mode": "null",
            "host": "127.0.0.1",
            "port": 30000,
            "api_key": FAKE_API_KEY,
            "admin_api_key": FAKE_ADMIN_KEY,
            "launch_command": (
                f"python -m sglang.launch_server --model-path {self.model_path} --tp 4 "
                f"--context-length {self.context_length} --api-key [REDACTED]"
            ),
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.context_length - 1,
            "startup_time": self.startup_time,
            "kv_events": None,
            # With a drafter: the most tokens one verify pass can emit a request (the bench's bound).
            "speculative_algorithm": "EAGLE" if self.spec_accept_length else None,
            "speculative_num_draft_tokens": (int(self.spec_accept_length) + 2) if self.spec_accept_length else None,
            "internal_states": [
                {"last_gen_throughput": 123.4, "memory_usage": {"kv_cache": 1.0},
                 "avg_spec_accept_length": self.spec_accept_length or None,
                 "effective_max_running_requests_per_dp": self.max_running_requests}
            ],
            "version": "0.5.23",
            "frontend": "fake_sglang_server",
        }


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def parse_request(self):
            parsed = super().parse_request()
            if parsed:
                state.count_http(urlparse(self.path).path, self.command)
            return parsed


        def log_message(self, format, *args):  # quiet
            pass

        def _json(self, code: int, body) -> None:
            send(self, code, json.dumps(body).encode(), "application/json")

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw) if raw else {}

        def _profiler(self, path: str) -> bool:
            """/start_profile, /stop_profile and /_test/profiler (tests/fake_profiler.py)."""
            length = int(self.headers.get("Content-Length") or 0)
            answer = state.profiler.handle(path, self.rfile.read(length) if length else b"")
            if answer is not None:
                status, kind, data = answer
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            return answer is not None

        def _refused(self, path: str) -> bool:
            """401 as SGLang's API-key middleware answers it, when the request lacks the key."""
            if state.allowed is None or state.allowed(self.command, path, self.headers.get("Authorization")):
                return False
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._json(401, {"error": "Unauthorized"})
            return True

        def do_GET(self):
            path = urlparse(self.path).path
            if self._refused(path):
                return
            if path in ("/start_profile", "/stop_profile", "/_test/profiler") and self._profiler(path):
                return
            if path in ("/health", "/health_generate"):
                self._json(200, {})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": state.chat.served_name, "object": "model", "owned_by": "sglang",
                     "root": state.chat.served_name, "max_model_len": state.context_length}]})
            elif path in ("/model_info", "/get_model_info"):
                self._json(200, {"model_path": state.model_path, "tokenizer_path": state.model_path,
                                 "served_model_name": state.model_path, "is_generation": True,
                                 "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"]})
            elif path in ("/server_info", "/get_server_info"):
                with state.lock:
                    info = state.server_info()
                    if "startup_time" in state.omit:
                        info.pop("startup_time")
                self._json(200, info)
            elif path == "/metrics":
                with state.lock:
                    data = state.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self):
            path = urlparse(self.path).path
            if self._refused(path):
                return
            if path in ("/start_profile", "/stop_profile", "/_test/profiler") and self._profiler(path):
                return
            if path == "/flush_cache":
                self._body()
                with state.lock:
                    state.flush_count += 1
                    state.flush_times.append(time.time())
                    status = state.flush_status
                if status == 200:
                    state.model.forget_cache()
                data = b"Cache flushed.\n" if status == 200 else b"Cannot flush: the server is not idle.\n"
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif path == "/_test/config":
                body = self._body()
                with state.lock:
                    for key in ("error_every", "cached_tokens", "token_delay_ms", "flush_status",
                                "priority_scheduling", "all_schedulers", "tp_size", "served_model_path",
                                "spec_accept_length", "kv_transfer_ms", "decode_counter_scale",
                                "counter_reset_at", "gauge_refresh_passes", "stalled", "prefill_peer_port", "dp_size",
                                "prefill_ms"):
                        if key in body:
                            setattr(state, key, body[key])
                    if "serial_prefill" in body:  # one prompt at a time (for requests that arrive from now on)
                        state.prefill_lock = threading.Lock() if body["serial_prefill"] else None
                    if body.get("counter_reset_at"):  # from now: once the decode counter grew by that much
                        state.counter_reset_at = state.decode_tokens + body["counter_reset_at"]
                    if "decode_cap" in body:  # for requests that arrive from now on
                        state.decode_cap = body["decode_cap"]
                        state.slots = threading.BoundedSemaphore(body["decode_cap"]) if body["decode_cap"] else None
                    if "chat" in body:  # the chat route's faults (tests/chat_standin.py)
                        state.chat.configure(body["chat"] or {})
                    if "model" in body:  # the stand-in model's faults (tests/fake_model.py)
                        state.model.faults = dict(body["model"] or {})
                    state.retracted_total += int(body.get("retract", 0))  # requests pushed back to the queue
                    state.serving.configure(body)
                    if body.get("restart"):  # what a unit restart does to /server_info
                        state.startup_time = time.time()
                    if "context_length" in body and body["context_length"] != state.context_length:
                        state.context_length = int(body["context_length"])
                        state.startup_time = time.time()
                self._json(200, {"ok": True})
            elif path == "/_test/stats":
                self._body()
                with state.lock:
                    self._json(200, {"generate_count": state.generate_count, "flush_count": state.flush_count,
                                     "flush_times": state.flush_times, "token_times": state.token_times,
                                     "cold_prefills": state.model.cold_prefills})
            elif path == "/generate":
                self._generate(self._body())
            elif path == "/v1/chat/completions":  # SGLang's own DeepSeek-V4 chat path (tests/chat_standin.py)
                self._chat(self._body())
            else:
                self._json(404, {"detail": "Not Found"})

        def _chunk(self, payload) -> None:
            data = b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _generate(self, body: dict) -> None:
            params = body.get("sampling_params") or {}
            max_new = int(params.get("max_new_tokens", 16))
            if "input_ids" in body:
                prompt_tokens = len(body["input_ids"])
            else:
                prompt_tokens = len(str(body.get("text", "")).split())
            with state.lock:
                state.generate_count += 1
                index = state.generate_count
                reject = bool(state.error_every) and index % state.error_every == 0
                cached = min(int(state.cached_tokens or 0), prompt_tokens)
                delay = state.token_delay_ms / 1000.0
                context_length = state.context_length
            too_long = prompt_tokens + max_new > context_length
            if not body.get("stream") and state.model.available():
                if too_long:
                    return self._json(400, {"error": {"message": f"Input length ({prompt_tokens} tokens) plus "
                                                      f"max_new_tokens ({max_new}) exceeds the context length "
                                                      f"({context_length}).", "type": "BadRequestError", "code": 400}})
                return self._json(200, state.model.generate(body, index))
            if not body.get("stream"):
                words = [f"w{(index + i) % state.vocab_size}" for i in range(max_new)]
                self._json(200, {"text": " ".join(words),
                                 "meta_info": self._meta(index, prompt_tokens, max_new, cached, True, max_new)})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if reject or too_long:
                # SGLang streams a rejected request as HTTP 200 + an error chunk (http_server.py).
                self._chunk({"error": {"message": f"Input length ({prompt_tokens} tokens) plus max_new_tokens "
                                       f"({max_new}) exceeds the context length ({context_length}).",
                                       "type": "BadRequestError", "code": 400}})
            else:
                if state.prefill_peer_port:
                    self._dispatch_prefill(body)
                self._stream_tokens(index, prompt_tokens, max_new, cached, delay, body.get("priority", 0))
            self._chunk(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chat(self, body: dict) -> None:
            """A chat request, streamed or whole, through the same queue, decode pacing and counters as
            a streamed /generate (a whole answer comes after its last decode step, as SGLang's does):
            the chat stand-in's ids are the tokens, its SSE payloads the chunks
            (tests/chat_standin.py; ``max_completion_tokens``, ``ignore_eos``, ``usage`` honoured)."""
            with state.lock:
                state.generate_count += 1
                index = state.generate_count
                cached, delay = int(state.cached_tokens or 0), state.token_delay_ms / 1000.0
            try:
                run = state.chat.run(body, cached)
            except Exception as exc:
                return chat_standin.send_error(self, exc)
            stream = bool(body.get("stream"))  # whole or streamed, the answer takes its decode steps
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for payload in run.opening():
                    self._chunk(payload.encode())

            def emit(ids: list, words: list) -> None:
                if stream:
                    for payload in run.step(len(ids)):
                        self._chunk(payload.encode())

            if state.prefill_peer_port:  # the router sends the chat request to the prefill server too
                self._dispatch_prefill({"input_ids": list(run.prompt_ids), "sampling_params": {}})
            self._stream_tokens(index, len(run.prompt_ids), len(run.output), run.cached, delay, body.get("priority", 0),
                                token_at=run.output.__getitem__, emit=emit)
            if not stream:
                return self._json(200, run.whole())
            for payload in run.closing():
                self._chunk(payload.encode())
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _dispatch_prefill(self, body: dict) -> None:
            """What sglang-router 0.3.2 does in PD mode: the request also goes to the prefill server
            (with the bootstrap fields it adds), which computes the prompt and counts the request."""
            import urllib.request

            payload = dict(body, stream=True, bootstrap_host="127.0.0.1", bootstrap_room=state.generate_count,
                           sampling_params=dict(body.get("sampling_params") or {}, max_new_tokens=1))
            request = urllib.request.Request(f"http://127.0.0.1:{state.prefill_peer_port}/generate",
                                             data=json.dumps(payload).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()

        def _meta(self, index: int, prompt_tokens: int, completion: int, cached: int, done: bool, max_new: int):
            meta = {
                "id": f"req-{index}",
                "finish_reason": {"type": "length", "length": max_new} if done else None,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "cached_tokens": cached,
                "reasoning_tokens": 0,
                "weight_version": "default",
                "num_retractions": 0,
            }
            for name in state.omit & {"prompt_tokens", "cached_tokens"}:
                meta.pop(name)
            return meta

        def _stream_tokens(self, index: int, prompt_tokens: int, max_new: int, cached: int, delay: float,
                           priority=0, token_at=None, emit=None) -> None:
            """Queue for a decode slot (and a serial prefill), then decode at the batch's speed.
            ``token_at(i)``: the i-th generated id (default: the bench's words); ``emit(ids, words)``:
            send what was generated so far (default: /generate's cumulative chunk)."""
            if token_at is None:
                token_at = lambda i: (index * 7 + i) % state.vocab_size  # noqa: E731
            if emit is None:
                def emit(ids: list, words: list) -> None:
                    self._chunk({"text": " ".join(words), "output_ids": list(ids),
                                 "meta_info": self._meta(index, prompt_tokens, len(ids), cached,
                                                         len(ids) == max_new, max_new)})
            started, times = time.time(), []
            with state.lock:
                state.enter("queued", priority, 1)
            while state.stalled:  # a stuck scheduler: the request waits in the queue
                time.sleep(0.05)
            slots = state.slots
            if slots is not None:
                slots.acquire()
            try:
                if state.prefill_lock is not None:
                    with state.prefill_lock:
                        time.sleep(state.prefill_ms / 1000.0)
                elif state.prefill_ms:
                    time.sleep(state.prefill_ms / 1000.0)
                words: list[str] = []
                ids: list[int] = []
                if state.kv_transfer_ms:
                    times.append(time.time())
                    self._transfer(max_new, priority, words, ids, token_at, emit)
                with state.lock:
                    if not state.kv_transfer_ms:
                        state.enter("queued", priority, -1)
                    state.enter("running", priority, 1)
                    state.running_tokens += prompt_tokens
                    state.prompt_total += prompt_tokens
                    if not state.kv_transfer_ms:  # a PD decode server computes no prompt tokens
                        state.prefill_tokens += prompt_tokens - cached
                        state.prefill_cached += cached
                    # A prefill batch writes the scheduler gauges, without the request it admits; a PD
                    # decode server admits a transferred request without one and writes nothing.
                    if not (state.kv_transfer_ms or state.disaggregation_mode == "decode"):
                        state.publish_gauges(admitting=1, priority=priority)
                try:
                    done_passes = verify_passes = 0
                    first_pass = True
                    while len(ids) < max_new:
                        with state.lock:
                            step = delay * (1.0 + state.batch_slowdown * max(state.running - 1, 0))
                            # One forward pass: 1 token, or the accepted drafts plus one with speculation
                            # (a fractional acceptance length is the mean over this request's passes).
                            accept = max(1.0, float(state.spec_accept_length or 1))
                        time.sleep(step)
                        done_passes += 1
                        per_pass = int(done_passes * accept + 1e-9) - int((done_passes - 1) * accept + 1e-9)
                        new = min(per_pass, max_new - len(ids))
                        for _ in range(new):
                            token = token_at(len(ids))
                            words.append(f"w{token}")
                            ids.append(token)
                        with state.lock:
                            state.token_times += [time.time()] * new
                            state.generated_total += new
                            state.running_tokens += new
                            # The first token comes from the prefill pass (here or, in PD, on the
                            # prefill server): 0.5.23 counts decode tokens only in decode passes.
                            prefill_pass = first_pass and not state.kv_transfer_ms
                            state.count_decode(new - (1 if prefill_pass else 0))
                            if not prefill_pass:
                                state.passes += 1.0 / max(state.running, 1)  # this request's share of the pass
                                verify_passes += 1
                            first_pass = False
                        times.append(time.time())
                        emit(ids, words)
                finally:
                    with state.lock:  # the tokenizer's counters grow when a request finishes
                        state.serving.finished(started, times, prompt_tokens, cached, state.kv_transfer_ms)
                        state.finished += 1
                        if state.spec_accept_length:  # counted when the request finishes, as 0.5.23 does
                            state.spec_verify_total += verify_passes
                        state.prompt_by_priority[priority] = state.prompt_by_priority.get(priority, 0) + prompt_tokens
                        state.generated_by_priority[priority] = state.generated_by_priority.get(priority, 0) + len(ids)
                        state.enter("running", priority, -1)
                        state.running_tokens -= prompt_tokens + len(ids)
            finally:
                if slots is not None:
                    slots.release()

        def _transfer(self, max_new: int, priority, words, ids, token_at, emit):
            """``--kv-transfer-ms``: a PD decode server as the client meets it: the prefill server's first
            token arrives, then the KV moves for that long; the request is neither running nor queued on
            this server meanwhile (SGLang keeps it in its transfer queue)."""
            token = token_at(0)
            words.append(f"w{token}")
            ids.append(token)
            with state.lock:
                state.enter("queued", priority, -1)
                state.token_times.append(time.time())
                state.generated_total += 1
            emit(ids, words)
            time.sleep(state.kv_transfer_ms / 1000.0)

    return Handler


class StandInHTTPServer(ThreadingHTTPServer):
    """SGLang serves through uvicorn, whose listen backlog is 2048. socketserver's default of 5
    overflows when the client opens C connections at once while the accept loop is starved of CPU:
    the kernel drops the extra SYNs and those requests start ~1 s late (the SYN retransmit), so
    fewer than C decode together and an honest stand-in looks like a server that could not hold C."""

    request_queue_size = 2048


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", help="write the bound port here once listening")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--context-length", type=int, default=4096)
    parser.add_argument("--token-delay-ms", type=float, default=2.0)
    parser.add_argument("--error-every", type=int, default=0)
    parser.add_argument("--cached-tokens", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=200)
    parser.add_argument("--max-lifetime", type=float, default=900.0)
    parser.add_argument("--decode-cap", type=int, default=0, help="at most N requests decode at once (0: no cap)")
    parser.add_argument("--prefill-ms", type=float, default=0.0)
    parser.add_argument("--serial-prefill", action="store_true")
    parser.add_argument("--batch-slowdown", type=float, default=0.0)
    parser.add_argument("--omit", default="", help="comma-separated: cached_tokens,prompt_tokens,startup_time")
    parser.add_argument("--max-running-requests", type=int, default=256)
    parser.add_argument("--max-total-num-tokens", type=int, default=1_000_000)
    parser.add_argument("--no-profiler", action="store_true", help="/start_profile and /stop_profile are 404")
    parser.add_argument("--tp-size", type=int, default=4)
    parser.add_argument("--enable-priority-scheduling", action="store_true",
                        help="/metrics: a priority=\"\" total plus one series per priority (0.5.23's shape)")
    parser.add_argument("--enable-metrics-for-all-schedulers", action="store_true",
                        help="/metrics: one copy of each scheduler gauge per TP rank")
    parser.add_argument("--spec-accept-length", type=float, default=0.0,
                        help="speculative decoding: a forward pass emits this many tokens per request (the mean), "
                             "reported as sglang:spec_accept_length and avg_spec_accept_length")
    parser.add_argument("--served-model-path", default="",
                        help="/server_info names this model path and served name (another model served)")
    parser.add_argument("--gauge-refresh-passes", type=int, default=40,
                        help="publish the scheduler gauges every N decode passes (0.5.23's decode_log_interval), "
                             "on a prefill batch and when idle; 0: live")
    parser.add_argument("--decode-counter-scale", type=float, default=1.0,
                        help="fault: the decode token counter grows by this factor of the tokens emitted")
    parser.add_argument("--counter-reset-at", type=int, default=0,
                        help="fault: the scheduler's counters restart from 0 once the decode counter passes N "
                             "(/_test/config: once it grew by N from then)")
    parser.add_argument("--kv-transfer-ms", type=float, default=0.0,
                        help="PD decode: the first token comes at once (the prefill server's), then the KV "
                             "transfer takes this long before the request runs here")
    parser.add_argument("--serving-metrics", action="store_true",
                        help="/metrics also has 0.5.23's latency histograms, cache hit rate, SWA use and PD transfer "
                             "series (off by default: the bench tests scrape every 20 ms on a shared CI machine)")
    parser.add_argument("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"],
                        help="prefill: /metrics also has the KV transfer latency histogram, one transfer per request")
    parser.add_argument("--prefill-peer-port", type=int, default=0,
                        help="PD: send every streamed /generate to the prefill server on this port first, as "
                             "sglang-router does (this server then stands in for router and decode)")
    parser.add_argument("--api-key-file", default="", help="the key every route but /health*, /metrics needs")
    parser.add_argument("--served-model-name", default="",
                        help="the name /v1/models lists (SGLang's --served-model-name; default: the model path)")
    args = parser.parse_args(argv)

    from fake_profiler import FakeProfiler
    from standin_http import serve

    state = State(args)
    state.profiler = FakeProfiler(state, enabled=not args.no_profiler)
    return serve(make_handler(state), port=args.port, port_file=args.port_file, max_lifetime=args.max_lifetime,
                 server_class=StandInHTTPServer)

if __name__ == "__main__":
    raise SystemExit(main())
