"""What the ahead-of-time kernel build tests read from Triton's IR."""

from __future__ import annotations


def copies_in_loops(ttgir: str) -> int:
    """Operand copies into shared memory (``ttg.local_alloc`` of a value) inside an ``scf.for``."""
    depth, loops, found = 0, [], 0
    for line in ttgir.splitlines():
        if "ttg.local_alloc %" in line and loops:
            found += 1
        if "scf.for" in line and line.rstrip().endswith("{"):
            loops.append(depth)
        depth += line.count("{") - line.count("}")
        while loops and depth <= loops[-1]:
            loops.pop()
    return found
