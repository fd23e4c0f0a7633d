"""A picture of the dashboard without a browser: every panel of ``panels.ROWS`` drawn with
matplotlib from Prometheus's own ``/api/v1/query_range`` answers (the [plot] extra).

    python -m dsv4kit.monitor.render --prometheus http://127.0.0.1:9090 --out dashboard.png \\
        [--minutes 5] [--note "simulated box"]

The note is printed on the picture (say where the data came from). Writes the PNG atomically."""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from dsv4kit.monitor.panels import ROWS, Panel


def query_range(prometheus: str, expr: str, start: float, end: float, step: float, timeout: float = 10.0) -> list:
    """``[(labels, [(t, value)])]`` of one PromQL expression over [start, end]."""
    query = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    with urllib.request.urlopen(f"{prometheus.rstrip('/')}/api/v1/query_range?{query}", timeout=timeout) as answer:
        body = json.loads(answer.read())
    if body.get("status") != "success":
        raise ValueError(f"{expr}: {body.get('error')}")
    return [(series["metric"], [(float(t), float(v)) for t, v in series["values"]])
            for series in body["data"]["result"]]


def legend(template: str, labels: dict) -> str:
    """Grafana's ``{{label}}`` legend format, filled from a series' labels."""
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(labels.get(m.group(1), "")), template).strip()
    return text or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")


def fetch(prometheus: str, minutes: float, now: Optional[float] = None) -> dict:
    """Every panel's series: ``{title: [(legend, [(t, v)]) or the label text of a table row]}``."""
    end = now if now is not None else time.time()
    start = end - minutes * 60
    step = max(1.0, minutes * 60 / 240)
    out = {}
    for _, panels in ROWS:
        for panel in panels:
            rows = []
            for expr, template in panel.queries:
                for labels, values in query_range(prometheus, expr, start, end, step):
                    if panel.kind == "table":
                        rows.append(", ".join(f"{k}={v}" for k, v in sorted(labels.items())
                                              if k not in ("__name__", "instance", "job")))
                    else:
                        rows.append((legend(template, labels), values))
            out[panel.title] = rows
    return out


def _draw(ax, panel: Panel, rows: list, start: float, span: float) -> None:
    ax.set_title(f"{panel.title} ({panel.unit})", fontsize=8)
    ax.tick_params(labelsize=6)
    if not rows:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=8, color="grey", transform=ax.transAxes)
        return
    if panel.kind == "table":
        ax.axis("off")
        text = "\n".join(_wrap(row, 70) for row in sorted(set(rows))[:8])
        ax.text(0.0, 1.0, text, ha="left", va="top", fontsize=6, family="monospace", transform=ax.transAxes)
        return
    for name, values in rows[:12]:
        points = [(t - start, v) for t, v in values if math.isfinite(v)]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=name[:40], linewidth=1, marker="." if len(points) < 4 else None)
    ax.set_xlim(0, span)
    ax.set_xlabel("seconds", fontsize=6)
    if len(rows) <= 8:
        ax.legend(fontsize=5, loc="upper left")


def _wrap(text: str, width: int) -> str:
    return "\n  ".join(text[i:i + width] for i in range(0, len(text), width))


def render(series: dict, out: Path, note: str, start: float, span: float) -> Path:
    import matplotlib  # the [plot] extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(title, panels) for title, panels in ROWS]
    columns = max(len(panels) for _, panels in rows)
    fig, axes = plt.subplots(len(rows), columns, figsize=(3.6 * columns, 3.0 * len(rows)), squeeze=False)
    fig.subplots_adjust(left=0.03, right=0.99, top=0.9, bottom=0.04, hspace=0.75, wspace=0.3)
    for r, (row_title, panels) in enumerate(rows):
        for c in range(columns):
            ax = axes[r][c]
            if c >= len(panels):
                ax.axis("off")
                continue
            _draw(ax, panels[c], series.get(panels[c].title) or [], start, span)
        box = axes[r][0].get_position()
        fig.text(box.x0, box.y1 + 0.045, row_title, fontsize=10, fontweight="bold")
    fig.suptitle(f"DeepSeek-V4 PD box: the dashboard's panels, drawn from Prometheus's query_range answers\n{note}",
                 fontsize=11)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.png")
    try:
        fig.savefig(tmp, format="png", dpi=80)
        tmp.replace(out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return out


def main(argv=None) -> int:
    from dsv4kit.core.missing import missing_package_exit

    parser = argparse.ArgumentParser(prog="python -m dsv4kit.monitor.render", description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus's URL (e.g. through `dsv4kit monitor`'s tunnel)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--note", default="", help="printed on the picture: where the data came from")
    args = parser.parse_args(argv)
    end = time.time()
    try:
        series = fetch(args.prometheus, args.minutes, now=end)
    except (OSError, ValueError) as exc:
        parser.exit(3, f"error: {args.prometheus}: {getattr(exc, 'reason', exc)}\n")
    with missing_package_exit():
        render(series, args.out, args.note, end - args.minutes * 60, args.minutes * 60)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
