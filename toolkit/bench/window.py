"""The steady-state window of one bench point, and what the server did in it.

The client runs a closed loop: ``--max-concurrency C`` is a FIFO semaphore, so request ``i``
starts when the earliest of the ``C`` running requests finishes. From the per-request TTFTs and
inter-token gaps the client stores (``--output-details``) the timeline of every token is
rebuilt exactly, relative to the start of the measured run:

- window start ``a``: the last first-token time of the first wave (all ``C`` requests decoding);
- window end ``b``: the first finish after the last request was dispatched (the load drops
  below ``C`` there, the tail begins);
- ``decode_tok_s`` = output tokens delivered in ``(a, b]`` / ``(b - a)``: what the server
  delivered while the load held, NOT ``C x 1000 / median TPOT`` (which assumes ``C`` requests
  decode together, and is kept as ``tpot_formula_tok_s`` for reference only).

The server's own account comes from ``/metrics`` samples scraped on the box during the point
(``box_helper.py run-point``). The window is placed on the box's clock at the client's
"Starting main benchmark run" line plus the 1 s pause the client sleeps after the flush, and
shrunk by ``EDGE_TRIM`` of its length at each end to absorb that placement's error. In it the
decode server's ``sglang:num_running_reqs`` must have held ``>= ratio x C`` (median of samples).
"""

from __future__ import annotations

import heapq
import statistics
from typing import Optional, Sequence

#: The client sleeps this long after the flush, before the measured run (serving.py).
CLIENT_PAUSE_S = 1.0
#: Fraction of the window left out at each end when picking /metrics samples.
EDGE_TRIM = 0.1
#: Fewer /metrics samples than this in the window is no evidence.
MIN_SAMPLES = 2


def token_timeline(ttfts: Sequence[float], itls: Sequence[Sequence[float]], concurrency: int) -> list[dict]:
    """Per request (in dispatch order): ``start``, ``tokens`` (times of each output token), ``finish``."""
    free = [0.0] * max(1, min(concurrency, len(ttfts)) or 1)
    heapq.heapify(free)
    requests = []
    for ttft, gaps in zip(ttfts, itls):
        start = heapq.heappop(free)
        tokens = []
        if ttft and ttft > 0:
            t = start + ttft
            tokens.append(t)
            for gap in gaps or ():
                t += gap
                tokens.append(t)
        finish = tokens[-1] if tokens else start
        requests.append({"start": start, "tokens": tokens, "finish": finish})
        heapq.heappush(free, finish)
    return requests


def steady_window(requests: list[dict], concurrency: int) -> Optional[tuple[float, float]]:
    """``(a, b)`` of the module doc, relative to the start of the measured run; None if empty."""
    if not requests:
        return None
    first_wave = requests[:concurrency]
    firsts = [r["tokens"][0] for r in first_wave if r["tokens"]]
    if not firsts:
        return None
    last_start = max(r["start"] for r in requests)
    after = [r["finish"] for r in requests if r["finish"] > last_start]
    if not after:
        return None
    b = min(after)
    a = max(firsts)
    if b <= a:
        a = min(firsts)
    return (a, b) if b > a else None


def analyze(line: dict, concurrency: int, evidence: Optional[dict], decode_port: Optional[int]) -> dict:
    """The ``window`` block of a point: the client-side window and rate, and the server's samples in it."""
    ttfts = line.get("ttfts")
    itls = line.get("itls")
    out: dict = {"start_s": None, "end_s": None, "duration_s": None, "tokens": None, "decode_tok_s": None,
                 "run_duration_s": None, "samples": 0, "running": None, "queue": None, "token_usage_max": None,
                 "server_gen_throughput_mean": None, "evidence": None}
    if ttfts is None or itls is None:
        out["evidence"] = "the client line has no per-request TTFTs/ITLs (run with --output-details)"
        return out
    requests = token_timeline(ttfts, itls, concurrency)
    out["run_duration_s"] = max((r["finish"] for r in requests), default=0.0)
    window = steady_window(requests, concurrency)
    if window is None:
        out["evidence"] = "no steady-state window: no request produced a token"
        return out
    a, b = window
    tokens = sum(1 for r in requests for t in r["tokens"] if a < t <= b)
    out.update(start_s=round(a, 4), end_s=round(b, 4), duration_s=round(b - a, 4), tokens=tokens,
               decode_tok_s=tokens / (b - a))
    if not evidence:
        out["evidence"] = "no /metrics evidence was collected for this point"
        return out
    marker = evidence.get("main_run_marker_time")
    if marker is None:
        out["evidence"] = "the client's 'Starting main benchmark run' line was not seen, so the window cannot be placed"
        return out
    anchor = marker + CLIENT_PAUSE_S
    out["run_start_box_clock"] = round(anchor, 4)
    trim = EDGE_TRIM * (b - a)
    lo, hi = anchor + a + trim, anchor + b - trim
    samples = [s for s in evidence.get("samples") or () if s.get("port") == decode_port and lo <= s["t"] <= hi
               and s.get("num_running_reqs") is not None]
    out["samples"] = len(samples)
    out["placed_on_box_clock"] = [round(lo, 3), round(hi, 3)]
    if len(samples) < MIN_SAMPLES:
        errors = (evidence.get("scrape_errors") or {}).get(str(decode_port))
        out["evidence"] = (f"{len(samples)} /metrics sample(s) of the decode server in the {b - a:.2f} s window "
                           f"(need {MIN_SAMPLES})" + (f"; scrape errors: {errors['count']}x {errors['first']}"
                                                      if errors else ""))
        return out
    running = [s["num_running_reqs"] for s in samples]
    out["running"] = {"median": statistics.median(running), "min": min(running), "max": max(running),
                      "mean": statistics.fmean(running)}
    queue = [s["num_queue_reqs"] for s in samples if s.get("num_queue_reqs") is not None]
    out["queue"] = {"median": statistics.median(queue), "max": max(queue)} if queue else None
    usage = [s["token_usage"] for s in samples if s.get("token_usage") is not None]
    out["token_usage_max"] = max(usage) if usage else None
    gen = [s["gen_throughput"] for s in samples if s.get("gen_throughput") is not None]
    out["server_gen_throughput_mean"] = statistics.fmean(gen) if gen else None
    return out
