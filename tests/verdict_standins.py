"""Stand-in implementations and timings for the kernel verdict (no GPU): the seams of
``dsv4kit.validation.verdict_run.run`` (provider, builders, timer, identity).

Timings are hostile the way graph-replay timings are: jittered around a median, with one slow
outlier per set, so a decision taken from one sample or from the mean would differ.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from dsv4kit.validation import verdict_run

GPU = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DRIVER = "580.95.05"
SGLANG = "0.5.23"
JITTER = (-0.03, -0.02, -0.01, 0.0, 0.01, 0.02, 0.6)  # the last one: a slow replay


@dataclass(frozen=True)
class StandIn:
    """An implementation whose error and timing are given: ``us`` maps a shape label (or "*") to µs."""

    target: str
    name: str
    stock_default: bool
    us: dict = field(default_factory=dict)
    rel: float = 1e-5
    raises: str = ""

    @property
    def fn(self):
        return self

    def samples(self, label: str) -> list:
        if self.raises:
            raise RuntimeError(self.raises)
        base = self.us.get(label, self.us.get("*"))
        return [base * (1 + d) for d in JITTER]


def identity(device: str, **overrides) -> dict:
    return {"hostname": "box1", "device": device, "gpu": GPU, "capability": "sm_120", "driver": DRIVER,
            "sglang": SGLANG, "torch": "2.14.1", "cuda": "13.0", "triton": "3.8.0", "dsv4kit": "test",
            "kernels_sha256": verdict_run.kernels_digest(),
            "cuda_visible_devices": "7", **overrides}


def _builder(shape, device):
    return (lambda fn: [lambda: fn.samples(shape.label)]), (lambda fn: fn.rel)


BUILDERS = {"indexer": _builder, "attention": _builder}


def timer(calls):
    return calls[0]()


def issue_table(context: int = 8192) -> dict:
    """Ours loses the indexer at short requests on a long context and wins at full context (as
    measured on the H200 in issue 13's table); ours beats the stock attention everywhere."""
    short = {f"B={c} ctx={context} L=2048": s for c, s in ((1, 3.0), (16, 6.5), (64, 19.5))}
    full = {f"B={c} ctx={context} L={context}": s for c, s in ((1, 4.0), (16, 22.4), (64, 79.0))}
    stock_short = {f"B={c} ctx={context} L=2048": s for c, s in ((1, 2.5), (16, 2.8), (64, 3.8))}
    stock_full = {f"B={c} ctx={context} L={context}": s for c, s in ((1, 6.0), (16, 37.9), (64, 140.0))}
    # Prefill chunks (verdict_run.prefill_shapes): ours reads a shared key page once per row tile.
    prefill = [s.label for s in verdict_run.prefill_shapes("indexer", context)]
    short.update({label: 100.0 for label in prefill})
    stock_short.update({label: 300.0 for label in prefill})
    return {
        "indexer": [StandIn("indexer", "dsv4kit", False, {**short, **full}),
                    StandIn("indexer", "sglang-tilelang", True, {**stock_short, **stock_full}, rel=2e-3),
                    StandIn("indexer", "sglang-torch", False, {"*": 900.0}, rel=4e-3)],
        "attention": [StandIn("attention", "dsv4kit", False, {"*": 20.0}, rel=2e-3),
                      StandIn("attention", "flashinfer-sm120", True, {"*": 30.0}, rel=1e-3),
                      StandIn("attention", "sglang-triton-sm120", False, {"*": 2000.0}, rel=1e-3)],
    }


def provider(table: dict, unavailable: dict | None = None):
    def implementations(target, device):
        return list(table[target]), dict((unavailable or {}).get(target, {}))
    return implementations


def stand_in_run(table: dict | None = None, unavailable: dict | None = None, **identity_overrides):
    """``verdict_run.run`` with every seam stood in (for monkeypatching into the harness)."""
    return functools.partial(verdict_run.run, provider=provider(table or issue_table(), unavailable),
                             builders=BUILDERS, timer=timer,
                             identity_fn=functools.partial(identity, **identity_overrides))
