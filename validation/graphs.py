"""CUDA-graph capture as the benchmarks and the profile fixture use it (GPU only)."""

from __future__ import annotations

from typing import Callable


def capture(torch, fn: Callable[[], object], calls: int):
    """A ``torch.cuda.CUDAGraph`` of ``calls`` back-to-back ``fn()`` calls.

    ``fn`` runs twice on a side stream first, so lazy allocations and Triton's compilation happen
    outside the capture.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph
