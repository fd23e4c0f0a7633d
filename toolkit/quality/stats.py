"""The statistics of the eval: KL from logprobs, top-k agreement, Wilson intervals, exact McNemar.

Pure functions over plain lists; ``None`` or a non-finite logprob is a NaN the server produced.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from dsv4kit.quality.box_eval import finite  # noqa: F401  (the one rule, shared with the box's ledger)


def approx_kl(reprefill: Sequence, decode: Sequence) -> Optional[float]:
    """SGLang 0.5.23's per-sequence estimate: ``mean(exp(r) - 1 - r)``, ``r = prefill - decode``
    logprob of each generated token. None when a value is missing or not finite."""
    if not decode or len(reprefill) != len(decode):
        return None
    if not all(finite(v) for v in (*reprefill, *decode)):
        return None
    terms = [math.expm1(p - d) - (p - d) for p, d in zip(reprefill, decode)]
    return sum(terms) / len(terms)


def wilson(successes: int, n: int, z: float = 1.959963984540054) -> Optional[tuple[float, float]]:
    """The Wilson score interval (95% by default) of a proportion; None for n = 0."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: the binomial test of ``b`` against ``b + c`` discordant
    pairs at 1/2 (``b``: right in A, wrong in B; ``c``: the reverse). 1.0 without discordance."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def topk_agreement(ids_a: Sequence[int], top_a: Sequence, ids_b: Sequence[int], top_b: Sequence) -> dict:
    """Two greedy outputs of one prompt compared position by position, as vLLM's kernel tests do:
    up to and including the first position where the tokens differ, each side's token must be in
    the other side's top-k (``top_*``: per position a list of ``[logprob, token_id]``).

    Returns ``first_divergence`` (index, or None when identical), ``compared`` positions,
    ``agree`` (top-1 equal among them) and ``contained`` (both tokens in the other's top-k at
    every compared position)."""
    n = min(len(ids_a), len(ids_b))
    first = next((i for i in range(n) if ids_a[i] != ids_b[i]), None)
    upto = n if first is None else first + 1
    agree = sum(1 for i in range(upto) if ids_a[i] == ids_b[i])
    contained = True
    for i in range(upto):
        in_b = ids_a[i] in {e[1] for e in (top_b[i] if i < len(top_b) else []) or []}
        in_a = ids_b[i] in {e[1] for e in (top_a[i] if i < len(top_a) else []) or []}
        if not (in_a and in_b):
            contained = False
            break
    if first is None and len(ids_a) != len(ids_b):
        first = n
    return {"first_divergence": first, "compared": upto, "agree": agree, "contained": contained}


def _entries(position) -> list:
    """A position's top-k as ``[(logprob, id)]``; an entry that is not a ``[logprob, id, ...]`` list is
    ``(None, None)`` (judged malformed by ``topk_problems``)."""
    out = []
    for entry in position or []:
        if isinstance(entry, (list, tuple)) and len(entry) >= 2:
            out.append((entry[0], entry[1]))
        else:
            out.append((None, None))
    return out


def topk_problems(position, slack: float) -> list[str]:
    """What is wrong with one position's top-k (``[[logprob, id], ...]``, best first): a logprob
    that is null, not finite or above 0; an order that is not descending; probabilities summing
    above ``1 + slack``. Empty when it is a possible distribution."""
    entries = _entries(position)
    values = [lp for lp, _ in entries]
    if not all(finite(v) for v in values):
        return ["a null or non-finite logprob"]
    out = []
    if any(v > slack for v in values):
        out.append("a logprob above 0")
    if any(b > a + slack for a, b in zip(values, values[1:])):
        out.append("top-k not in descending order")
    if sum(math.exp(min(v, 0.0)) for v in values) > 1.0 + slack:
        out.append(f"top-k probabilities summing to {sum(math.exp(v) for v in values):.4f} > 1")
    return out


def topk_distance(top_a, top_b, floor: float) -> Optional[float]:
    """The largest logprob difference (nats) between two top-k lists of one position, over the
    tokens either lists with logprob >= ``floor``. A token in one list but not the other is at
    most the other's last logprob there, so it counts as at least the difference to that; None
    when either list is empty."""
    a, b = dict((t, lp) for lp, t in _entries(top_a)), dict((t, lp) for lp, t in _entries(top_b))
    if not a or not b or not all(finite(v) for v in (*a.values(), *b.values())):
        return None
    worst = 0.0
    for mine, other in ((a, b), (b, a)):
        last = min(other.values())
        for token, lp in mine.items():
            if lp < floor:
                continue
            if token in other:
                worst = max(worst, abs(lp - other[token]))
            elif lp > last:  # the other side put it below its own k-th entry
                worst = max(worst, lp - last)
    return worst


def tie_gap(position, token_a, token_b) -> Optional[float]:
    """How far apart two tokens are in one position's top-k (nats); None when either is not in it."""
    lp = dict((t, v) for v, t in _entries(position))
    if token_a not in lp or token_b not in lp or not finite(lp[token_a]) or not finite(lp[token_b]):
        return None
    return abs(lp[token_a] - lp[token_b])
