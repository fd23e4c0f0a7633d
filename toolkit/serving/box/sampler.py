"""One background sampler for the box side (and the spread of what it sampled): a daemon thread that calls ``sample()`` every
``interval`` seconds between ``__enter__`` and ``__exit__`` (the ``/metrics`` scraper, the DCGM
telemetry and run-point's progress lines are its subclasses). Standard library only."""

from __future__ import annotations

import threading
from typing import Optional


class BackgroundSampler:
    """Subclasses set ``interval`` (s) and define ``sample()``. ``sample_at_start``: the first call
    comes at once, not one interval in; ``sample_at_exit``: one more call after the thread stopped
    (a window's closing edge); ``enabled`` false: the thread is never started."""

    sample_at_start = False
    sample_at_exit = False

    def __init__(self, interval: float):
        self.interval = interval
        self.enabled = True
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        if self.sample_at_start:
            self.sample()
        while not self.stop_event.wait(self.interval):
            self.sample()

    def __enter__(self):
        if self.enabled:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        if self.sample_at_exit:
            self.sample()


def spread(values: list) -> Optional[dict]:
    """min / median / max (and the mean, which older records carry) of a window's samples."""
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"min": ordered[0], "median": median, "max": ordered[-1], "mean": sum(values) / len(values)}
