"""The box-side ``/metrics`` parse, checked against prometheus_client's on the control machine.

The box helper (``box_metrics.py``, standard library only) parses every scrape itself and keeps
only the selected numbers (a point scraped 4 times a second for an hour would otherwise ship
hundreds of megabytes of text). It also ships the raw text of each port's first scrape
(``evidence["exposition"]``); here that text is parsed again with ``prometheus_client``'s text
parser and run through the same series selection. A disagreement fails the running-batch gate.
"""

from __future__ import annotations

import math
from typing import Optional

from dsv4kit.serving.box import metrics as box_metrics


def prometheus_samples(text: str) -> list:
    """``[(name, labels, value)]`` of ``text`` as prometheus_client reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value)) for family in text_string_to_metric_families(text)
            for s in family.samples]


def _same(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    return all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def cross_check(evidence: Optional[dict], port: int) -> Optional[str]:
    """None when the box's parse of ``port``'s first scrape selects what prometheus_client's does;
    else the problem in words (also when prometheus_client cannot read the text at all)."""
    text = ((evidence or {}).get("exposition") or {}).get(str(port))
    if text is None:
        return None  # no scrape succeeded: the gates say so from the samples
    try:
        reference = box_metrics.select_metrics(prometheus_samples(text))
    except Exception as exc:  # prometheus_client raises ValueError and friends on bad text
        return f"prometheus_client cannot parse the /metrics text of port {port}: {exc}"
    ours = box_metrics.select_metrics(box_metrics.parse_exposition(text, names=box_metrics.METRICS))
    if not _same(ours[0], reference[0]) or ours[1] != reference[1]:
        return (f"the box-side /metrics parse of port {port} disagrees with prometheus_client's: "
                f"{ours[0]} vs {reference[0]}")
    return None
