"""The steady-state window of one bench point, and what the server did in it.

The client runs a closed loop: ``--max-concurrency C`` is a FIFO semaphore, so request ``i``
starts when the earliest of the ``C`` running requests finishes. From the per-request TTFTs and
inter-token gaps the client stores (``--output-details``) the timeline of every token is
rebuilt exactly, relative to the start of the measured run:

- window start ``a``: the last first-token time of the first wave (all ``C`` requests decoding);
- window end ``b``: the first finish after the last request was dispatched (the load drops
  below ``C`` there, the tail begins);
- ``window_tok_s`` = output tokens delivered in ``(a, b]`` / ``(b - a)``: what the server
  delivered while the load held (prefills of newcomers included);
- ``decode_tok_s`` (the headline) = tokens delivered while all ``C`` requests were past their
  first token and unfinished (``full_decode_intervals``) / the length of those stretches: the
  server decoding C requests, without the next prompts' prefill (at C=1 it is 1000 / TPOT).
  Tokens are counted from what the chunks held (``completion_tokens``), not one per chunk.
  NOT ``C x 1000 / median TPOT`` (which assumes ``C`` requests decode together; kept as
  ``tpot_formula_tok_s`` for reference only).

The server's own account comes from ``/metrics`` samples scraped on the box during the point
(``box_helper.py run-point``). The window is placed on the box's monotonic clock (a step of the
wall clock moves nothing) at the client's
"Starting main benchmark run" line plus the 1 s pause the client sleeps after the flush, and
shrunk by ``EDGE_TRIM`` of its length at each end to absorb that placement's error. In it the
decode server's ``sglang:num_running_reqs`` must have held ``>= ratio x C`` (median of samples).
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from typing import Optional, Sequence

#: The client sleeps this long after the flush, before the measured run (serving.py).
CLIENT_PAUSE_S = 1.0
#: Fraction of the window left out at each end when picking /metrics samples.
EDGE_TRIM = 0.1
#: Fewer /metrics samples than this in the window is no evidence.
MIN_SAMPLES = 2


def token_timeline(ttfts: Sequence[float], itls: Sequence[Sequence[float]], concurrency: int,
                   output_lens: Optional[Sequence[int]] = None) -> list[dict]:
    """Per request (in dispatch order): ``start``, ``tokens`` (times of each output chunk),
    ``counts`` (tokens in each chunk), ``first`` (first-token time or None) and ``finish``.

    The client spreads a multi-token decode chunk over its tokens (one ITL entry per token) but
    counts the first chunk once, whatever it holds; the server's ``completion_tokens``
    (``output_lens``) minus the ITL entries is what the first chunk really carried."""
    free = [0.0] * max(1, min(concurrency, len(ttfts)) or 1)
    heapq.heapify(free)
    requests = []
    for i, (ttft, gaps) in enumerate(zip(ttfts, itls)):
        start = heapq.heappop(free)
        tokens, counts = [], []
        if ttft and ttft > 0:
            t = start + ttft
            tokens.append(t)
            total = output_lens[i] if output_lens is not None and i < len(output_lens) else None
            counts.append(max(1, (total or 0) - len(gaps or ())) if total else 1)
            for gap in gaps or ():
                t += gap
                tokens.append(t)
                counts.append(1)
        finish = tokens[-1] if tokens else start
        requests.append({"start": start, "tokens": tokens, "counts": counts,
                         "first": tokens[0] if tokens else None, "finish": finish})
        heapq.heappush(free, finish)
    return requests


def full_decode_intervals(requests: list[dict], concurrency: int) -> list[tuple[float, float]]:
    """The stretches of time in which ``concurrency`` requests were all past their first token and
    not finished: the server was decoding all C of them (no prefill of a newcomer in between)."""
    events = []
    for r in requests:
        if r["first"] is not None and r["finish"] > r["first"]:
            events += [(r["first"], 1), (r["finish"], -1)]
    events.sort(key=lambda e: (e[0], e[1]))  # a finish before a first token at the same instant
    active, since, out = 0, None, []
    for t, step in events:
        before = active
        active += step
        if before < concurrency <= active:
            since = t
        elif active < concurrency <= before and since is not None:
            if t > since:
                out.append((since, t))
            since = None
    return out


def prefill_ramp(requests: list[dict], concurrency: int) -> Optional[str]:
    """Why C requests never decoded together, when the first of the first wave finished before the
    last of them got its first token: C prompts' prefill (or a wait for a decode slot) took longer
    than one request's decode. Names the ``--output-len`` that would outlast that ramp. None when
    that is not what happened."""
    wave = [r for r in requests[:concurrency] if r["first"] is not None]
    if concurrency < 2 or len(wave) < concurrency:
        return None
    last_first = max(r["first"] for r in wave)
    done = min(wave, key=lambda r: r["finish"])
    decode_s, ramp_s, tokens = done["finish"] - done["first"], last_first - done["first"], sum(done["counts"])
    if done["finish"] > last_first or decode_s <= 0 or tokens < 2:
        return None
    # Decode time grows about linearly with the output length; 25% margin for the next wave's prefills.
    need = math.ceil(tokens * 1.25 * ramp_s / decode_s)
    return (f"the client never had all {concurrency} requests decoding at once: the last of the first "
            f"{concurrency} got its first token {ramp_s:.2f} s after the first did, and the first had decoded "
            f"its {tokens} tokens in {decode_s:.2f} s and finished before that. If the prompts' prefill is "
            f"what takes that long (long prompts, one prefill server), an --output-len of about {need} or "
            f"more, or a lower --concurrency, lets {concurrency} decode together; if the server holds fewer "
            f"than {concurrency} decoding at once (max_running_requests, the KV pool), the running batch "
            f"shows it")


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
                 "window_tok_s": None, "decoding_s": None,
                 "run_duration_s": None, "samples": 0, "running": None, "queue": None, "token_usage_max": None,
                 "server_gen_throughput_mean": None, "evidence": None}
    if ttfts is None or itls is None:
        out["evidence"] = "the client line has no per-request TTFTs/ITLs (run with --output-details)"
        return out
    requests = token_timeline(ttfts, itls, concurrency, line.get("output_lens"))
    out["run_duration_s"] = max((r["finish"] for r in requests), default=0.0)
    window = steady_window(requests, concurrency)
    if window is None:
        out["evidence"] = "no steady-state window: no request produced a token"
        return out
    a, b = window
    in_window = sum(n for r in requests for t, n in zip(r["tokens"], r["counts"]) if a < t <= b)
    intervals = full_decode_intervals(requests, concurrency)
    decoding = sum(e - s for s, e in intervals)
    starts = [s for s, _ in intervals]

    def decoding_all(t: float) -> bool:
        i = bisect.bisect_left(starts, t) - 1
        return i >= 0 and t <= intervals[i][1]

    decode_tokens = sum(n for r in requests for t, n in zip(r["tokens"], r["counts"]) if decoding_all(t))
    out.update(start_s=round(a, 4), end_s=round(b, 4), duration_s=round(b - a, 4), tokens=in_window,
               window_tok_s=in_window / (b - a), decoding_s=round(decoding, 4), decode_tokens=decode_tokens,
               decode_intervals=len(intervals), decode_tok_s=decode_tokens / decoding if decoding > 0 else None,
               decoding_fraction=round(decoding / (b - a), 4))
    if decoding <= 0:
        out["decode_evidence"] = (prefill_ramp(requests, concurrency)
                                  or f"the client never had all {concurrency} requests decoding at once")
    if not evidence:
        out["evidence"] = "no /metrics evidence was collected for this point"
        return out
    marker = evidence.get("main_run_marker_time")
    if marker is None:
        out["evidence"] = "the client's 'Starting main benchmark run' line was not seen, so the window cannot be placed"
        return out
    anchor = marker + CLIENT_PAUSE_S
    wall = evidence.get("main_run_marker_wall")
    out["run_start_box_clock"] = round((wall if wall is not None else marker) + CLIENT_PAUSE_S, 4)
    out["clock"] = evidence.get("clock") or "wall"
    trim = EDGE_TRIM * (b - a)
    lo, hi = anchor + a + trim, anchor + b - trim
    placed = [s for s in evidence.get("samples") or () if s.get("port") == decode_port and lo <= s["t"] <= hi]
    samples = [s for s in placed if s.get("num_running_reqs") is not None]
    out["samples"] = len(samples)
    out["placed_on_box_clock"] = [round(lo, 3), round(hi, 3)]
    problems = sorted({p for s in placed for k, p in (s.get("problems") or {}).items() if k == "num_running_reqs"})
    if problems:
        out["metrics_problem"] = problems[0]
    if len(samples) < MIN_SAMPLES:
        errors = (evidence.get("scrape_errors") or {}).get(str(decode_port))
        out["evidence"] = ((f"{problems[0]}; " if problems else "")
                           + f"{len(samples)} usable /metrics sample(s) of the decode server in the {b - a:.2f} s "
                           f"window (need {MIN_SAMPLES})" + (f"; scrape errors: {errors['count']}x {errors['first']}"
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
