"""``bench --prefill``: cold prefill tokens per second at each prompt length, from the prefill server.

For each length, ``dsv4box prefill-point`` sends ``PREFILL_REQUESTS`` requests of that many fresh
token ids and one new token, one at a time through the router. Before each request it waits for idle
servers whose counters stand still, then flushes the cache. The prefill server's own
``sglang:realtime_tokens_total`` says what it did: prompt tokens computed (mode ``prefill_compute``)
and reused (``prefill_cache``). A length is valid when every request had exactly its prompt
computed, nothing reused (cold), and was the only generation request that started on the serving
ports meanwhile (``http_requests_total``: no other client); its ``tokens_per_s`` is the computed
tokens over the wall time around each request on the box (one new token and the HTTP round trip
included, a small share at long prompts). That wall time is also the request's time to its first
(and only) token: ``ttft_s`` is its mean over the requests of a length.

Under ``--ab`` each arm is measured after its last repetition's points, with that arm's servers,
and ``ab_section`` puts the two side by side with B's rate and TTFT over A's.
"""

from __future__ import annotations

import statistics
from typing import Callable, Optional


def judge(length: int, answer: dict) -> dict:
    """One length's entry of the record's ``prefill`` section."""
    samples = answer.get("samples") or []
    problems = [] if answer.get("ok") else [str(answer.get("error"))]
    for i, sample in enumerate(samples, 1):
        if sample.get("problem"):
            problems.append(f"request {i}: {sample['problem']}")
        elif sample.get("prefill_cached_tokens"):
            problems.append(f"request {i}: {sample['prefill_cached_tokens']:g} prompt tokens came from the cache: "
                            f"not a cold prefill")
        elif any(n != 1 for n in (sample.get("requests_started") or {"?": None}).values()):
            started = sample.get("requests_started") or {}
            problems.append(f"request {i}: generation requests started meanwhile: "
                            + (", ".join(f"port {p}: {'no count' if n is None else format(n, 'g')}"
                                         for p, n in started.items()) or "not counted")
                            + " (only this one may: another client's request ran during it)")
        elif sample.get("prefill_tokens") != length:
            computed = sample.get("prefill_tokens")
            problems.append(f"request {i}: the prefill server computed "
                            f"{'no count of' if computed is None else format(computed, 'g')} prompt tokens, not "
                            f"{length} (another client's prompt in between?)")
    rates = [s["prefill_tokens"] / s["seconds"] for s in samples
             if s.get("prefill_tokens") and s.get("seconds") and not s.get("problem")]
    valid = bool(samples) and not problems
    return {"length": length, "requests": len(samples), "valid": valid, "problems": problems,
            "tokens_per_s": statistics.fmean(rates) if valid else None,
            "tokens_per_s_min": min(rates) if valid else None, "tokens_per_s_max": max(rates) if valid else None,
            "ttft_s": statistics.fmean(s["seconds"] for s in samples) if valid else None,
            "samples": samples}


def ab_section(arms: dict) -> dict:
    """The record's ``prefill`` section under ``--ab``: each arm's ``run`` result under ``arms``,
    and per length both arms' rate and TTFT with B over A (None where either arm is invalid)."""
    per_length = {}
    for length in arms["A"]["per_length"]:
        a, b = arms["A"]["per_length"][length], arms["B"]["per_length"].get(length) or {"valid": False}
        valid = a["valid"] and b["valid"]
        per_length[length] = {
            "length": a["length"], "valid": valid,
            "problems": [f"arm {arm}: {p}" for arm, e in (("A", a), ("B", b)) for p in e.get("problems", [])],
            "tokens_per_s": {"A": a.get("tokens_per_s"), "B": b.get("tokens_per_s")},
            "ttft_s": {"A": a.get("ttft_s"), "B": b.get("ttft_s")},
            "B_over_A_tokens_per_s": b["tokens_per_s"] / a["tokens_per_s"] if valid else None,
            "B_over_A_ttft": b["ttft_s"] / a["ttft_s"] if valid else None}
    return {"source": arms["A"]["source"], "port": arms["A"]["port"],
            "requests_per_length": arms["A"]["requests_per_length"], "arms": arms,
            "per_length": per_length, "valid": all(e["valid"] for e in per_length.values())}


def run(remote, lengths: list, *, router_port: int, prefill_port: int, requests: int, seed: int,
        timeout: float, env: Optional[dict], progress: Callable[[str], None], decode_port: int = 0,
        idle_timeout: float = 120.0) -> dict:
    """The record's ``prefill`` section: per length (as a string key), ``judge``'s entry."""
    out = {"source": "the prefill server's sglang:realtime_tokens_total (prefill_compute, prefill_cache) around "
                     "each request; the cache flushed before each", "port": prefill_port,
           "requests_per_length": requests, "per_length": {}}
    for n, length in enumerate(lengths, 1):
        progress(f"prefill [{n}/{len(lengths)}]: {requests} cold request(s) of {length} prompt tokens...")
        answer = remote.helper("prefill-point", "--router-port", str(router_port), "--prefill-port", str(prefill_port),
                               "--decode-port", str(decode_port), "--idle-timeout", f"{idle_timeout:g}",
                               "--length", str(length), "--requests", str(requests), "--seed", str(seed),
                               "--timeout", f"{timeout:g}", timeout=(timeout + idle_timeout) * requests + 120,
                               env=env)
        entry = judge(length, answer)
        out["per_length"][str(length)] = entry
        rate = entry["tokens_per_s"]
        progress(f"prefill [{n}/{len(lengths)}]: {length} tokens: "
                 + (f"{rate:.1f} prompt tok/s (cold), TTFT {entry['ttft_s']:.3f} s" if rate is not None else "INVALID: " + "; ".join(entry["problems"])))
    out["valid"] = all(e["valid"] for e in out["per_length"].values())
    return out
