"""The stacked bar PNG of one or more profiles (matplotlib, imported when called)."""

from __future__ import annotations

import os
from pathlib import Path

from dsv4kit.profile.classes import CLASSES


def stacked_bars(profiles: list[tuple[str, dict]], path: Path) -> None:
    """One bar per (label, profile): its time per decode step, stacked by class. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3 + 1.6 * len(profiles), 5))
    bottoms = [0.0] * len(profiles)
    labels = [label for label, _ in profiles]
    for klass, name in CLASSES.items():
        values = [p["classes"][klass]["us_per_step"] / 1000.0 for _, p in profiles]
        if not any(values):
            continue
        ax.bar(labels, values, bottom=bottoms, label=name)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_ylabel("kernel time per decode step (ms, mean over ranks)")
    ax.set_title("decode time by kernel class")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
