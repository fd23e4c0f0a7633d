"""Validity gates for one bench point (one ``sglang.benchmark.serving`` run).

A point that fails any gate is invalid: it is kept in the record for the evidence, marked
``validity.passed = false``, and left out of every summary statistic and comparison.

The gates and the trap each one catches (docs/benchmarking.md explains them):

``completed``        ``completed == num_prompts``: no request failed outright.
``no_errors``        every per-request ``errors`` entry is empty.
``output_tokens``    with ``ignore_eos`` every request returns exactly OSL tokens, so
                     ``total_output_tokens == num_prompts * OSL``; the client's retokenized count is
                     within ``retok_tolerance`` of it; and no successful request has empty text.
                     This is the error-chunk trap: SGLang streams a rejected request as HTTP 200 +
                     ``data: {"error": ...}``, and the native client counts it as a success with
                     ``output_len`` = the *requested* length, empty text and ``ttft = 0``.
``ttft_positive``    every per-request TTFT > 0 (the same trap, per request).
``input_lens``       the server-reported prompt length of every request equals ISL, and the server
                     does report ``prompt_tokens`` (else the client falls back to the planned length).
``concurrency``      achieved concurrency (sum of latencies / duration) >= ``min_concurrency_ratio``
                     x the requested one: the client applied the load (queued requests count too).
``exact_occupancy`` the decode server's own scrapes hold an admissible window (``dsv4kit.bench.window``):
                     at least ``min_window_scrapes`` consecutive scrapes, at least ``min_exact_share`` of
                     them with exactly C running, none queued, no prompt tokens computed and no request
                     finished in between. The headline comes from that window only. None: the gate says
                     what the server ran instead (running and queued over time, foreign load).
                     A series that is missing or ambiguous (box_helper.select_metric): fail.
``served_model``     the decode server's ``/server_info`` ``model_path`` and ``served_model_name`` are the
                     record's model, and the weights manifest names the record's revision
                     (``dsv4kit.bench.served_model``).
``idle``             (only on a point that did not run) the servers still ran or queued requests
                     after ``idle_timeout_s``: another client's load; the client was not started.
``max_running``      C <= the decode server's effective ``max_running_requests`` (``effective_max_running``).
``kv_capacity``      C x (ISL + OSL) <= the decode server's ``max_total_num_tokens``.
``cold_cache``       prefix-cache hit rate <= ``max_cache_hit_pct`` (the cache was flushed), and the
                     server does report ``cached_tokens`` (else the client's 0 is a default).
``same_server``      ``startup_time`` of the decode server, and of the prefill server in a PD layout,
                     is the one read before the sweep: no restart. A missing ``startup_time`` fails.

Every gate needs its evidence: a missing field or sample fails the gate, it never passes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dsv4kit.records.record import decode_info


@dataclass(frozen=True)
class GateConfig:
    retok_tolerance: float = 0.05
    min_concurrency_ratio: float = 0.8
    max_cache_hit_pct: float = 1.0
    expect_cold: bool = True
    #: exact_occupancy: the share of a window's scrapes at exact occupancy, and the fewest scrapes
    #: a window may have (docs/benchmarking.md gives their source).
    min_exact_share: float = 0.98
    min_window_scrapes: int = 20
    #: Seconds to wait for idle servers before each point (``idle`` gate).
    idle_timeout_s: float = 120.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PointExpectation:
    num_prompts: int
    input_len: int
    output_len: int
    max_concurrency: int
    #: The decode server's startup_time read before the sweep (None: it reported none).
    startup_time: Optional[float] = None
    #: A separate prefill server's port and its startup_time before the sweep (PD layout).
    prefill_port: Optional[int] = None
    prefill_startup_time: Optional[float] = None
    #: The decode server's limits, from /server_info before the sweep (None: not reported).
    max_running_requests: Optional[int] = None
    max_total_num_tokens: Optional[int] = None
    #: The record's model (``dsv4kit.bench.served_model.expected_model``); None: not checked.
    model: Optional[dict] = None


def effective_max_running(server_info: dict) -> Optional[int]:
    """How many requests the server really runs at once: the sum over DP ranks of
    ``internal_states[].effective_max_running_requests_per_dp`` (what the scheduler derived, also
    when ``--max-running-requests`` was not given), else the ``max_running_requests`` argument."""
    info = decode_info(server_info or {})
    per_dp = [s.get("effective_max_running_requests_per_dp") for s in info.get("internal_states") or []
              if isinstance(s, dict)]
    if per_dp and all(isinstance(v, int) for v in per_dp):
        return sum(per_dp)
    value = info.get("max_running_requests")
    return value if isinstance(value, int) else None


def _empty(error: Any) -> bool:
    return error in (None, "")


def evaluate(raw: dict, expected: PointExpectation, config: GateConfig = GateConfig(),
             evidence: Optional[dict] = None, window: Optional[dict] = None) -> dict:
    """Check one client result line (with ``--output-details``); return the ``validity`` block.

    ``evidence``: what ``box_helper.py run-point`` saw on the box (``meta_info`` fields, the
    servers' startup times after the point); ``window``: ``bench_window.analyze``'s block. Without
    them the gates that need them fail.

    ``{"passed": bool, "failed": [names], "gates": {name: {"passed": bool, "detail": str}},
    "retok_ratio", "achieved_concurrency_ratio", "cache_hit_pct", "errors"}``.
    """
    gates: dict[str, dict] = {}

    def gate(name: str, passed: bool, detail: str) -> None:
        gates[name] = {"passed": bool(passed), "detail": detail}

    n = expected.num_prompts
    completed = raw.get("completed")
    gate("completed", completed == n, f"completed {completed} of {n} requests")

    errors = raw.get("errors")
    if errors is None:
        gate("no_errors", False, "the client line has no per-request details (run with --output-details)")
        bad_errors = []
    else:
        bad_errors = [e for e in errors if not _empty(e)]
        first = (str(bad_errors[0]).strip().splitlines() or [""])[-1][:200] if bad_errors else ""
        gate("no_errors", not bad_errors,
             f"{len(bad_errors)} request(s) reported an error" + (f"; first: {first}" if first else ""))

    total_out = raw.get("total_output_tokens") or 0
    retok = raw.get("total_output_tokens_retokenized") or 0
    ratio = (retok / total_out) if total_out else None
    texts = raw.get("generated_texts")
    output_lens = raw.get("output_lens") or []
    empty_texts = 0
    if texts is not None:
        empty_texts = sum(1 for text, length in zip(texts, output_lens) if length and not text)
    expected_total = n * expected.output_len
    ok = (
        total_out == expected_total
        and ratio is not None
        and abs(ratio - 1.0) <= config.retok_tolerance
        and empty_texts == 0
    )
    detail = (
        f"output tokens {total_out} (expected {expected_total}), retokenized {retok}"
        + (f" (ratio {ratio:.3f}, tolerance ±{config.retok_tolerance:g})" if ratio is not None else "")
    )
    if empty_texts:
        detail += f"; {empty_texts} request(s) 'succeeded' with empty text (error chunk counted as success)"
    gate("output_tokens", ok, detail)

    ttfts = raw.get("ttfts")
    if ttfts is None:
        gate("ttft_positive", False, "no per-request TTFTs in the client line (run with --output-details)")
    else:
        zero = sum(1 for t in ttfts if not (t is not None and t > 0))
        gate("ttft_positive", zero == 0 and len(ttfts) == n,
             f"{zero} of {len(ttfts)} request(s) have TTFT <= 0" if zero else f"all {len(ttfts)} TTFTs > 0")

    meta = (evidence or {}).get("meta_info") or {}
    meta_keys = set(meta.get("keys") or ()) if meta.get("ok") else None
    no_meta = ("no evidence of the server's meta_info fields (the probe request after the point "
               f"{'failed: ' + str(meta.get('error')) if meta else 'did not run'})")
    input_lens = raw.get("input_lens")
    if input_lens is None:
        gate("input_lens", False, "no per-request input lengths in the client line")
    elif meta_keys is None or "prompt_tokens" not in meta_keys:
        gate("input_lens", False, no_meta if meta_keys is None else
             "the server does not report meta_info.prompt_tokens: the client's input lengths are the planned "
             "ones, not evidence")
    else:
        off = [x for x in input_lens if x != expected.input_len]
        gate("input_lens", not off,
             f"{len(off)} request(s) with prompt length != {expected.input_len} (e.g. {off[0]})" if off
             else f"all prompts {expected.input_len} tokens")

    achieved = raw.get("concurrency")
    conc_ratio = (achieved / expected.max_concurrency) if (achieved is not None and expected.max_concurrency) else None
    gate("concurrency", conc_ratio is not None and conc_ratio >= config.min_concurrency_ratio,
         f"achieved concurrency {achieved if achieved is None else round(achieved, 3)} of "
         f"{expected.max_concurrency} requested (ratio "
         f"{'n/a' if conc_ratio is None else f'{conc_ratio:.3f}'}, minimum {config.min_concurrency_ratio:g})")

    c = expected.max_concurrency
    w = window or {}
    occupancy = w.get("occupancy")
    if occupancy is None:
        gate("exact_occupancy", False, f"no evidence of what the decode server ran: "
                                       f"{w.get('evidence') or 'no window was analysed'}")
    elif w.get("parse_problem"):
        gate("exact_occupancy", False, w["parse_problem"])
    else:
        detail = occupancy.get("detail") or ""
        if not occupancy.get("admissible") and w.get("decode_evidence"):
            detail += f"; {w['decode_evidence']}"
        gate("exact_occupancy", bool(occupancy.get("admissible")), detail)
    if expected.model is not None:
        from dsv4kit.bench.served_model import check as check_model

        passed, detail = check_model(decode_info(raw.get("server_info") or {}), expected.model)
        gate("served_model", passed, detail)
    limit = expected.max_running_requests
    gate("max_running", limit is not None and c <= limit,
         "the decode server's /server_info has no max_running_requests" if limit is None
         else f"C={c}, max_running_requests {limit}")
    need = c * (expected.input_len + expected.output_len)
    capacity = expected.max_total_num_tokens
    gate("kv_capacity", capacity is not None and need <= capacity,
         "the decode server's /server_info has no max_total_num_tokens" if capacity is None
         else f"C x (ISL + OSL) = {need} tokens, max_total_num_tokens {capacity}")

    cache_pct = None
    report = raw.get("cache_report")
    if report is not None:
        cache_pct = float(report.get("cache_hit_rate_pct") or 0.0)
    elif raw.get("cached_tokens") is not None and sum(raw.get("input_lens") or []):
        cache_pct = 100.0 * sum(raw["cached_tokens"]) / sum(raw["input_lens"])
    if config.expect_cold:
        if cache_pct is None:
            gate("cold_cache", False, "no cache report in the client line (run with --cache-report)")
        elif meta_keys is None or "cached_tokens" not in meta_keys:
            gate("cold_cache", False, no_meta if meta_keys is None else
                 "the server does not report meta_info.cached_tokens: the client's 0 is a default, not evidence "
                 "of a cold cache")
        else:
            gate("cold_cache", cache_pct <= config.max_cache_hit_pct,
                 f"prefix-cache hit rate {cache_pct:.2f}% (maximum {config.max_cache_hit_pct:g}% when cold)")

    problems = []
    started = decode_info(raw.get("server_info") or {}).get("startup_time")
    if expected.startup_time is None or started is None:
        problems.append("the decode server reports no startup_time, so a restart cannot be ruled out")
    elif started != expected.startup_time:
        problems.append(f"the decode server's startup_time changed ({expected.startup_time} -> {started}): "
                        f"it restarted mid-sweep")
    if expected.prefill_port:
        after = ((evidence or {}).get("startup_after") or {}).get(str(expected.prefill_port)) or {}
        if expected.prefill_startup_time is None or after.get("startup_time") is None:
            problems.append("the prefill server reports no startup_time, so a restart cannot be ruled out")
        elif after["startup_time"] != expected.prefill_startup_time:
            problems.append(f"the prefill server's startup_time changed ({expected.prefill_startup_time} -> "
                            f"{after['startup_time']}): it restarted mid-sweep")
    gate("same_server", not problems, "; ".join(problems) or
         ("decode and prefill servers' startup_time unchanged" if expected.prefill_port
          else "server startup_time unchanged"))

    failed = [name for name, g in gates.items() if not g["passed"]]
    return {
        "passed": not failed,
        "failed": failed,
        "gates": gates,
        "retok_ratio": ratio,
        "achieved_concurrency_ratio": conc_ratio,
        "cache_hit_pct": cache_pct,
        "errors": len(bad_errors),
    }
