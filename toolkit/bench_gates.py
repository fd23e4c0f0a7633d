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
``input_lens``       the server-reported prompt length of every request equals ISL.
``concurrency``      achieved concurrency (sum of latencies / duration) >= ``min_concurrency_ratio``
                     x the requested one: the load was actually applied.
``cold_cache``       prefix-cache hit rate <= ``max_cache_hit_pct`` (the cache was flushed).
``same_server``      ``server_info.startup_time`` is the one read before the sweep: no restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dsv4kit.records import decode_info


@dataclass(frozen=True)
class GateConfig:
    retok_tolerance: float = 0.05
    min_concurrency_ratio: float = 0.8
    max_cache_hit_pct: float = 1.0
    expect_cold: bool = True

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PointExpectation:
    num_prompts: int
    input_len: int
    output_len: int
    max_concurrency: int
    startup_time: Optional[float] = None


def _empty(error: Any) -> bool:
    return error in (None, "")


def evaluate(raw: dict, expected: PointExpectation, config: GateConfig = GateConfig()) -> dict:
    """Check one client result line (with ``--output-details``); return the ``validity`` block.

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

    input_lens = raw.get("input_lens")
    if input_lens is None:
        gate("input_lens", False, "no per-request input lengths in the client line")
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

    cache_pct = None
    report = raw.get("cache_report")
    if report is not None:
        cache_pct = float(report.get("cache_hit_rate_pct") or 0.0)
    elif raw.get("cached_tokens") is not None and sum(raw.get("input_lens") or []):
        cache_pct = 100.0 * sum(raw["cached_tokens"]) / sum(raw["input_lens"])
    if config.expect_cold:
        gate("cold_cache", cache_pct is not None and cache_pct <= config.max_cache_hit_pct,
             "no cache report in the client line (run with --cache-report)" if cache_pct is None
             else f"prefix-cache hit rate {cache_pct:.2f}% (maximum {config.max_cache_hit_pct:g}% when cold)")

    if expected.startup_time is not None:
        started = decode_info(raw.get("server_info") or {}).get("startup_time")
        gate("same_server", started == expected.startup_time,
             "server startup_time unchanged" if started == expected.startup_time
             else f"server startup_time changed ({expected.startup_time} -> {started}): it restarted mid-sweep")

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
