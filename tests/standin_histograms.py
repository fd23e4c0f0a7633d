"""The latency histograms and serving gauges SGLang 0.5.23 writes beside its scheduler gauges
(tests only; tests/fake_sglang_server.py publishes them). Names, label sets and default buckets
are 0.5.23's ``srt/observability/metrics_collector.py``:

* the tokenizer's ``sglang:time_to_first_token_seconds`` and ``sglang:e2e_request_latency_seconds``
  (labels ``model_name``, ``engine_type``, ``is_streaming``) and ``sglang:inter_token_latency_seconds``
  (``model_name``, ``engine_type``), observed when a request finishes;
* the scheduler's ``sglang:cache_hit_rate`` and ``sglang:swa_token_usage`` gauges, and in PD the
  prefill server's ``sglang:kv_transfer_latency_ms`` histogram (one observation per transfer) and
  the ``sglang:num_transfer_failed_reqs_total`` / ``sglang:num_bootstrap_failed_reqs_total``
  counters, which appear at their first event.
"""

from __future__ import annotations

import bisect

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
E2E_BUCKETS = TTFT_BUCKETS
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
KV_TRANSFER_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


class Histogram:
    def __init__(self, name: str, doc: str, buckets):
        self.name, self.doc, self.buckets = name, doc, tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, labels: str) -> list:
        out = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts):
            total += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{self.name}_bucket{{{labels},le="{le}"}} {float(total)}')
        out += [f"{self.name}_count{{{labels}}} {float(total)}", f"{self.name}_sum{{{labels}}} {self.sum}"]
        return out


class ServingMetrics:
    """What the stand-in adds to ``/metrics`` from the requests it served (call with its lock held)."""

    def __init__(self, disaggregation_mode: str = "null", publish: bool = True):
        self.mode, self.publish = disaggregation_mode, publish
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             E2E_BUCKETS)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.kv_transfer = Histogram("sglang:kv_transfer_latency_ms", "Histogram of KV cache transfer latency in ms.",
                                     KV_TRANSFER_BUCKETS)
        self.prompt_tokens = self.cached_tokens = 0
        self.transfer_failed = self.bootstrap_failed = 0

    def finished(self, started: float, token_times: list, prompt_tokens: int, cached: int,
                 kv_transfer_ms: float = 0.0) -> None:
        """One request done: its TTFT, end-to-end latency and gaps between tokens."""
        if token_times:
            self.ttft.observe(token_times[0] - started)
            self.e2e.observe(token_times[-1] - started)
            for a, b in zip(token_times, token_times[1:]):
                if b > a:
                    self.itl.observe(b - a)
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached
        if self.mode == "prefill":
            self.transferred(kv_transfer_ms or 3.0)

    def transferred(self, kv_transfer_ms: float) -> None:
        """A PD prefill server handed one request's KV cache to decode."""
        self.kv_transfer.observe(kv_transfer_ms)

    def configure(self, body: dict) -> None:
        """``/_test/config``: ``{"transfer_failed": N, "bootstrap_failed": N}`` more failures;
        ``{"serving_metrics": true}`` publishes these series from now (observed all along)."""
        if "serving_metrics" in body:
            self.publish = bool(body["serving_metrics"])
        self.transfer_failed += int(body.get("transfer_failed", 0))
        self.bootstrap_failed += int(body.get("bootstrap_failed", 0))

    def lines(self, model_path: str, scheduler_labels: str, startup_time: float, token_usage: float) -> list:
        if not self.publish:
            return []
        tokenizer = f'model_name="{model_path}",engine_type="unified"'
        streaming = tokenizer + ',is_streaming="true"'
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        out = ["# HELP sglang:cache_hit_rate The prefix cache hit rate.", "# TYPE sglang:cache_hit_rate gauge",
               f"sglang:cache_hit_rate{{{scheduler_labels}}} {float(hit)}",
               "# HELP sglang:swa_token_usage The token usage for SWA layers.", "# TYPE sglang:swa_token_usage gauge",
               f"sglang:swa_token_usage{{{scheduler_labels}}} {float(token_usage)}"]
        out += self.ttft.lines(streaming) + self.e2e.lines(streaming) + self.itl.lines(tokenizer)
        if self.mode == "prefill":
            out += self.kv_transfer.lines(scheduler_labels)
        for name, value, doc in (("num_transfer_failed_reqs", self.transfer_failed, "Number of transfer failed requests."),
                                 ("num_bootstrap_failed_reqs", self.bootstrap_failed, "Number of bootstrap failed requests.")):
            if value:
                out += [f"# HELP sglang:{name}_total {doc}", f"# TYPE sglang:{name}_total counter",
                        f"sglang:{name}_total{{{scheduler_labels}}} {float(value)}",
                        f"sglang:{name}_created{{{scheduler_labels}}} {startup_time}"]
        return out
