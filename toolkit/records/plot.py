"""``records plot``: a PNG of a throughput metric against concurrency, one line per record.

Each line is the mean over the valid repetitions at each concurrency, with the 95% interval as
error bars; invalid points are left out (a gap, not a zero). Needs matplotlib (the [plot] extra).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

from dsv4kit.records.compare import METRICS


#: Printed on the figure: what a point and its error bar are.
BARS_NOTE = ("Each point: the mean over the valid repetitions at that concurrency. Error bars: the 95% "
             "confidence interval (95% CI) of that mean\n(Student t, n-1 degrees of freedom); no bar with "
             "fewer than 2 valid repetitions. Invalid points are left out (a gap, not a zero).")


def _pyplot():
    import matplotlib  # the [plot] extra; a missing one is exit 5 (dsv4kit.core.missing)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_records(records: Sequence[dict], out: Path, metric: str = "decode_tok_s") -> Path:
    plt = _pyplot()
    fig = figure(records, metric)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.png")
    try:
        fig.savefig(tmp, format="png")
        tmp.replace(out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)  # only there when saving failed or was interrupted
    return out


def figure(records: Sequence[dict], metric: str = "decode_tok_s"):
    """The matplotlib figure of ``plot_records`` (the caller closes it)."""
    plt = _pyplot()
    if not records:
        raise ValueError("no records to plot")
    label = METRICS.get(metric, (None, metric))[1]
    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    all_c: set[int] = set()
    for record in records:
        per_c = record["summary"]["per_concurrency"]
        xs, ys, errs = [], [], []
        for c in sorted(per_c, key=int):
            entry = per_c[c].get(metric) or {}
            if not entry.get("n"):
                continue
            xs.append(int(c))
            ys.append(entry["mean"])
            ci = entry.get("ci95")
            errs.append((entry["mean"] - ci[0]) if ci else 0.0)
        all_c.update(xs)
        ctx = (record.get("server") or {}).get("context_length")
        ds = (record.get("client") or {}).get("dataset") or {}
        name = f"{record['run_id']} (ctx {ctx}, {ds.get('input_len')}/{ds.get('output_len')})"
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(all_c))
    ax.set_xticklabels([str(c) for c in sorted(all_c)])
    ax.set_xlabel("concurrency (max in-flight requests)")
    ax.set_ylabel(label)
    # Wrapped to the axes' width: a long metric name stays inside the figure.
    ax.set_title(textwrap.fill(f"{label} vs concurrency (mean, 95% CI error bars)", 60), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, title="record (context length, input/output tokens)", title_fontsize=7)
    fig.text(0.01, 0.01, BARS_NOTE, fontsize=6.5, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
