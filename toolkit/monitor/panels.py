"""The DeepSeek-V4 PD dashboard's panels: title, unit and PromQL queries, one place for the
dashboard generator and the tests that run every query against a real Prometheus.

Metric names: SGLang 0.5.23, sglang-router 0.3.2 and DCGM exporter 4.5.3-4.8.2 (docs/monitoring.md);
the labels box and role come from the scrape configuration the monitoring role writes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    kind: str = "timeseries"  # or "table" (text as labels)


def _q(metric: str, quantile: float, by: str = "box, role") -> str:
    return f"histogram_quantile({quantile}, sum by ({by}, le) (rate({metric}_bucket[5m])))"


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Serving (SGLang)", (
        Panel("TTFT quantiles", "s", tuple((_q("sglang:time_to_first_token_seconds", q), f"p{int(q * 100)} {{{{box}}}} {{{{role}}}}")
                                           for q in (0.5, 0.9, 0.99))),
        Panel("End-to-end latency quantiles", "s",
              tuple((_q("sglang:e2e_request_latency_seconds", q), f"p{int(q * 100)} {{{{box}}}} {{{{role}}}}")
                    for q in (0.5, 0.99))),
        Panel("Running and queued requests", "short",
              (("max by (box, role) (sglang:num_running_reqs)", "running {{box}} {{role}}"),
               ("max by (box, role) (sglang:num_queue_reqs)", "queued {{box}} {{role}}"))),
        Panel("Generation throughput", "tokens/s",
              (("sum by (box, role) (rate(sglang:generation_tokens_total[1m]))", "{{box}} {{role}}"),
               ("sum by (box, role) (sglang:gen_throughput)", "scheduler {{box}} {{role}}"))),
        Panel("Prefix cache hit rate", "percentunit", (("max by (box, role) (sglang:cache_hit_rate)", "{{box}} {{role}}"),)),
    )),
    ("Per role: KV cache and decode", (
        Panel("KV and SWA token use", "percentunit",
              (("max by (box, role) (sglang:token_usage)", "KV {{box}} {{role}}"),
               ("max by (box, role) (sglang:swa_token_usage)", "SWA {{box}} {{role}}"))),
        Panel("Retractions (KV exhausted)", "short",
              (("sum by (box, role) (increase(sglang:num_retracted_requests_total[5m]))", "{{box}} {{role}}"),)),
        Panel("Inter-token latency p99", "s",
              ((_q("sglang:inter_token_latency_seconds", 0.99), "p99 {{box}} {{role}}"),)),
    )),
    ("Speculative decoding, PD transfer, router", (
        Panel("Speculative acceptance length", "short",
              (("max by (box, role) (sglang:spec_accept_length)", "{{box}} {{role}}"),)),
        Panel("KV transfer latency p99", "ms", ((_q("sglang:kv_transfer_latency_ms", 0.99), "p99 {{box}} {{role}}"),)),
        Panel("PD transfer and bootstrap failures", "short",
              (("sum by (box, role) (increase(sglang:num_transfer_failed_reqs_total[5m]))", "transfer {{box}} {{role}}"),
               ("sum by (box, role) (increase(sglang:num_bootstrap_failed_reqs_total[5m]))", "bootstrap {{box}} {{role}}"))),
        Panel("Router requests and errors", "reqps",
              (("sum by (box) (rate(smg_http_requests_total[1m]))", "requests {{box}}"),
               ("sum by (box) (rate(smg_router_request_errors_total[5m]))", "errors {{box}}"))),
    )),
    ("GPUs (DCGM exporter 4.5.3-4.8.2)", (
        Panel("Power", "watt", (("DCGM_FI_DEV_POWER_USAGE", "{{box}} GPU {{gpu}}"),)),
        Panel("SM clock", "MHz", (("DCGM_FI_DEV_SM_CLOCK", "{{box}} GPU {{gpu}}"),)),
        Panel("Temperature", "celsius", (("DCGM_FI_DEV_GPU_TEMP", "{{box}} GPU {{gpu}}"),)),
        Panel("Throttled time (power, thermal)", "percentunit",
              (("rate(DCGM_FI_DEV_POWER_VIOLATION[5m]) / 1e9", "power {{box}} GPU {{gpu}}"),
               ("rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m]) / 1e9", "thermal {{box}} GPU {{gpu}}"))),
        Panel("Clock events", "short",
              (("sum by (box, gpu, clock_event) (increase(DCGM_EXP_CLOCK_EVENTS_COUNT[5m]))",
                "{{box}} GPU {{gpu}} {{clock_event}}"),)),
        Panel("Last Xid", "none", (("DCGM_FI_DEV_XID_ERRORS", "{{box}} GPU {{gpu}}"),)),
        Panel("PCIe replays", "short", (("increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m])", "{{box}} GPU {{gpu}}"),)),
    )),
    ("The box (node_exporter's textfile collector)", (
        Panel("Kernels serving (rollout status)", "none", (("dsv4kit_rollout_info", ""),), kind="table"),
        Panel("Latest validate / eval / bench record", "none", (("dsv4kit_record_info", ""),), kind="table"),
    )),
)


def all_panels() -> list[Panel]:
    return [panel for _, panels in ROWS for panel in panels]
