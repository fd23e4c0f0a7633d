"""The top-k rule, decode against re-prefill (docs/quality.md): one measure and one bound, which the
short set (``topk_reprefill``) and the long set past the indexer's threshold (``logprob_kl_long``)
both judge by. ``t`` is ``checks.Thresholds``: ``topk_floor_logprob``, ``max_topk_mean_nats`` and
``max_topk_nats``."""

from __future__ import annotations

from typing import Optional

from dsv4kit.quality.stats import topk_distance


def topk_reprefill_of(result: dict, t, source: str = "logprob") -> dict:
    """One arm's decode top-k against the re-prefill's top-k of the same positions (nats)."""
    samples = ((result.get("checks") or {}).get(source) or {}).get("samples") or []
    distances, far, missing = [], [], []
    for s in samples:
        out, pre = s.get("output_top") or [], s.get("reprefill_top")
        if not pre or len(pre) != len(out):
            missing.append(s.get("index"))
            continue
        for j, (x, y) in enumerate(zip(out, pre)):
            d = topk_distance(x, y, t.topk_floor_logprob)
            if d is None:
                missing.append(s.get("index"))
                break
            distances.append(d)
            if d > t.max_topk_nats:
                far.append({"index": s.get("index"), "position": j, "nats": round(d, 4)})
    return {"positions": len(distances), "mean_nats": (sum(distances) / len(distances)) if distances else None,
            "max_nats": max(distances) if distances else None, "far": far[:10], "missing": missing}


def topk_bound_problem(n: dict, t) -> Optional[str]:
    """The top-k rule, decode against re-prefill, on ``topk_reprefill_of``'s numbers (the short set's
    ``topk_reprefill`` and the long set's ``logprob_kl_long`` both judge by it): the mean over
    positions within ``max_topk_mean_nats`` and every position within ``max_topk_nats``. None: within."""
    if n["positions"] and (n["far"] or n["mean_nats"] > t.max_topk_mean_nats):
        return (f"top-k differs by {n['mean_nats']:.3f} nats on average (bound {t.max_topk_mean_nats}), "
                f"{n['max_nats']:.3f} at most (bound {t.max_topk_nats})")
    return None
