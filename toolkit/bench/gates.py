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
                     ``--api chat``: chat's own ``usage.prompt_tokens`` add up to exactly the decode
                     server's ``prompt_tokens_total`` growth (``conservation.prompt_tokens``), and none
                     is shorter than ISL less ``retok_tolerance`` (``dsv4kit.bench.api``).
``concurrency``      achieved concurrency (sum of latencies / duration) >= ``min_concurrency_ratio``
                     x the requested one: the client applied the load (queued requests count too).
``exact_occupancy`` the decode server's own scrapes hold an admissible window (``dsv4kit.bench.window``):
                     at least ``min_window_scrapes`` consecutive scrapes, at least ``min_exact_share`` of
                     them with exactly C running, none queued, no prompt tokens computed and no request
                     finished in between, and the running gauge current since the last finish (changed
                     since, or the server's decode_log_interval passes later, 40 by default); and exact occupancy over at least ``min_window_share`` of the
                     decode phase (all the run's exact stretches: every wave counts). The headline comes from that window only. None: the gate says
                     what the server ran instead (running and queued over time, foreign load).
                     A series that is missing or ambiguous (box.metrics.select_metric): fail.
``conservation``, ``counters_up``, ``no_foreign_requests``  the second sources over the whole run
                     (``dsv4kit.bench.conservation``): the decode server's counters against the
                     client's tokens, every counter only up, exactly the point's requests.
``served_model``     the decode server's ``/server_info`` ``model_path`` and ``served_model_name`` are the
                     record's model, and the weights manifest names the record's revision
                     (``dsv4kit.serving.served_model``).
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
    #: exact_occupancy: the least share of the decode phase (first to last growth of the decode
    #: counter) spent at exact occupancy, over all of the run's exact stretches.
    min_window_share: float = 0.5
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
    #: The record's model (``dsv4kit.serving.served_model.expected_model``); None: not checked.
    model: Optional[dict] = None
    #: The route measured (``dsv4kit.bench.api``): it decides what the prompt lengths must be.
    api: str = "generate"


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


@dataclass(frozen=True)
class GateInputs:
    """What every gate reads: the client's line, what was asked, the thresholds, the box's evidence
    and the window block."""
    raw: dict
    expected: PointExpectation
    config: GateConfig
    evidence: dict
    window: dict

    @property
    def meta_keys(self) -> Optional[set]:
        meta = self.evidence.get("meta_info") or {}
        return set(meta.get("keys") or ()) if meta.get("ok") else None

    @property
    def no_meta(self) -> str:
        meta = self.evidence.get("meta_info") or {}
        return ("no evidence of the server's meta_info fields (the probe request after the point "
                f"{'failed: ' + str(meta.get('error')) if meta else 'did not run'})")


#: A gate: its inputs -> (passed, detail), or None where it does not apply to this point.
Verdict = Optional[tuple]


def gate_completed(g: GateInputs) -> Verdict:
    n, completed = g.expected.num_prompts, g.raw.get("completed")
    return completed == n, f"completed {completed} of {n} requests"


def bad_errors(raw: dict) -> list:
    return [e for e in raw.get("errors") or [] if not _empty(e)]


def gate_no_errors(g: GateInputs) -> Verdict:
    if g.raw.get("errors") is None:
        return False, "the client line has no per-request details (run with --output-details)"
    bad = bad_errors(g.raw)
    first = (str(bad[0]).strip().splitlines() or [""])[-1][:200] if bad else ""
    return not bad, f"{len(bad)} request(s) reported an error" + (f"; first: {first}" if first else "")


def retok_ratio(raw: dict) -> Optional[float]:
    total_out = raw.get("total_output_tokens") or 0
    return ((raw.get("total_output_tokens_retokenized") or 0) / total_out) if total_out else None


def gate_output_tokens(g: GateInputs) -> Verdict:
    raw = g.raw
    total_out = raw.get("total_output_tokens") or 0
    retok = raw.get("total_output_tokens_retokenized") or 0
    ratio = retok_ratio(raw)
    texts = raw.get("generated_texts")
    output_lens = raw.get("output_lens") or []
    empty_texts = 0
    if texts is not None:
        empty_texts = sum(1 for text, length in zip(texts, output_lens) if length and not text)
    expected_total = g.expected.num_prompts * g.expected.output_len
    ok = (total_out == expected_total and ratio is not None and abs(ratio - 1.0) <= g.config.retok_tolerance
          and empty_texts == 0)
    detail = (f"output tokens {total_out} (expected {expected_total}), retokenized {retok}"
              + (f" (ratio {ratio:.3f}, tolerance ±{g.config.retok_tolerance:g})" if ratio is not None else ""))
    if empty_texts:
        detail += f"; {empty_texts} request(s) 'succeeded' with empty text (error chunk counted as success)"
    return ok, detail


def gate_ttft_positive(g: GateInputs) -> Verdict:
    ttfts = g.raw.get("ttfts")
    if ttfts is None:
        return False, "no per-request TTFTs in the client line (run with --output-details)"
    zero = sum(1 for t in ttfts if not (t is not None and t > 0))
    return (zero == 0 and len(ttfts) == g.expected.num_prompts,
            f"{zero} of {len(ttfts)} request(s) have TTFT <= 0" if zero else f"all {len(ttfts)} TTFTs > 0")


def gate_input_lens(g: GateInputs) -> Verdict:
    input_lens, meta_keys = g.raw.get("input_lens"), g.meta_keys
    if input_lens is None:
        return False, "no per-request input lengths in the client line"
    if g.expected.api == "chat":  # chat's own usage, held against the server's counter (not the /generate probe)
        source = (g.window.get("sources") or {}).get("prompt_tokens") or {
            "passed": False, "detail": "no second source for chat's prompt lengths was analysed"}
        if not source["passed"]:
            return False, source["detail"]
    elif meta_keys is None or "prompt_tokens" not in meta_keys:
        return False, (g.no_meta if meta_keys is None else "the server does not report meta_info.prompt_tokens: the "
                       "client's input lengths are the planned ones, not evidence")
    from dsv4kit.bench.api import input_lens_ok

    passed, detail = input_lens_ok(g.expected.api, input_lens, g.expected.input_len, g.config.retok_tolerance)
    return passed, (f"{detail}; {source['detail']}" if g.expected.api == "chat" and passed else detail)


def concurrency_ratio(raw: dict, expected: PointExpectation) -> Optional[float]:
    achieved = raw.get("concurrency")
    return (achieved / expected.max_concurrency) if (achieved is not None and expected.max_concurrency) else None


def gate_concurrency(g: GateInputs) -> Verdict:
    achieved, ratio = g.raw.get("concurrency"), concurrency_ratio(g.raw, g.expected)
    return (ratio is not None and ratio >= g.config.min_concurrency_ratio,
            f"achieved concurrency {achieved if achieved is None else round(achieved, 3)} of "
            f"{g.expected.max_concurrency} requested (ratio {'n/a' if ratio is None else f'{ratio:.3f}'}, "
            f"minimum {g.config.min_concurrency_ratio:g})")


def gate_exact_occupancy(g: GateInputs) -> Verdict:
    w = g.window
    occupancy = w.get("occupancy")
    if occupancy is None:
        return False, f"no evidence of what the decode server ran: {w.get('evidence') or 'no window was analysed'}"
    if w.get("parse_problem"):
        return False, w["parse_problem"]
    detail = occupancy.get("detail") or ""
    if not occupancy.get("admissible") and w.get("decode_evidence"):
        detail += f"; {w['decode_evidence']}"
    return bool(occupancy.get("admissible")), detail


def _source_gate(rule: str):
    def gate(g: GateInputs) -> Verdict:
        verdict = (g.window.get("sources") or {}).get(rule)
        if verdict is None:
            return False, "the point's second sources were not analysed (dsv4kit.bench.conservation)"
        return verdict["passed"], verdict["detail"]
    gate.__name__ = f"gate_{rule}"
    gate.__doc__ = f"``{rule}`` of ``dsv4kit.bench.conservation``: the counters over the run against the client."
    return gate


gate_conservation = _source_gate("conservation")
gate_counters_up = _source_gate("counters_up")
gate_no_foreign_requests = _source_gate("no_foreign_requests")


def gate_served_model(g: GateInputs) -> Verdict:
    if g.expected.model is None:
        return None
    from dsv4kit.serving.served_model import check as check_model

    return check_model(decode_info(g.raw.get("server_info") or {}), g.expected.model)


def gate_max_running(g: GateInputs) -> Verdict:
    limit, c = g.expected.max_running_requests, g.expected.max_concurrency
    return (limit is not None and c <= limit,
            "the decode server's /server_info has no max_running_requests" if limit is None
            else f"C={c}, max_running_requests {limit}")


def gate_kv_capacity(g: GateInputs) -> Verdict:
    e = g.expected
    need, capacity = e.max_concurrency * (e.input_len + e.output_len), e.max_total_num_tokens
    return (capacity is not None and need <= capacity,
            "the decode server's /server_info has no max_total_num_tokens" if capacity is None
            else f"C x (ISL + OSL) = {need} tokens, max_total_num_tokens {capacity}")


def cache_hit_pct(raw: dict) -> Optional[float]:
    report = raw.get("cache_report")
    if report is not None:
        return float(report.get("cache_hit_rate_pct") or 0.0)
    if raw.get("cached_tokens") is not None and sum(raw.get("input_lens") or []):
        return 100.0 * sum(raw["cached_tokens"]) / sum(raw["input_lens"])
    return None


def gate_cold_cache(g: GateInputs) -> Verdict:
    if not g.config.expect_cold:
        return None
    cache_pct, meta_keys = cache_hit_pct(g.raw), g.meta_keys
    if cache_pct is None:
        return False, "no cache report in the client line (run with --cache-report)"
    if meta_keys is None or "cached_tokens" not in meta_keys:
        return False, (g.no_meta if meta_keys is None else "the server does not report meta_info.cached_tokens: the "
                       "client's 0 is a default, not evidence of a cold cache")
    return (cache_pct <= g.config.max_cache_hit_pct,
            f"prefix-cache hit rate {cache_pct:.2f}% (maximum {g.config.max_cache_hit_pct:g}% when cold)")


def gate_same_server(g: GateInputs) -> Verdict:
    expected, problems = g.expected, []
    started = decode_info(g.raw.get("server_info") or {}).get("startup_time")
    if expected.startup_time is None or started is None:
        problems.append("the decode server reports no startup_time, so a restart cannot be ruled out")
    elif started != expected.startup_time:
        problems.append(f"the decode server's startup_time changed ({expected.startup_time} -> {started}): "
                        f"it restarted mid-sweep")
    if expected.prefill_port:
        after = (g.evidence.get("startup_after") or {}).get(str(expected.prefill_port)) or {}
        if expected.prefill_startup_time is None or after.get("startup_time") is None:
            problems.append("the prefill server reports no startup_time, so a restart cannot be ruled out")
        elif after["startup_time"] != expected.prefill_startup_time:
            problems.append(f"the prefill server's startup_time changed ({expected.prefill_startup_time} -> "
                            f"{after['startup_time']}): it restarted mid-sweep")
    return not problems, "; ".join(problems) or (
        "decode and prefill servers' startup_time unchanged" if expected.prefill_port else "server startup_time unchanged")


#: The gates in the order they are reported: name -> gate function.
GATES = {"completed": gate_completed, "no_errors": gate_no_errors, "output_tokens": gate_output_tokens,
         "ttft_positive": gate_ttft_positive, "input_lens": gate_input_lens, "concurrency": gate_concurrency,
         "exact_occupancy": gate_exact_occupancy, "conservation": gate_conservation,
         "counters_up": gate_counters_up, "no_foreign_requests": gate_no_foreign_requests,
         "served_model": gate_served_model,
         "max_running": gate_max_running, "kv_capacity": gate_kv_capacity, "cold_cache": gate_cold_cache,
         "same_server": gate_same_server}


def evaluate(raw: dict, expected: PointExpectation, config: GateConfig = GateConfig(),
             evidence: Optional[dict] = None, window: Optional[dict] = None) -> dict:
    """Check one client result line (with ``--output-details``); return the ``validity`` block.

    ``evidence``: what ``dsv4box run-point`` saw on the box (``meta_info`` fields, the
    servers' startup times after the point); ``window``: ``bench_window.analyze``'s block. Without
    them the gates that need them fail.

    ``{"passed": bool, "failed": [names], "gates": {name: {"passed": bool, "detail": str}},
    "retok_ratio", "achieved_concurrency_ratio", "cache_hit_pct", "errors"}``.
    """
    inputs = GateInputs(raw, expected, config, evidence or {}, window or {})
    gates: dict[str, dict] = {}
    for name, check in GATES.items():
        verdict = check(inputs)
        if verdict is not None:
            gates[name] = {"passed": bool(verdict[0]), "detail": verdict[1]}
    failed = [name for name, g in gates.items() if not g["passed"]]
    return {
        "passed": not failed,
        "failed": failed,
        "gates": gates,
        "retok_ratio": retok_ratio(raw),
        "achieved_concurrency_ratio": concurrency_ratio(raw, expected),
        "cache_hit_pct": cache_hit_pct(raw),
        "errors": len(bad_errors(raw)),
    }
