"""Small statistics for bench records: mean, sample std, t-based 95% intervals, Welch's test.

Stdlib only. The two-sided 95% Student-t quantile comes from scipy when it is importable, else
from the table below (exact to 3 decimals at its entries; between entries it interpolates
linearly in 1/df, within 0.03 of the exact value everywhere and within 0.005 above df 3).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

# t_{0.975, df} for df = 1..30, 40, 60, 120 (infinity: the normal quantile), plus fractional df below 7.
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
    18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
    26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980,
    # Fractional df, where Welch's df for two or three repetitions usually lands.
    1.025: 11.997, 1.05: 11.362, 1.075: 10.791, 1.15: 9.387,
    1.1: 10.277, 1.2: 8.649, 1.3: 7.501, 1.4: 6.657, 1.5: 6.017, 1.6: 5.517, 1.7: 5.119, 1.8: 4.795,
    1.9: 4.527, 2.25: 3.875, 2.5: 3.575, 2.75: 3.353, 3.5: 2.940, 4.5: 2.659, 5.5: 2.502, 6.5: 2.402,
}
_Z975 = 1.959964


def t975(df: float) -> float:
    """Two-sided 95% quantile of Student's t with ``df`` degrees of freedom (df >= 1).

    Always the built-in table, never scipy when it happens to be installed: a record's intervals
    must not depend on the control machine's packages (the tests check the table against scipy).
    Interpolated in 1/df between the table's entries.
    """
    if not df >= 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df!r}")
    if df in _T975:
        return _T975[df]
    keys = sorted(_T975) + [math.inf]
    for lo, hi in zip(keys, keys[1:]):
        if lo <= df <= hi:
            t_lo = _T975[lo]
            t_hi = _T975[hi] if hi != math.inf else _Z975
            inv_lo, inv_hi, inv = 1 / lo, (1 / hi if hi != math.inf else 0.0), 1 / df
            return t_hi + (t_lo - t_hi) * (inv - inv_hi) / (inv_lo - inv_hi)
    return _Z975


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def stdev(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation (n-1); None for fewer than two values."""
    if len(values) < 2:
        return None
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def summarize(values: Sequence[float]) -> dict:
    """``{n, mean, std, cv, ci95: [lo, hi] | None, min, max}`` of ``values`` (the repetitions)."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "cv": None, "ci95": None, "min": None, "max": None}
    m = mean(values)
    s = stdev(values)
    ci = None
    if s is not None:
        half = t975(n - 1) * s / math.sqrt(n)
        ci = [m - half, m + half]
    return {
        "n": n,
        "mean": m,
        "std": s,
        "cv": (s / abs(m)) if (s is not None and m) else None,
        "ci95": ci,
        "min": min(values),
        "max": max(values),
    }


def welch_diff_ci95(old: Sequence[float], new: Sequence[float]) -> Optional[tuple[float, float]]:
    """95% interval of mean(new) - mean(old) by Welch's t; None unless both have n >= 2.

    When both samples have zero spread the interval collapses to the observed difference.
    """
    if len(old) < 2 or len(new) < 2:
        return None
    m_old, m_new = mean(old), mean(new)
    v_old = stdev(old) ** 2 / len(old)
    v_new = stdev(new) ** 2 / len(new)
    diff = m_new - m_old
    se2 = v_old + v_new
    if se2 == 0:
        return (diff, diff)
    df = se2 ** 2 / (
        (v_old ** 2 / (len(old) - 1) if v_old else 0.0) + (v_new ** 2 / (len(new) - 1) if v_new else 0.0)
    )
    half = t975(max(df, 1.0)) * math.sqrt(se2)
    return (diff - half, diff + half)


def pooled_cv(old: Sequence[float], new: Sequence[float]) -> Optional[float]:
    """Root-mean-square of the two samples' coefficients of variation (None if neither has one)."""
    cvs = []
    for sample in (old, new):
        s = stdev(sample)
        if s is not None and mean(sample):
            cvs.append(s / abs(mean(sample)))
    if not cvs:
        return None
    return math.sqrt(math.fsum(c * c for c in cvs) / len(cvs))
