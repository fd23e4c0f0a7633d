"""``bench --prefill``: cold prefill tokens per second at each prompt length, from the prefill server.

For each length, ``dsv4box prefill-point`` sends ``PREFILL_REQUESTS`` requests of that many fresh
token ids and one new token, one at a time through the router. Before each request it waits for idle
servers whose counters stand still, then flushes the cache. The prefill server's own
``sglang:realtime_tokens_total`` says what it did: prompt tokens computed (mode ``prefill_compute``)
and reused (``prefill_cache``). A length is valid when every request had exactly its prompt
computed, nothing reused (cold), and was the only generation request that started on the serving
ports meanwhile (``http_requests_total``: no other client); its ``tokens_per_s`` is the computed
tokens over the wall time around each request on the box (one new token and the HTTP round trip
included, a small share at long prompts).
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
            "samples": samples}


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
                 + (f"{rate:.1f} prompt tok/s (cold)" if rate is not None else "INVALID: " + "; ".join(entry["problems"])))
    out["valid"] = all(e["valid"] for e in out["per_length"].values())
    return out
