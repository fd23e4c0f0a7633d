"""The kernel verdict: should this host run our kernel for a target, or SGLang's stock default?

A pure function of measurements, so it can be tested without a GPU. Each ``Measurement`` is one
implementation at one decode shape: its error against the reference (held to the target's bar)
and repeated CUDA-graph-replay timings. ``decide`` compares ours (``OURS``) with the
implementation stock SGLang runs by default on this GPU, shape by shape:

* faster: median(ours) <= (1 - margin) * median(stock) and ours' upper quartile is below the
  stock's lower quartile (the two sample sets do not overlap in their middle halves);
* slower: the mirror image; anything else is a tie.

A target is recommended ``on`` only when ours is correct and *faster* at every shape of the host
(a tie or a missing measurement keeps SGLang's default: no evidence, no change). docs/rollout.md
explains the rule; ``verdict_run`` measures; the report section is ``section()``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional, Sequence

SCHEMA = 1
OURS = "dsv4kit"
#: Relative margin a median must beat the other by, on top of the quartile separation.
MARGIN = 0.05
#: Fewer timing samples than this per implementation and shape is "no evidence".
MIN_SAMPLES = 5
#: The flag that turns each target's dsv4kit kernel on (dsv4kit.rollout.targets has the same names).
FLAGS = {"indexer": "SGLANG_SM120_TRITON_INDEXER", "attention": "SGLANG_SM120_MMA_ATTENTION"}

FASTER, SLOWER, TIE, NO_EVIDENCE = "faster", "slower", "tie", "no-evidence"


@dataclass(frozen=True)
class Measurement:
    """One implementation at one shape. ``samples_us``: one median-of-replays per repetition."""

    target: str
    impl: str
    stock_default: bool
    shape: str  # a label, e.g. "B=16 ctx=131072 L=2048"
    rel: Optional[float]  # error against the reference; None when it did not run
    bar: float  # the rel bar of the target (ours must meet it; others are shown against it)
    samples_us: tuple = ()
    error: str = ""  # why it did not run or raised

    @property
    def correct(self) -> bool:
        return not self.error and self.rel is not None and math.isfinite(self.rel) and self.rel <= self.bar

    @property
    def median_us(self) -> Optional[float]:
        return statistics.median(self.samples_us) if self.samples_us else None

    def quartiles(self) -> Optional[tuple[float, float]]:
        if len(self.samples_us) < 2:
            return None
        q = statistics.quantiles(self.samples_us, n=4, method="inclusive")
        return q[0], q[2]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["samples_us"] = list(self.samples_us)
        quart = self.quartiles()
        out.update(correct=self.correct, median_us=self.median_us,
                   q1_us=quart[0] if quart else None, q3_us=quart[1] if quart else None)
        return out


@dataclass
class Comparison:
    shape: str
    outcome: str  # FASTER / SLOWER / TIE / NO_EVIDENCE (ours relative to the stock default)
    ours_us: Optional[float] = None
    stock_us: Optional[float] = None
    ratio: Optional[float] = None  # median(ours) / median(stock)
    ours_correct: bool = False
    note: str = ""


@dataclass
class TargetVerdict:
    target: str
    flag: str
    recommend: str  # "on" or "off"
    stock_default: Optional[str]
    reasons: list = field(default_factory=list)
    comparisons: list = field(default_factory=list)
    measurements: list = field(default_factory=list)
    unavailable: dict = field(default_factory=dict)
    # The fastest correct implementation overall (most shapes won, then the lowest median sum),
    # and per shape: {shape: name}. Every implementation measured competes, ours or not.
    fastest: Optional[str] = None
    fastest_by_shape: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"target": self.target, "flag": self.flag, "recommend": self.recommend,
                "fastest": self.fastest, "fastest_by_shape": dict(self.fastest_by_shape),
                "flag_value": "1" if self.recommend == "on" else "0",
                "stock_default": self.stock_default, "reasons": list(self.reasons),
                "comparisons": [asdict(c) for c in self.comparisons],
                "measurements": [m.to_dict() for m in self.measurements],
                "unavailable": dict(self.unavailable)}


def compare_timings(ours: Sequence[float], stock: Sequence[float], margin: float = MARGIN) -> str:
    """FASTER, SLOWER or TIE for ours against stock; NO_EVIDENCE with too few samples."""
    if len(ours) < MIN_SAMPLES or len(stock) < MIN_SAMPLES:
        return NO_EVIDENCE
    q_ours = statistics.quantiles(ours, n=4, method="inclusive")
    q_stock = statistics.quantiles(stock, n=4, method="inclusive")
    ratio = statistics.median(ours) / statistics.median(stock)
    if ratio <= 1 - margin and q_ours[2] < q_stock[0]:
        return FASTER
    if ratio >= 1 + margin and q_ours[0] > q_stock[2]:
        return SLOWER
    return TIE


def fastest_correct(rows: Sequence[Measurement]) -> tuple[Optional[str], dict]:
    """``(overall, {shape: name})``: at each shape the correct implementation with the lowest
    median; overall the one fastest at most shapes (ties: the lower sum of its medians)."""
    by_shape: dict = {}
    for shape in dict.fromkeys(m.shape for m in rows):
        timed = [m for m in rows if m.shape == shape and m.correct and m.median_us is not None]
        if timed:
            by_shape[shape] = min(timed, key=lambda m: m.median_us).impl
    if not by_shape:
        return None, by_shape
    wins = {name: list(by_shape.values()).count(name) for name in set(by_shape.values())}

    def total(name):
        return sum(m.median_us for m in rows if m.impl == name and m.median_us is not None)

    return min(wins, key=lambda name: (-wins[name], total(name))), by_shape


def decide(target: str, measurements: Iterable[Measurement], unavailable: Optional[dict] = None,
           shapes: Optional[Sequence[str]] = None, margin: float = MARGIN) -> TargetVerdict:
    """The verdict for one target from its measurements (see the module docstring for the rule).

    ``shapes``: every shape the host needs; a shape without measurements is no evidence.
    ``unavailable``: {implementation: why it could not be loaded here}.
    """
    rows = [m for m in measurements if m.target == target]
    unavailable = dict(unavailable or {})
    shapes = list(shapes) if shapes is not None else list(dict.fromkeys(m.shape for m in rows))
    stock_names = sorted({m.impl for m in rows if m.stock_default})
    verdict = TargetVerdict(target=target, flag=FLAGS.get(target, ""), recommend="off",
                            stock_default=stock_names[0] if len(stock_names) == 1 else None,
                            measurements=rows, unavailable=unavailable)
    verdict.fastest, verdict.fastest_by_shape = fastest_correct(rows)
    if not shapes:
        verdict.reasons.append("no decode shape was measured")
        return verdict
    if not any(m.impl == OURS for m in rows):
        verdict.reasons.append(f"dsv4kit's kernel was not measured"
                               + (f" ({unavailable[OURS]})" if OURS in unavailable else ""))
    if not stock_names:
        verdict.reasons.append("SGLang's stock default was not measured here"
                               + (f" (unavailable: {'; '.join(f'{k}: {v}' for k, v in unavailable.items())})"
                                  if unavailable else "") + ": nothing to be faster than")
    elif len(stock_names) > 1:
        verdict.reasons.append(f"more than one implementation claims to be the stock default: {stock_names}")
    if verdict.reasons:
        return verdict

    stock_name = stock_names[0]
    for shape in shapes:
        ours = next((m for m in rows if m.impl == OURS and m.shape == shape), None)
        stock = next((m for m in rows if m.impl == stock_name and m.shape == shape), None)
        comparison = Comparison(shape=shape, outcome=NO_EVIDENCE)
        verdict.comparisons.append(comparison)
        if ours is None or stock is None:
            comparison.note = f"{OURS if ours is None else stock_name} not measured at this shape"
            continue
        comparison.ours_correct = ours.correct
        comparison.ours_us, comparison.stock_us = ours.median_us, stock.median_us
        if ours.median_us and stock.median_us:
            comparison.ratio = ours.median_us / stock.median_us
        if ours.error or stock.error:
            comparison.note = "; ".join(f"{m.impl}: {m.error}" for m in (ours, stock) if m.error)
            continue
        comparison.outcome = compare_timings(ours.samples_us, stock.samples_us, margin)
        if comparison.outcome == NO_EVIDENCE:
            comparison.note = f"fewer than {MIN_SAMPLES} timing samples"
        if not stock.correct:
            comparison.note = (comparison.note + "; " if comparison.note else "") + \
                f"the stock default's error {stock.rel!r} is above the bar {stock.bar:g}"

    for c in verdict.comparisons:
        if not c.ours_correct and c.outcome != NO_EVIDENCE:
            verdict.reasons.append(f"{c.shape}: dsv4kit's error is above the bar")
        elif c.outcome != FASTER:
            ratio = f" (median ratio {c.ratio:.3f})" if c.ratio is not None else ""
            verdict.reasons.append(f"{c.shape}: {c.outcome} against {stock_name}{ratio}"
                                   + (f": {c.note}" if c.note else ""))
    if not verdict.reasons:
        verdict.recommend = "on"
        verdict.reasons.append(f"correct and faster than {stock_name} at every shape "
                               f"(margin {margin:.0%}, quartiles apart)")
    return verdict


def section(verdicts: Sequence[TargetVerdict], identity: dict, shapes: dict, *, status: str = "complete",
            reason: str = "", margin: float = MARGIN) -> dict:
    """The ``verdict`` section of a validation report."""
    return {
        "schema": SCHEMA,
        "status": status,  # "complete", "incomplete" (a measurement failed) or "skipped"
        "reason": reason,
        "identity": identity,
        "shapes": shapes,
        "method": {"ours": OURS, "margin": margin, "min_samples": MIN_SAMPLES,
                   "rule": "on only where dsv4kit is correct and faster than the stock default at every "
                           "shape: median ratio <= 1 - margin and quartiles apart"},
        "targets": {v.target: v.to_dict() for v in verdicts},
        # Targets without a flag of their own (the FP4 indexer) inform; they decide no flag.
        "recommendation": {v.flag: ("1" if v.recommend == "on" else "0") for v in verdicts if v.flag},
    }


def skipped(identity: dict, shapes: dict, reason: str) -> dict:
    """A verdict section that measured nothing (e.g. on the Triton interpreter)."""
    return section([], identity, shapes, status="skipped", reason=reason)


def render(verdict: dict) -> list[str]:
    """Lines for a person: per target, the comparison at each shape and the recommendation."""
    if not verdict:
        return ["kernel verdict: none in this report"]
    if verdict.get("status") == "skipped":
        return [f"kernel verdict: not measured ({verdict.get('reason')})"]
    ident = verdict.get("identity", {})
    lines = [f"kernel verdict on {ident.get('gpu')} (driver {ident.get('driver')}, SGLang {ident.get('sglang')}), "
             f"context {verdict.get('shapes', {}).get('context_length')}, "
             f"concurrency {verdict.get('shapes', {}).get('concurrency')}:"]
    for name, body in verdict.get("targets", {}).items():
        for c in body.get("comparisons", []):
            ours = "-" if c["ours_us"] is None else f"{c['ours_us']:.1f}"
            stock = "-" if c["stock_us"] is None else f"{c['stock_us']:.1f}"
            lines.append(f"  {name:<9} {c['shape']:<28} dsv4kit {ours:>8} us  {body.get('stock_default')} "
                         f"{stock:>8} us  {c['outcome']}{'' if c['ours_correct'] else ' (dsv4kit error above bar)'}")
        if body.get("fastest"):
            lines.append(f"  {name}: fastest correct implementation: {body['fastest']}")
        lines.append(f"  {name}: {body['flag'] or '(no flag)'}={body['flag_value']} ({body['recommend']}): "
                     + "; ".join(body.get("reasons", [])))
    if verdict.get("status") != "complete":
        lines.append(f"  verdict {verdict.get('status')}: {verdict.get('reason')}")
    return lines
