"""One torch-profiler Chrome trace (one TP rank) -> the decode time per kernel class.

What is counted (docs/profiling.md):

* GPU traces: every ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` event. Each is tied to its
  launch on the host through ``args.correlation`` (the ``cuda_runtime``/``cuda_driver`` launch,
  ``cudaGraphLaunch`` for a CUDA-graph replay), and the launch to the SGLang step span around it:
  ``step[DECODE bs=N]`` (a ``user_annotation`` SGLang 0.5.23's model runner opens around each
  forward). Only kernels of decode steps count. A trace without step spans (a kernel benchmark)
  counts every kernel as one window.
* CPU-only traces (no device events, e.g. the tests' stand-in): the top-level ``cpu_op`` events
  inside the step spans, with their host durations.

The step time is the median over decode steps of the span from the first kernel's start to the
last kernel's end (the host span's length on a CPU trace).
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import statistics
from pathlib import Path
from typing import Optional

from dsv4kit.profile.classes import CLASSES, classify, scope_class

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
STEP = re.compile(r"^step\[(?P<stage>[A-Z_]+) bs=(?P<bs>\d+)")


class TraceError(ValueError):
    """The file is not a torch-profiler Chrome trace this parser can read."""


def load(path: Path) -> dict:
    """The trace's JSON (``.json`` or gzip-compressed ``.json.gz``); TraceError naming the problem."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path.name}: not a readable Chrome trace ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path.name}: no traceEvents list (not a torch-profiler Chrome trace)")
    return data


class _Intervals:
    """Sorted, non-overlapping-per-thread host spans; ``find(tid, ts)`` -> the innermost holding ts."""

    def __init__(self, spans):  # spans: (tid, start, end, payload)
        self.by_tid: dict = {}
        for tid, start, end, payload in spans:
            self.by_tid.setdefault(tid, []).append((start, end, payload))
        for items in self.by_tid.values():
            items.sort(key=lambda s: s[0])
        self.starts = {tid: [s[0] for s in items] for tid, items in self.by_tid.items()}

    def find(self, tid, ts: float, reach: int = 64):
        items = self.by_tid.get(tid)
        if not items:
            return None
        i = bisect.bisect_right(self.starts[tid], ts) - 1
        for j in range(i, max(i - reach, -1), -1):  # nested spans: the innermost starts last
            start, end, payload = items[j]
            if start <= ts <= end:
                return payload
        return None


def _x(event) -> bool:
    return event.get("ph") == "X" and isinstance(event.get("ts"), (int, float))


def analyze(data: dict, *, name: str = "trace", steps_hint: Optional[int] = None) -> dict:
    """The decode breakdown of one rank's trace: per class (and implementation) microseconds per
    step and share, the step time, the batch size, and the names no rule knows."""
    events = [e for e in data["traceEvents"] if isinstance(e, dict) and _x(e)]
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    steps = []
    for e in events:
        if e.get("cat") == "user_annotation":
            match = STEP.match(str(e.get("name", "")))
            if match:
                steps.append(e)
    scopes = [e for e in events if e.get("cat") == "python_function" and scope_class(str(e.get("name", "")))]
    step_index = _Intervals(((e.get("tid"), e["ts"], e["ts"] + e.get("dur", 0), i) for i, e in enumerate(steps)))
    scope_index = _Intervals(((e.get("tid"), e["ts"], e["ts"] + e.get("dur", 0), scope_class(e["name"]))
                              for e in scopes))
    mode = "gpu" if device else "cpu"
    if mode == "gpu":
        launches = {}
        for e in events:
            if e.get("cat") in LAUNCH_CATEGORIES:
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    launches[corr] = e
        units = []
        for e in device:
            launch = launches.get((e.get("args") or {}).get("correlation"))
            units.append((e, launch))
    else:
        units = [(e, e) for e in _top_level_ops([e for e in events if e.get("cat") == "cpu_op"])]

    per_step: dict[int, list] = {}
    window: list = []
    for event, launch in units:
        if steps:
            if launch is None:
                continue
            index = step_index.find(launch.get("tid"), launch["ts"])
            if index is None or STEP.match(steps[index]["name"]).group("stage") != "DECODE":
                continue
            per_step.setdefault(index, []).append((event, launch))
        else:
            window.append((event, launch))
    if steps:
        decode_steps = [i for i, e in enumerate(steps) if STEP.match(e["name"]).group("stage") == "DECODE"]
        groups = [per_step.get(i, []) for i in decode_steps]
        batch = [int(STEP.match(steps[i]["name"]).group("bs")) for i in decode_steps]
    else:
        groups = [window] if window else []
        batch = []
    n_steps = len(groups) if steps else (steps_hint or 1)
    totals: dict[tuple[str, str], float] = {}
    unknown: dict[str, float] = {}
    spans = []
    for group in groups:
        if not group:
            continue
        if mode == "gpu":
            spans.append(max(e["ts"] + e.get("dur", 0) for e, _ in group) - min(e["ts"] for e, _ in group))
        for event, launch in group:
            kname = str(event.get("name", ""))
            if event.get("cat") in ("gpu_memcpy", "gpu_memset"):
                klass, impl = "memcpy", event["cat"]
            else:
                klass, impl = classify(kname)
            scoped = scope_index.find(launch.get("tid"), launch["ts"]) if launch is not None else None
            if scoped is not None:
                klass, impl = scoped
            dur = float(event.get("dur", 0) or 0)
            totals[(klass, impl)] = totals.get((klass, impl), 0.0) + dur
            if klass == "other":
                unknown[kname] = unknown.get(kname, 0.0) + dur
    if mode == "cpu" and steps:
        spans = [float(steps[i].get("dur", 0)) for i in decode_steps]
    return summarize(totals, unknown, n_steps=n_steps, step_spans_us=spans, batch=batch, mode=mode, name=name,
                     stepped=bool(steps))


def _top_level_ops(ops: list) -> list:
    """cpu_op events not inside another cpu_op of the same thread (their children would count twice)."""
    out = []
    by_tid: dict = {}
    for e in ops:
        by_tid.setdefault(e.get("tid"), []).append(e)
    for items in by_tid.values():
        items.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        end = -1.0
        for e in items:
            if e["ts"] >= end:
                out.append(e)
                end = e["ts"] + e.get("dur", 0)
    return out


def summarize(totals: dict, unknown: dict, *, n_steps: int, step_spans_us: list, batch: list, mode: str,
              name: str, stepped: bool) -> dict:
    """The breakdown dict (the JSON and record shape; see docs/profiling.md)."""
    n = max(n_steps, 1)
    total = sum(totals.values())
    classes = {}
    for klass in CLASSES:
        impls = {impl: us / n for (k, impl), us in totals.items() if k == klass}
        us = sum(impls.values())
        classes[klass] = {"us_per_step": round(us, 3), "share": round(us * n / total, 6) if total else 0.0,
                          "impls": {k: round(v, 3) for k, v in sorted(impls.items(), key=lambda kv: -kv[1])}}
    step_us = statistics.median(step_spans_us) if step_spans_us else None
    bs = statistics.median(batch) if batch else None
    return {
        "trace": name, "mode": mode, "decode_steps": n_steps if stepped else None, "stepped": stepped,
        "kernel_us_per_step": round(total / n, 3),
        "step_time_ms": round(step_us / 1000.0, 4) if step_us is not None else None,
        "batch_size": bs,
        "trace_tok_s": round(bs * 1e6 / step_us, 2) if bs and step_us else None,
        "classes": classes,
        "unknown": [{"name": k, "us_per_step": round(v / n, 3)} for k, v in sorted(unknown.items(), key=lambda kv: -kv[1])][:50],
    }


def analyze_file(path: Path, steps_hint: Optional[int] = None) -> dict:
    return analyze(load(path), name=Path(path).name, steps_hint=steps_hint)
