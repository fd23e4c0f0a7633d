"""Draw the sample charts of docs/overview.md from SYNTHETIC records with dsv4kit's own plotting code.

    python docs/samples/make_samples.py [OUT_DIR]      (default: docs/samples)

The numbers below are made up: they show what each chart looks like, not what a box measures.
Each image says "synthetic" in its title or legend, carries a big SYNTHETIC stamp, and keeps
``synthetic-digest`` (the SHA-256 of the made-up inputs) in its PNG text, so a test can tell
that the committed images come from this script as it is now.

* bench curve: ``dsv4kit.records.plot.figure`` (what ``records plot`` draws);
* needle heatmap: ``dsv4kit.quality.heatmap.heatmaps`` (what ``eval`` writes beside its record);
* profile chart: ``dsv4kit.profile.plot.stacked_bars`` (what ``profile --output`` writes).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAMP = "SYNTHETIC DATA: an example of the chart, not a measurement"
FILES = {"bench": "bench-curve-synthetic.png", "needles": "needle-heatmap-synthetic.png",
         "profile": "profile-chart-synthetic.png"}


def bench_records() -> list[dict]:
    """Two made-up sweeps (stock kernels and ours), three repetitions per concurrency."""
    from dsv4kit.records import stats

    def record(run_id: str, per_gpu: float, ctx: int) -> dict:
        per_c = {}
        for c in (1, 2, 4, 8, 16, 32, 64):
            base = per_gpu * 8 * c / (1 + c / 24)
            per_c[str(c)] = {"decode_tok_s": stats.summarize([base * f for f in (0.97, 1.0, 1.03)])}
        return {"run_id": run_id, "server": {"context_length": ctx},
                "client": {"dataset": {"input_len": ctx - 1024 - 64, "output_len": 1024}},
                "summary": {"per_concurrency": per_c}}

    return [record("synthetic-stock-kernels", 9.0, 131072), record("synthetic-dsv4kit-kernels", 12.0, 131072)]


def eval_record() -> dict:
    """A made-up two-arm needle check: arm B loses some needles deep in long contexts."""
    cells = {}
    for arm, loss in (("A", 0.0), ("B", 0.25)):
        table = {}
        for ctx in (8192, 32768, 65536, 131072):
            row = {}
            for decile in range(10):
                depth = decile / 10 + 0.05
                missed = round(4 * loss * depth * ctx / 131072)
                row[f"{depth:.2f}"] = [4 - missed, 4]
            table[str(ctx)] = row
        cells[arm] = {"cells": table}
    return {"checks": [{"check": "needles", "per_arm": cells}],
            "arms": {"A": {"setting": "synthetic, FLAG=0"}, "B": {"setting": "synthetic, FLAG=1"}}}


def profiles() -> list[tuple[str, dict]]:
    """Two made-up decode profiles, one per kernel setting."""
    from dsv4kit.profile.classes import CLASSES

    shares = [0.34, 0.22, 0.14, 0.10, 0.08, 0.05, 0.04, 0.03]
    out = []
    for label, step_us in (("synthetic: stock", 52000.0), ("synthetic: ours", 41000.0)):
        classes = {k: {"us_per_step": step_us * (shares[i] if i < len(shares) else 0.01)}
                   for i, k in enumerate(CLASSES)}
        out.append((label, {"classes": classes}))
    return out


def digest() -> str:
    """The SHA-256 of every made-up input: it changes when the samples would."""
    inputs = {"bench": bench_records(), "eval": eval_record(), "profile": profiles()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _stamp(png: bytes, out: Path, title: str, sha: str) -> None:
    """``png`` with the SYNTHETIC stamp across it, written to ``out`` with its PNG text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    image = mpimg.imread(io.BytesIO(png), format="png")
    height, width = image.shape[:2]
    fig = plt.figure(figsize=(width / 100, height / 100), dpi=100)
    fig.figimage(image, 0, 0)
    fig.text(0.5, 0.5, "SYNTHETIC", fontsize=min(width, height) / 9, color="red", alpha=0.18,
             ha="center", va="center", rotation=25, weight="bold")
    fig.text(0.5, 0.995, STAMP, fontsize=8, color="red", ha="center", va="top")
    fig.savefig(out, dpi=100, metadata={"Title": title, "Description": STAMP, "Software": "docs/samples/make_samples.py",
                                        "synthetic-digest": sha})
    plt.close(fig)


def make(out_dir: Path) -> dict[str, Path]:
    """Write the three sample PNGs into ``out_dir``; their paths by kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dsv4kit.profile.plot import stacked_bars
    from dsv4kit.quality.heatmap import heatmaps
    from dsv4kit.records.plot import figure

    out_dir.mkdir(parents=True, exist_ok=True)
    sha = digest()
    fig = figure(bench_records())
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    _stamp(buffer.getvalue(), out_dir / FILES["bench"], "bench curve (synthetic)", sha)
    pngs, note = heatmaps(eval_record())
    if note:
        raise SystemExit(note)
    _stamp(pngs["needles-B.png"], out_dir / FILES["needles"], "needle heatmap (synthetic)", sha)
    scratch = out_dir / ".profile-unstamped.png"
    stacked_bars(profiles(), scratch)
    _stamp(scratch.read_bytes(), out_dir / FILES["profile"], "profile chart (synthetic)", sha)
    scratch.unlink()
    return {kind: out_dir / name for kind, name in FILES.items()}


if __name__ == "__main__":
    for path in make(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE).values():
        print(path)
