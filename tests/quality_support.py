"""Test support for ``dsv4kit eval``: a small generated task set in GSM8K's JSONL format.

No third-party data: items are arithmetic questions the stand-in model (tests/fake_model.py)
can answer, written in GSM8K's shape (``answer`` ends ``#### N``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TASK_WORDS = "What is plus minus times ?"


def make_tasks(path: Path, n: int = 30, seed: int = 7) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randrange(2, 90), rng.randrange(2, 30)
        op = rng.choice(("plus", "minus", "times"))
        result = {"plus": a + b, "minus": a - b, "times": a * b}[op]
        lines.append(json.dumps({"question": f"What is {a} {op} {b}?", "answer": f"{a} {op} {b} is {result}. #### {result}"}))
    path.write_text("\n".join(lines) + "\n")
    return path
