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

The headline is the server's own account, not the client's: ``occupancy`` below. The decode
server's ``/metrics`` is scraped on the box during the point (``dsv4box run-point``); from
the client's "Starting main benchmark run" line plus the 1 s pause to the client's exit, each
scrape of the decode server is at **exact occupancy** when it runs exactly C requests
(``num_running_reqs``), queues none (``num_queue_reqs``), computed no prompt tokens since the
previous scrape (``realtime_tokens_total{mode="prefill_compute"}``) and finished no request since
then (``num_requests_total``), and its running gauge is known to be current: since the last scrape
that saw a request finish, either the gauge has changed in a later scrape, or the forward-pass
counter had moved at least ``GAUGE_REFRESH_PASSES`` passes by the scrape before. SGLang rewrites
its running gauge only every that many decode passes (and on a prefill batch), so after a finish
the gauge can go on saying C while C - 1 run until the next rewrite, and a pair of scrapes in that
time would look exact. An **admissible window** is a stretch of consecutive scrapes, from
one exact scrape to another, of which at least ``min_exact_share`` are exact, and at least
``min_window_scrapes`` long. The longest one is the point's window; ``decode_tok_s`` is the decode
server's generated tokens (``realtime_tokens_total{mode="decode"}``) over the time between
consecutive exact scrapes in it, and ``forward_passes_per_s`` its forward passes
(``cuda_graph_passes_total``) likewise. No admissible window: no headline, and ``occupancy`` says
what the server ran instead. In PD only the decode server's scrapes count, so a KV transfer is
never decode time (the request is not running on the decode server while its KV arrives).
The client-side rate above is kept beside it as ``client_decode_tok_s``.
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from typing import Optional, Sequence

from dsv4kit.records.record import decode_info

#: The client sleeps this long after the flush, before the measured run (serving.py).
CLIENT_PAUSE_S = 1.0
#: Fewer /metrics samples than this in the window is no evidence.
MIN_SAMPLES = 2
#: The least share of the point's decode phase spent at exact occupancy (GateConfig.min_window_share).
MIN_WINDOW_SHARE = 0.5
#: SGLang 0.5.23 rewrites its running/queued gauges every ``decode_log_interval`` decode passes
#: (default 40; a server_info that gives another value is followed).
GAUGE_REFRESH_PASSES = 40
#: An inadmissible point names the remedies for the gauge's wait when at least this share of its
#: scrapes were exactly C but waited for a rewrite after a finish.
GAUGE_WAIT_HINT_SHARE = 0.1


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


def _exact(prev: dict, cur: dict, concurrency: int) -> tuple[bool, Optional[str]]:
    """Whether scrape ``cur`` is at exact occupancy (module doc); else what was off, in words."""
    running, queued = cur.get("num_running_reqs"), cur.get("num_queue_reqs")
    if running is None or queued is None:
        return False, "no running/queued count"
    if running != concurrency or queued:
        return False, None
    for name, what in (("prefill_tokens_total", "prompt tokens computed"), ("num_requests_total", "a request finished")):
        a, b = prev.get(name), cur.get(name)
        if a is None or b is None:
            return False, f"no {name} counter"
        if b != a:
            return False, None
    if cur.get("decode_tokens_total") is None or prev.get("decode_tokens_total") is None:
        return False, "no decode_tokens_total counter"
    return True, None


def _segments(samples: list, t0: float) -> list:
    """The running/queued counts over time, run-length encoded: ``[start_s, running, queued, scrapes]``."""
    out: list = []
    for s in samples:
        state = (s.get("num_running_reqs"), s.get("num_queue_reqs"))
        if out and (out[-1][1], out[-1][2]) == state:
            out[-1][3] += 1
        else:
            out.append([round(s["t"] - t0, 3), state[0], state[1], 1])
    return out


def _best_window(exact: list, min_share: float) -> Optional[tuple[int, int]]:
    """(i, j) of the longest stretch ``exact[i..j]`` that starts and ends exact and has at least
    ``min_share`` exact entries; None when no entry is exact."""
    runs, start = [], None
    for k, ok in enumerate(exact + [False]):
        if ok and start is None:
            start = k
        elif not ok and start is not None:
            runs.append((start, k - 1))
            start = None
    prefix = [0]
    for ok in exact:
        prefix.append(prefix[-1] + (1 if ok else 0))
    best = None
    for a in range(len(runs)):
        for b in range(len(runs) - 1, a - 1, -1):
            i, j = runs[a][0], runs[b][1]
            if best is not None and j - i <= best[1] - best[0]:
                break
            if prefix[j + 1] - prefix[i] >= min_share * (j - i + 1):
                best = (i, j)
                break
    return best


def decode_phase(samples: list) -> Optional[tuple]:
    """(first, last) index of the scrapes that bound the decode phase: from the scrape before the
    decode counter first grew to the last scrape at which it grew; None when it never grew."""
    grew = [k for k in range(1, len(samples))
            if None not in (samples[k].get("decode_tokens_total"), samples[k - 1].get("decode_tokens_total"))
            and samples[k]["decode_tokens_total"] > samples[k - 1]["decode_tokens_total"]]
    return (grew[0] - 1, grew[-1]) if grew else None


def exact_occupancy(samples: list, concurrency: int, min_share: float, min_scrapes: int,
                    min_window_share: float = MIN_WINDOW_SHARE, refresh_passes: float = GAUGE_REFRESH_PASSES) -> dict:
    """The ``occupancy`` block: the decode server's scrapes of the measured run (time order) judged
    by the module doc's rule. ``admissible`` says whether a window qualified; ``decode_tok_s``,
    ``forward_passes_per_s`` and ``acceptance_length`` come from it; ``detail`` says in words what
    the server did."""
    out: dict = {"rule": {"concurrency": concurrency, "min_exact_share": min_share, "min_window_scrapes": min_scrapes,
                          "min_window_share": min_window_share, "gauge_refresh_passes": refresh_passes},
                 "scrapes": len(samples), "admissible": False, "window_scrapes": 0, "exact_share": None,
                 "decode_tok_s": None, "forward_passes_per_s": None, "acceptance_length": None,
                 "tokens_per_pass_per_request": None, "foreign_scrapes": 0, "foreign_max": 0,
                 "gauge_wait_scrapes": 0}
    if len(samples) < 2:
        out["detail"] = f"{len(samples)} scrape(s) of the decode server in the measured run: no evidence"
        return out
    t0 = samples[0]["t"]
    flags, missing = [False], set()
    # The pass counter at the last scrape that saw a request finish, and whether the running gauge
    # has changed in a later scrape (a rewrite after the finish: it is current again).
    finished_at, rewritten = None, False
    for prev, cur in zip(samples, samples[1:]):
        ok, why = _exact(prev, cur, concurrency)
        if None not in (prev.get("num_requests_total"), cur.get("num_requests_total")) \
                and cur["num_requests_total"] != prev["num_requests_total"]:
            finished_at = cur.get("decode_passes_total")
            finished_at, rewritten = (math.nan if finished_at is None else finished_at), False
        else:
            if ok and finished_at is not None and not rewritten:
                passes = prev.get("decode_passes_total")
                if passes is None or math.isnan(finished_at):
                    ok, why = False, "no decode_passes_total counter"
                elif passes - finished_at < refresh_passes:
                    ok = False  # the running gauge may not have been rewritten since that finish
                    out["gauge_wait_scrapes"] += 1
            rewritten = rewritten or cur.get("num_running_reqs") != prev.get("num_running_reqs")
        flags.append(ok)
        if why and why.startswith("no "):
            missing.add(why)
    load = [(s.get("num_running_reqs") or 0) + (s.get("num_queue_reqs") or 0) for s in samples]
    foreign = [x - concurrency for x in load if x > concurrency]
    out.update(foreign_scrapes=len(foreign), foreign_max=max(foreign, default=0),
               timeline=_segments(samples, t0)[:200])
    best = _best_window(flags, min_share)
    if best is not None:
        i, j = best
        n_exact = sum(flags[i:j + 1])
        out.update(window_scrapes=j - i + 1, exact_scrapes=n_exact, exact_share=round(n_exact / (j - i + 1), 4),
                   window_s=[round(samples[i]["t"] - t0, 3), round(samples[j]["t"] - t0, 3)],
                   window_wall=[samples[i].get("wall"), samples[j].get("wall")])
        pairs = [(samples[k - 1], samples[k]) for k in range(i + 1, j + 1) if flags[k] and flags[k - 1]]
        seconds = sum(b["t"] - a["t"] for a, b in pairs)
        tokens = sum(b["decode_tokens_total"] - a["decode_tokens_total"] for a, b in pairs)
        have_passes = all(a.get("decode_passes_total") is not None and b.get("decode_passes_total") is not None
                          for a, b in pairs)
        passes = sum(b["decode_passes_total"] - a["decode_passes_total"] for a, b in pairs) if have_passes else None
        accept = [samples[k]["spec_accept_length"] for k in range(i, j + 1)
                  if flags[k] and samples[k].get("spec_accept_length")]
        out.update(decode_seconds=round(seconds, 4), decode_tokens=tokens, forward_passes=passes)
        if seconds > 0:
            out["decode_tok_s"] = tokens / seconds
            out["forward_passes_per_s"] = passes / seconds if passes is not None else None
        if passes:
            out["tokens_per_pass_per_request"] = tokens / passes / concurrency
        out["acceptance_length"] = statistics.fmean(accept) if accept else None
        phase = decode_phase(samples)
        phase_s = samples[phase[1]]["t"] - samples[phase[0]]["t"] if phase else 0.0
        # the time between consecutive exact scrapes anywhere in the run (every wave of a
        # multi-wave point), over the decode phase
        exact_s = sum(samples[k]["t"] - samples[k - 1]["t"] for k in range(1, len(samples)) if flags[k] and flags[k - 1])
        out["decode_phase_s"] = round(phase_s, 4)
        out["window_share"] = round(exact_s / phase_s, 4) if phase_s > 0 else None
        out["admissible"] = (j - i + 1 >= min_scrapes and n_exact >= min_share * (j - i + 1) and seconds > 0
                             and out["window_share"] is not None and out["window_share"] >= min_window_share)
    out["detail"] = _occupancy_detail(out, samples, concurrency, missing)
    return out


def _occupancy_detail(out: dict, samples: list, concurrency: int, missing: set) -> str:
    rule = (f"exactly {concurrency} running, none queued, no prompt tokens computed and no request finished "
            f"between scrapes nor within {out['rule']['gauge_refresh_passes']:g} decode passes before unless the running "
            f"gauge changed since, in at least {100 * out['rule']['min_exact_share']:g}% of at least "
            f"{out['rule']['min_window_scrapes']} consecutive scrapes")
    rule += (f", with exact occupancy over at least {100 * out['rule']['min_window_share']:g}% of the decode phase")
    if out["admissible"]:
        return (f"admissible window: {out['window_scrapes']} scrapes ({100 * out['exact_share']:.1f}% at exact "
                f"occupancy) over {out['window_s'][1] - out['window_s'][0]:.2f} s of the decode server, "
                f"exact occupancy over {100 * out['window_share']:.0f}% of its {out['decode_phase_s']:.2f} s decode "
                f"phase ({rule})")
    running = [s.get("num_running_reqs") for s in samples if s.get("num_running_reqs") is not None]
    queued = [s.get("num_queue_reqs") for s in samples if s.get("num_queue_reqs") is not None]
    told = (f"no admissible window ({rule}): the longest stretch was {out['window_scrapes']} scrapes"
            + (f" ({100 * out['exact_share']:.1f}% exact)" if out["exact_share"] is not None else "")
            + (f", exact occupancy over {100 * out['window_share']:.0f}% of the {out['decode_phase_s']:.2f} s "
               f"decode phase"
               if out.get("window_share") is not None else "")
            + f" of {len(samples)}")
    if missing:
        told += "; the decode server's /metrics lacks " + ", ".join(sorted(m[3:] for m in missing))
    waited, refresh = out.get("gauge_wait_scrapes") or 0, out["rule"]["gauge_refresh_passes"]
    if waited >= GAUGE_WAIT_HINT_SHARE * len(samples):
        told += (f"; {waited} scrape(s) of exactly C={concurrency} waited for the running gauge's rewrite after "
                 f"a request finished (every {refresh:g} decode passes): outputs several times {refresh:g} "
                 f"tokens long (--output-len), or a server launched with a smaller --decode-log-interval, "
                 f"leave more of each wave exact")
    if running:
        told += (f"; the server ran {min(running):g} to {max(running):g} requests (median "
                 f"{statistics.median(running):g}) for C={concurrency}")
    if queued:
        told += f" and queued up to {max(queued):g}"
    if out["foreign_scrapes"]:
        told += (f"; foreign load: in {out['foreign_scrapes']} scrape(s) the server held up to "
                 f"{out['foreign_max']:g} request(s) more than the bench's C={concurrency} (another client)")
    segments = out.get("timeline") or []
    if segments:
        shown = ", ".join(f"{seg[0]:.2f}s: {seg[1]} running/{seg[2]} queued x{seg[3]}" for seg in segments[:8])
        told += f"; over time: {shown}" + (" ..." if len(segments) > 8 else "")
    return told


def analyze(line: dict, concurrency: int, evidence: Optional[dict], decode_port: Optional[int],
            gates=None) -> dict:
    """The ``window`` block of a point: the client-side window and rate, and the decode server's
    exact-occupancy window (``occupancy``), whose rate is the headline ``decode_tok_s``."""
    min_share = getattr(gates, "min_exact_share", 0.98)
    min_scrapes = getattr(gates, "min_window_scrapes", 20)
    ttfts = line.get("ttfts")
    itls = line.get("itls")
    out: dict = {"start_s": None, "end_s": None, "duration_s": None, "tokens": None, "decode_tok_s": None,
                 "client_decode_tok_s": None, "window_tok_s": None, "decoding_s": None,
                 "run_duration_s": None, "samples": 0, "running": None, "queue": None, "token_usage_max": None,
                 "server_gen_throughput_mean": None, "occupancy": None, "evidence": None}
    if ttfts is None or itls is None:
        out["evidence"] = "the client line has no per-request TTFTs/ITLs (run with --output-details)"
        return out
    states = decode_info(line.get("server_info") or {}).get("internal_states") or []
    accepts = [st.get("avg_spec_accept_length") for st in states if isinstance(st, dict)
               and isinstance(st.get("avg_spec_accept_length"), (int, float))]
    out["server_info_accept_length"] = statistics.fmean(accepts) if accepts else None
    requests = token_timeline(ttfts, itls, concurrency, line.get("output_lens"))
    out["run_duration_s"] = max((r["finish"] for r in requests), default=0.0)
    window = steady_window(requests, concurrency)
    if window is not None:
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
                   decode_intervals=len(intervals),
                   client_decode_tok_s=decode_tokens / decoding if decoding > 0 else None,
                   decoding_fraction=round(decoding / (b - a), 4))
        if decoding <= 0:
            out["decode_evidence"] = (prefill_ramp(requests, concurrency)
                                      or f"the client never had all {concurrency} requests decoding at once")
    if not evidence:
        out["evidence"] = "no /metrics evidence was collected for this point"
        return out
    marker = evidence.get("main_run_marker_time")
    if marker is None:
        out["evidence"] = "the client's 'Starting main benchmark run' line was not seen, so the run cannot be placed"
        return out
    anchor = marker + CLIENT_PAUSE_S
    wall = evidence.get("main_run_marker_wall")
    out["run_start_box_clock"] = round((wall if wall is not None else marker) + CLIENT_PAUSE_S, 4)
    out["clock"] = evidence.get("clock") or "wall"
    end = evidence.get("ended")
    placed = [s for s in evidence.get("samples") or ()
              if s.get("port") == decode_port and s["t"] >= anchor and (end is None or s["t"] <= end)]
    samples = [s for s in placed if s.get("num_running_reqs") is not None]
    out["samples"] = len(samples)
    problems = sorted({p for s in placed for k, p in (s.get("problems") or {}).items()
                       if k in ("num_running_reqs", "num_queue_reqs", "realtime_tokens_total",
                                "prefill_tokens_total", "decode_tokens_total", "num_requests_total")})
    if problems:
        out["metrics_problem"] = problems[0]
    if len(samples) < MIN_SAMPLES:
        errors = (evidence.get("scrape_errors") or {}).get(str(decode_port))
        out["evidence"] = ((f"{problems[0]}; " if problems else "")
                           + f"{len(samples)} usable /metrics sample(s) of the decode server in the measured run "
                           f"(need {MIN_SAMPLES})" + (f"; scrape errors: {errors['count']}x {errors['first']}"
                                                      if errors else ""))
        return out
    refresh = decode_info(line.get("server_info") or {}).get("decode_log_interval")
    occupancy = exact_occupancy(samples, concurrency, min_share, min_scrapes,
                                getattr(gates, "min_window_share", MIN_WINDOW_SHARE),
                                refresh if isinstance(refresh, (int, float)) and refresh > 0 else GAUGE_REFRESH_PASSES)
    if problems:
        occupancy["detail"] = f"{problems[0]}; {occupancy['detail']}"
    out["occupancy"] = occupancy
    out["decode_tok_s"] = occupancy["decode_tok_s"] if occupancy["admissible"] else None
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
