"""Latency percentiles with bootstrap intervals, and goodput under TTFT/TPOT limits, per point.

Computed from the per-request arrays the client stores (``--output-details``):

- TTFT per request; TPOT per request = sum of its inter-token gaps / (output tokens - 1).
- Percentiles p50/p90/p99 (linear interpolation, as numpy's default), each with a 95% bootstrap
  interval: ``BOOTSTRAP_RESAMPLES`` resamples of the requests with a fixed seed, so the same data
  always gives the same interval.
- A percentile needs enough requests for a distribution-free 95% bound: ``1 - p^n >= 0.95``, i.e.
  n >= 5 for p50, 29 for p90, 299 for p99. Below that the value is ``None`` with the reason,
  never a number (the client's own p99 stays in ``raw`` for reference).
- Goodput (MLPerf style) under the limits from the inventory (``dsv4_bench_slo_ttft_ms``,
  ``dsv4_bench_slo_tpot_ms``): requests per second whose own TTFT and TPOT are within the limits,
  the attainment (% of requests within both), and ``met``: p99 TTFT and p99 TPOT within the
  limits (``None`` when the p99 cannot be told from this many requests).
"""

from __future__ import annotations

import math
import random
from typing import Optional, Sequence

PERCENTILES = (50, 90, 99)
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 20260101
CONFIDENCE = 0.95


def min_requests(p: float) -> int:
    """Fewest requests for which the sample maximum bounds the p-th percentile with 95% confidence."""
    q = p / 100.0
    return math.ceil(math.log(1 - CONFIDENCE) / math.log(q))


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile of already sorted values."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    rank = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo))


def percentiles_with_ci(values: Sequence[float]) -> dict:
    """``{"p50": {"value", "ci95", "n"} | {"value": None, "reason"}, ...}`` in the values' unit."""
    data = sorted(float(v) for v in values)
    n = len(data)
    out = {}
    rng = random.Random(BOOTSTRAP_SEED)
    boots = [sorted(rng.choices(data, k=n)) for _ in range(BOOTSTRAP_RESAMPLES)] if n else []
    for p in PERCENTILES:
        need = min_requests(p)
        if n < need:
            out[f"p{p}"] = {"value": None, "n": n,
                            "reason": f"p{p} needs at least {need} requests for a 95% bound, this point had {n}"}
            continue
        estimates = sorted(percentile(b, p) for b in boots)
        lo = percentile(estimates, 100 * (1 - CONFIDENCE) / 2)
        hi = percentile(estimates, 100 * (1 + CONFIDENCE) / 2)
        out[f"p{p}"] = {"value": percentile(data, p), "ci95": [lo, hi], "n": n}
    return out


def per_request(line: dict) -> tuple[list[float], list[float]]:
    """(TTFT ms, TPOT ms) of each successful request with at least two output tokens."""
    ttfts, tpots = [], []
    errors = line.get("errors") or [""] * len(line.get("ttfts") or [])
    for ttft, gaps, out_len, error in zip(line.get("ttfts") or [], line.get("itls") or [],
                                          line.get("output_lens") or [], errors):
        if error or not ttft or ttft <= 0:
            continue
        ttfts.append(1000.0 * ttft)
        if out_len and out_len > 1 and gaps:
            tpots.append(1000.0 * math.fsum(gaps) / (out_len - 1))
    return ttfts, tpots


def latency_block(line: dict, slo: Optional[dict]) -> dict:
    """The point's ``latency`` block: percentiles with intervals, and goodput under ``slo``
    (``{"ttft_ms", "tpot_ms"}``, either may be None; None or empty: no goodput)."""
    ttfts, tpots = per_request(line)
    block = {"ttft_ms": percentiles_with_ci(ttfts), "tpot_ms": percentiles_with_ci(tpots),
             "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED, "unit": "requests"}}
    limits = {k: v for k, v in (slo or {}).items() if k in ("ttft_ms", "tpot_ms") and v is not None}
    if not limits:
        block["goodput"] = None
        return block
    duration = line.get("duration")
    good = 0
    total = len(line.get("ttfts") or [])
    errors = line.get("errors") or [""] * total
    for ttft, gaps, out_len, error in zip(line.get("ttfts") or [], line.get("itls") or [],
                                          line.get("output_lens") or [], errors):
        if error or not ttft or ttft <= 0:
            continue
        tpot = 1000.0 * math.fsum(gaps) / (out_len - 1) if out_len and out_len > 1 and gaps else None
        if "ttft_ms" in limits and 1000.0 * ttft > limits["ttft_ms"]:
            continue
        if "tpot_ms" in limits and (tpot is None or tpot > limits["tpot_ms"]):
            continue
        good += 1
    p99 = {"ttft_ms": block["ttft_ms"]["p99"]["value"], "tpot_ms": block["tpot_ms"]["p99"]["value"]}
    met: Optional[bool] = True
    for name, limit in limits.items():
        if p99[name] is None:
            met = None
            break
        met = met and p99[name] <= limit
    block["goodput"] = {
        "limits": limits,
        "good_requests": good,
        "requests": total,
        "attainment_pct": 100.0 * good / total if total else None,
        "goodput_req_s": good / duration if duration else None,
        "p99_within_limits": met,
        "p99_reason": None if met is not None else "too few requests to tell the p99 (see latency.*.p99.reason)",
    }
    return block
