"""The second sources of a bench point: what the servers' counters say over the whole run, held
against the client's own count (docs/benchmarking.md, "Two sources").

The run's edges are two scrapes of each serving port with no bench request in flight: the last
one before the measured run began (after the warm-up, before the client's first request) and the
one ``dsv4box run-point`` takes after the client exited. Between them, exactly the point's
requests ran, so every rule below is an equality or an exact bound, never a percentage:

``conservation``  on the decode server, ``generation_tokens_total`` (the tokenizer's count of the
                  completion tokens of finished requests) grew by exactly the output tokens the
                  client received, and the decode counter (``realtime_tokens_total{mode="decode"}``)
                  by exactly one token fewer per request (the first token comes from the prefill
                  pass). With speculative decoding the decode counter counts the accepted tokens of
                  each verify pass (the drafts accepted plus one), and a request's last pass may
                  accept drafts past its length: so the counter may exceed the client's count, by
                  at most D - 1 a request (D: ``speculative_num_draft_tokens`` of
                  ``/server_info``) and at most D x the verify passes the server reports
                  (``spec_verify_calls_total``) less the client's decode tokens. SGLang's
                  acceptance length over the run, accepted tokens over verify passes (how it
                  computes ``avg_spec_accept_length``), lies between 1 and D, and the verify passes
                  are no more than the decode tokens the client received (each pass gives a request
                  at least one). Inside the exact-occupancy window the decode tokens and the
                  forward passes agree: C tokens a pass without speculation, between C and C x D
                  with it, and the acceptance length the server reports lies between 1 and D.
``counters_up``   no counter of any serving port goes down between two scrapes of the run (a
                  reset, a restarted scheduler), and the run's decode growth and the headline rate
                  are above zero.
``no_foreign_requests``  the decode server's count of generation requests started
                  (``http_requests_total`` on the generation routes, counted as each request
                  arrives) and finished (``num_requests_total``) grew by exactly the point's
                  requests, a separate prefill server's started count by exactly them too (the
                  router sends every request to one prefill and one decode server), and no scrape
                  of the decode server shows more than C running and queued. Counters cannot miss
                  a request that came and went between two scrapes; the gauges can
                  (docs/sglang-contract.md gives their cadence).
``prompt_tokens`` (``--api chat`` only)  the prompt lengths chat's own answers reported
                  (``usage.prompt_tokens``, what the client keeps as ``input_lens``) add up to exactly
                  what the decode server's ``prompt_tokens_total`` counted. In SGLang 0.5.23 both
                  are the request's ``meta_info.prompt_tokens``: the chat route reports it as it is
                  for this model's encoding (only the ``kimi_k3`` encoding subtracts a stub), and the
                  tokenizer counts it when the request finishes. A chat answer without
                  ``usage.prompt_tokens`` leaves the client its planned lengths, which miss the
                  template's tokens: the sum then falls short.
"""

from __future__ import annotations

import math
from typing import Optional

from dsv4kit.serving.box.metrics import COUNTERS
from dsv4kit.bench.window import CLIENT_PAUSE_S


def run_edges(evidence: dict, port: int) -> tuple:
    """(the port's scrapes from the opening edge to the closing one, problem). The opening edge is
    the last scrape before the measured run began; the closing one the last scrape of all."""
    marker = evidence.get("main_run_marker_time")
    if marker is None:
        return [], "the client's 'Starting main benchmark run' line was not seen, so the run has no edges"
    anchor = marker + CLIENT_PAUSE_S
    mine = sorted((s for s in evidence.get("samples") or () if s.get("port") == port), key=lambda s: s["t"])
    before = [k for k, s in enumerate(mine) if s["t"] < anchor]
    if not before:
        return [], f"no scrape of port {port} before the measured run began: its opening edge is unknown"
    end = evidence.get("ended")
    run = [s for s in mine[before[-1]:] if end is None or s["t"] <= end]
    if len(run) < 2 or run[-1]["t"] < anchor:
        return [], f"no scrape of port {port} after the measured run: its closing edge is unknown"
    return run, None


def _growth(run: list, name: str) -> Optional[float]:
    a, b = run[0].get(name), run[-1].get(name)
    return None if a is None or b is None else b - a


def counters_up(runs: dict, decode_port: int, headline: Optional[float]) -> tuple:
    """(passed, detail): no counter goes down on any port; the decode growth and headline > 0."""
    problems = []
    for port, run in runs.items():
        t0 = run[0]["t"]
        for name in COUNTERS:
            prev = None
            for s in run:
                value = s.get(name)
                if value is None:
                    continue
                if prev is not None and value < prev[1]:
                    problems.append(f"port {port}: {name} went down from {prev[1]:g} to {value:g} between the "
                                    f"scrapes at +{prev[0] - t0:.2f} s and +{s['t'] - t0:.2f} s (a reset)")
                    break
                prev = (s["t"], value)
    decode = runs.get(decode_port)
    growth = _growth(decode, "decode_tokens_total") if decode else None
    if growth is not None and growth <= 0:
        problems.append(f"port {decode_port}: decode_tokens_total grew by {growth:g} over the run (from "
                        f"{decode[0]['decode_tokens_total']:g} to {decode[-1]['decode_tokens_total']:g}): a rate <= 0")
    if headline is not None and not headline > 0:
        problems.append(f"the headline decode rate is {headline:g} tok/s: a rate <= 0")
    if problems:
        return False, "; ".join(problems)
    return True, f"every counter of port(s) {', '.join(map(str, runs))} only grew over the run"


def no_foreign_requests(runs: dict, decode_port: int, num_prompts: int, concurrency: int) -> tuple:
    """(passed, detail): exactly the point's requests started on every port and finished on the
    decode server; no scrape of it shows more than C requests."""
    problems = []
    for port, run in runs.items():
        started = _growth(run, "requests_started_total")
        if started is None:
            problems.append(f"port {port} reports no sglang:http_requests_total on the generation routes, so a "
                            f"request that came and went between two scrapes cannot be ruled out")
        elif started != num_prompts:
            role = "" if port == decode_port else " (the prefill server, which the router sends every request to)"
            problems.append(f"port {port}{role}: {started:g} generation requests started over the run, the client "
                            f"sent {num_prompts}" + (" (another client's requests)" if started > num_prompts else ""))
    decode = runs.get(decode_port) or []
    finished = _growth(decode, "num_requests_total") if decode else None
    if finished is None:
        problems.append(f"port {decode_port} reports no sglang:num_requests_total")
    elif finished != num_prompts:
        problems.append(f"port {decode_port}: {finished:g} requests finished over the run, the client sent "
                        f"{num_prompts}")
    crowded = [s for s in decode[1:] if (s.get("num_running_reqs") or 0) + (s.get("num_queue_reqs") or 0) > concurrency]
    if crowded:
        worst = max(crowded, key=lambda s: s["num_running_reqs"] + (s.get("num_queue_reqs") or 0))
        problems.append(f"port {decode_port}: in {len(crowded)} scrape(s) the server held up to "
                        f"{worst['num_running_reqs']:g} running and {worst.get('num_queue_reqs') or 0:g} queued for "
                        f"C={concurrency}")
    if problems:
        return False, "; ".join(problems)
    return True, (f"exactly the {num_prompts} requests of the point started on port(s) {', '.join(map(str, runs))} "
                  f"and finished on {decode_port}; never more than C={concurrency} there")


def _speculative(server_info: dict, decode: list) -> tuple:
    """(speculative?, draft tokens per pass or None) from /server_info and the scrapes."""
    spec = bool(server_info.get("speculative_algorithm")) or any(s.get("spec_accept_length") for s in decode)
    drafts = server_info.get("speculative_num_draft_tokens")
    return spec, (int(drafts) if isinstance(drafts, (int, float)) and drafts >= 1 else None)


def _speculative_run(grown: float, received: int, expected_decode: int, requests: int, drafts: int,
                     verify: Optional[float]) -> list:
    """The decode counter of a speculative run against the client (module doc): its problems."""
    if verify is None:
        return ["speculative decoding, but the decode server reports no sglang:spec_verify_calls_total: the "
                "accepted drafts cannot be told apart, so the decode counter's excess cannot be bounded"]
    problems = []
    # Every pass but a request's last gives it all it accepted, and a pass accepts at most D: a
    # request's overshoot is at most D - 1, and at most D x its passes less the tokens it got.
    excess = grown - expected_decode
    allowed = max(0.0, min(requests * (drafts - 1), drafts * verify - expected_decode))
    if not 0 <= excess <= allowed:
        problems.append(f"the decode server's decode counter grew by {grown:g} in {verify:g} verify passes, the client "
                        f"received {received} output tokens of which {expected_decode} from decode passes: "
                        + (f"{-excess:g} fewer" if excess < 0 else
                           f"{excess:g} more, where at most {allowed:g} may be drafts accepted past a request's "
                           f"length ({verify:g} passes of at most {drafts} tokens, at most {drafts - 1} past a "
                           f"request)"))
    if not requests <= verify <= expected_decode:
        problems.append(f"{verify:g} verify passes for {requests} requests that received {expected_decode} tokens "
                        f"from decode (each request decodes in at least one pass, each pass gives it at least one)")
    elif verify and not 1 <= grown / verify <= drafts:
        problems.append(f"the acceptance length over the run, {grown:g} accepted tokens in {verify:g} verify passes "
                        f"= {grown / verify:.3f}, is not between 1 and {drafts}")
    return problems


def conservation(line: dict, runs: dict, decode_port: int, concurrency: int, server_info: dict,
                 occupancy: Optional[dict]) -> tuple:
    """(passed, detail): the decode server's counters against the client's count (module doc)."""
    decode = runs.get(decode_port)
    output_lens = line.get("output_lens")
    if not decode:
        return False, f"no run edges on the decode server (port {decode_port})"
    if output_lens is None:
        return False, "the client line has no per-request output lengths (run with --output-details)"
    received = sum(output_lens)
    expected_decode = sum(max(n - 1, 0) for n in output_lens)
    requests = sum(1 for n in output_lens if n > 1)  # that decoded: the first token is the prefill's
    problems = []
    generated = _growth(decode, "generation_tokens_total")
    if generated is None:
        problems.append("the decode server reports no sglang:generation_tokens_total")
    elif generated != received:
        problems.append(f"the decode server's generation_tokens_total grew by {generated:g}, the client received "
                        f"{received} output tokens")
    grown = _growth(decode, "decode_tokens_total")
    spec, drafts = _speculative(server_info, decode)
    if grown is None:
        problems.append("the decode server reports no realtime_tokens_total{mode=\"decode\"} counter")
    elif not spec and grown != expected_decode:
        problems.append(f"the decode server's decode counter grew by {grown:g}, the client received "
                        f"{received} output tokens of which {expected_decode} from decode passes")
    elif spec and drafts is None:
        problems.append("speculative decoding without speculative_num_draft_tokens in /server_info: the decode "
                        "counter's overshoot cannot be bounded")
    elif spec:
        problems += _speculative_run(grown, received, expected_decode, requests, drafts,
                                     _growth(decode, "spec_verify_calls_total"))
    if occupancy and occupancy.get("admissible"):
        tokens, passes = occupancy.get("decode_tokens"), occupancy.get("forward_passes")
        per_pass = drafts if spec and drafts else 1
        if passes is None:
            problems.append("the decode server reports no forward-pass counter (cuda_graph_passes_total)")
        elif spec and drafts and not (passes * concurrency * (1 - 1e-9) <= tokens
                                      <= passes * concurrency * per_pass * (1 + 1e-9)):
            problems.append(f"in the window the decode server made {tokens:g} tokens in {passes:g} forward passes at "
                            f"C={concurrency}: not between 1 and {per_pass} tokens a request a pass")
        elif not spec and not math.isclose(tokens, passes * concurrency, rel_tol=1e-6, abs_tol=1e-6):
            problems.append(f"in the window the decode server made {tokens:g} tokens in {passes:g} forward passes at "
                            f"C={concurrency}, not {passes * concurrency:g} (one token a request a pass)")
        accept = occupancy.get("acceptance_length")
        if spec and drafts and accept is not None and not 1 <= accept <= per_pass:
            problems.append(f"the reported acceptance length {accept:g} is not between 1 and {per_pass}")
    if problems:
        return False, "; ".join(problems)
    verify = _growth(decode, "spec_verify_calls_total") if spec else None
    return True, (f"the client received {received} output tokens; the decode server counted {generated:g} "
                  f"generated and {grown:g} from decode passes ({expected_decode} expected"
                  + (f"; {verify:g} verify passes, acceptance length {grown / verify:.3f}" if verify else "")
                  + ")")


def prompt_tokens(line: dict, runs: dict, decode_port: int) -> tuple:
    """(passed, detail): chat's ``usage.prompt_tokens`` as the client kept them against the decode
    server's ``prompt_tokens_total`` (module doc), exactly."""
    decode, input_lens = runs.get(decode_port), line.get("input_lens")
    if not decode:
        return False, f"no run edges on the decode server (port {decode_port})"
    if input_lens is None:
        return False, "the client line has no per-request input lengths (run with --output-details)"
    counted, reported = _growth(decode, "prompt_tokens_total"), sum(input_lens)
    if counted is None:
        return False, "the decode server reports no sglang:prompt_tokens_total"
    if counted != reported:
        planned = line.get("random_input_len")
        hint = (f" (every one is the planned {planned}: the chat answers carried no usage.prompt_tokens, so the "
                f"client kept its planned lengths)" if planned is not None and input_lens
                and all(n == planned for n in input_lens) else "")
        return False, (f"the decode server's prompt_tokens_total grew by {counted:g}; the {len(input_lens)} chat "
                       f"answers' usage.prompt_tokens, as the client kept them, add up to {reported}{hint}")
    return True, (f"the {len(input_lens)} chat answers' usage.prompt_tokens add up to {reported}, exactly what the "
                  f"decode server's prompt_tokens_total counted")


def analyze(line: dict, evidence: Optional[dict], *, decode_port: int, metrics_ports: list, num_prompts: int,
            concurrency: int, server_info: dict, occupancy: Optional[dict], headline: Optional[float],
            api: str = "generate") -> dict:
    """The ``sources`` block of a point: ``{rule: {"passed", "detail"}}`` for the module doc's rules
    (``prompt_tokens`` only for ``api`` chat)."""
    rules = ("conservation", "counters_up", "no_foreign_requests") + (("prompt_tokens",) if api == "chat" else ())
    if not evidence or not evidence.get("samples"):
        missing = "no /metrics evidence was collected for this point"
        return {rule: {"passed": False, "detail": missing} for rule in rules}
    runs, problems = {}, []
    for port in metrics_ports:
        run, problem = run_edges(evidence, port)
        if problem:
            problems.append(problem)
        else:
            runs[port] = run
    out = {}
    for rule, verdict in (
            ("conservation", conservation(line, runs, decode_port, concurrency, server_info, occupancy)),
            ("counters_up", counters_up(runs, decode_port, headline)),
            ("no_foreign_requests", no_foreign_requests(runs, decode_port, num_prompts, concurrency)),
            *((("prompt_tokens", prompt_tokens(line, runs, decode_port)),) if api == "chat" else ())):
        passed, detail = verdict
        if problems:
            passed, detail = False, "; ".join(problems) + (f"; {detail}" if not verdict[0] else "")
        out[rule] = {"passed": bool(passed), "detail": detail}
    return out
