"""The needle heatmap: one PNG per arm, context length x depth, the share of needles found."""

from __future__ import annotations

import io
from typing import Optional


def heatmaps(record: dict) -> tuple[dict[str, bytes], Optional[str]]:
    """``({"needles-A.png": bytes, ...}, note)``: the note says why there is none (no matplotlib,
    no needle check)."""
    check = next((c for c in record.get("checks") or [] if c["check"] == "needles"), None)
    if check is None:
        return {}, None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}, "no needle heatmap: matplotlib is not installed (pip install 'dsv4kit[plot]')"
    out = {}
    for arm, table in (check.get("per_arm") or {}).items():
        contexts = sorted(table["cells"], key=int)
        depths = [f"{i / 10:g}" for i in range(10)]  # deciles: the spaced needles are many rows
        binned = {c: {} for c in contexts}
        for c in contexts:
            for d, (found, total) in table["cells"][c].items():
                slot = binned[c].setdefault(f"{min(9, int(float(d) * 10)) / 10:g}", [0, 0])
                slot[0], slot[1] = slot[0] + found, slot[1] + total
        grid = [[(lambda fc: fc[0] / fc[1] if fc else float("nan"))(binned[c].get(d)) for c in contexts]
                for d in depths]
        fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(contexts), 1.2 + 0.6 * len(depths)))
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(contexts)), [f"{int(c) // 1024}K" for c in contexts])
        ax.set_yticks(range(len(depths)), [f"{float(d):.0%}-{float(d) + 0.1:.0%}" for d in depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth")
        for y, row in enumerate(grid):
            for x, value in enumerate(row):
                if value == value:  # not NaN
                    ax.text(x, y, f"{value:.0%}", ha="center", va="center", fontsize=8)
        setting = (record.get("arms") or {}).get(arm, {}).get("setting") or "as served"
        ax.set_title(f"needles found, arm {arm}: {setting}", fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.05)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        plt.close(fig)
        out[f"needles-{arm}.png"] = buffer.getvalue()
    return out, None
