"""How the kernel benchmarks time a call and measure the device's ceilings (GPU only).

One definition of each number, so a "floor" means the same thing in every benchmark:

* ``graph_time_us``: microseconds per call, the **median** over ``samples`` replays of one CUDA
  graph holding ``len(calls) * rounds`` calls. ``calls`` are the same operation on different
  input copies, cycled, so each call finds its inputs cold in L2 once their total passes the L2
  size (``copies_for_cold_l2`` says how many copies that takes). One untimed replay comes first;
  with ``warmup_s``, untimed replays go on until that many seconds have passed (a small call
  timed right after other work read up to ~10% slow on the H100 without it).
* ``copy_bandwidth``: bytes per second of a device-to-device ``copy_`` of 1 GiB, counting bytes
  read plus bytes written, median of ``samples`` graph replays.
* ``launch_floor_us``: ``graph_time_us`` of an empty Triton kernel (one program that does
  nothing), replayed in a graph of eight: what no kernel launched the same way can beat.
* ``bf16_rate``, ``fp8_rate`` (both: ``matmul_rates``): FLOP/s of an ``n x n x n`` product on
  random data, median of graph replays: bf16 ``torch.mm`` and FP8 e4m3 ``torch._scaled_mm``
  (per-tensor scales, bf16 out), the tensor-core rates a floor of ``FLOPs / rate`` refers to.

``torch`` is passed in so importing this module never needs CUDA.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable, Sequence

SAMPLES = 7


def l2_bytes(torch) -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 50 << 20)


def copies_for_cold_l2(torch, bytes_per_copy: int, cap: int = 16) -> int:
    """How many input copies a rotation needs so that their total is at least twice the L2."""
    return max(1, min(cap, -(-2 * l2_bytes(torch) // max(bytes_per_copy, 1))))


def graph_time_us(torch, calls: Sequence[Callable[[], object]], rounds: int = 1,
                  samples: int = SAMPLES, warmup_s: float = 0.0) -> float:
    """Median microseconds per call over ``samples`` replays of one graph of every call in
    ``calls``, ``rounds`` times over (see the module docstring)."""
    from dsv4kit.validation.graphs import capture

    def all_calls():
        for _ in range(rounds):
            for fn in calls:
                fn()

    graph = capture(torch, all_calls, 1)
    started = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    while time.perf_counter() - started < warmup_s:
        graph.replay()
        torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (rounds * len(calls)))
    del graph
    torch.cuda.synchronize()
    return statistics.median(times)


@functools.lru_cache(maxsize=None)
def _empty_kernel():
    import triton

    @triton.jit
    def empty(x_ptr):
        pass

    return empty


def launch_floor_us(torch, samples: int = SAMPLES) -> float:
    """Microseconds per call of an empty one-program Triton kernel, timed as ``graph_time_us``
    times a call (eight launches a graph)."""
    kernel = _empty_kernel()
    x = torch.empty(1, device="cuda")
    return graph_time_us(torch, [lambda: kernel[(1,)](x)] * 8, samples=samples)


def copy_bandwidth(torch, nbytes: int = 1 << 30, samples: int = SAMPLES) -> float:
    """Bytes per second of a device-to-device copy (read + write), median of graph replays."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    us = graph_time_us(torch, [lambda: dst.copy_(src)], rounds=5, samples=samples)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (us * 1e-6)


def bf16_rate(torch, n: int = 8192, samples: int = SAMPLES) -> float:
    """FLOP/s of a bf16 ``n x n x n`` ``torch.mm`` on random data, median of graph replays."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = graph_time_us(torch, [lambda: a @ b], rounds=5, samples=samples)
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * n ** 3 / (us * 1e-6)


def fp8_rate(torch, n: int = 8192, samples: int = SAMPLES) -> float:
    """FLOP/s of an FP8 e4m3 ``n x n x n`` ``torch._scaled_mm`` (per-tensor scales, bf16 out) on
    random data, median of graph replays."""
    a8 = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b8 = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as it wants
    one = torch.ones((), device="cuda", dtype=torch.float32)
    us = graph_time_us(torch, [lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,
                                                        out_dtype=torch.bfloat16)],
                       rounds=5, samples=samples)
    del a8, b8
    torch.cuda.empty_cache()
    return 2.0 * n ** 3 / (us * 1e-6)


def matmul_rates(torch, n: int = 8192, samples: int = SAMPLES) -> dict:
    """``{"bf16_flops_per_s", "fp8_flops_per_s", "n"}``, measured as above."""
    return {"bf16_flops_per_s": bf16_rate(torch, n, samples),
            "fp8_flops_per_s": fp8_rate(torch, n, samples), "n": n}
