"""A torch-profiler trace of the decode kernels inside CUDA graphs, trimmed into a test fixture (GPU only).

Captures our indexer and sparse-MLA attention beside the stock implementations this GPU can run
(``dsv4kit.validation.implementations``: on an H200 SGLang's TileLang indexer and FlashMLA; on
sm_120 TileLang and FlashInfer), each called ``--calls`` times inside one CUDA graph per
implementation, with the inputs the kernel benchmarks use (``bench_indexer.make_bench_inputs``,
``bench_attention.build_layers``). Each replay sits in a ``step[DECODE bs=T]`` span, the name
SGLang 0.5.23's model runner gives a decode step, so ``dsv4kit.profile.trace`` reads it as it
reads a server's trace. The written file keeps only the kernel, memcpy/memset, launch and step
events (a few hundred KB at most), plus a ``dsv4kit`` block with the command, the device and
which implementations are in it. Run, on the GPU machine, from the checkout::

    python -m dsv4kit.validation.profile_trace -o tests/profiling/fixtures/h200_kernels.trace.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile

KEEP_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "user_annotation")
MAX_BYTES = 400_000


def _graph(torch, fn, calls: int):
    from dsv4kit.validation.graphs import capture

    graph = capture(torch, fn, calls)
    torch.cuda.synchronize()
    return graph


def build(torch, args, log):
    """[(label, batch, graph)] for every implementation of both targets that loads here."""
    from dsv4kit.validation.bench_attention import build_layers
    from dsv4kit.validation.bench_indexer import make_bench_inputs, table_pages
    from dsv4kit.validation.implementations import implementations

    graphs = []
    pages = table_pages(args.context)
    inputs = make_bench_inputs(torch, args.batch, args.c4_len, pages)
    impls, unavailable = implementations("indexer", "cuda")
    for name, why in unavailable.items():
        log(f"indexer {name}: {why}")
    for impl in impls:
        if impl.name == "sglang-torch":  # its whole-context copies would swamp a small fixture
            continue
        _add(graphs, f"indexer:{impl.name}", args.batch, lambda f=impl.fn: f(*inputs.args()), torch, args, log)
    layers = build_layers("c4", args.batch, args.context, 512, want_bytes=0, max_layers=2)
    impls, unavailable = implementations("attention", "cuda")
    for name, why in unavailable.items():
        log(f"attention {name}: {why}")
    for impl in impls:
        if impl.name.endswith("torch"):
            continue
        _add(graphs, f"attention:{impl.name}", args.batch, lambda f=impl.fn: f(**layers[0]), torch, args, log)
    return graphs


def _add(graphs, label, batch, fn, torch, args, log) -> None:
    try:
        graphs.append((label, batch, _graph(torch, fn, args.calls)))
    except Exception as exc:  # noqa: BLE001 - one implementation failing to capture is reported, not fatal
        log(f"{label}: not captured in a CUDA graph: {type(exc).__name__}: {str(exc)[:200]}")
        torch.cuda.synchronize()


def trim(data: dict, limit: int) -> dict:
    """Only the events the parser reads, with their arguments cut to what it uses."""
    events = []
    for e in data["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in KEEP_CATEGORIES:
            continue
        if e["cat"] == "user_annotation" and not str(e.get("name", "")).startswith("step["):
            continue
        args = {k: v for k, v in (e.get("args") or {}).items() if k in ("correlation", "device", "stream")}
        events.append({k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur") if k in e} | {"args": args})
    out = {"traceEvents": events, "schemaVersion": data.get("schemaVersion"),
           "deviceProperties": data.get("deviceProperties")}
    while len(json.dumps(out)) > limit and len(events) > 100:  # drop the latest replays first
        events = events[: int(len(events) * 0.8)]
        out["traceEvents"] = events
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.validation.profile_trace")
    parser.add_argument("-o", "--output", required=True, help="the fixture to write (.trace.json.gz)")
    parser.add_argument("--batch", type=int, default=16, help="decode tokens per step")
    parser.add_argument("--context", type=int, default=131072, help="configured context (the indexer's table width)")
    parser.add_argument("--c4-len", type=int, default=8192, help="c4 positions per row")
    parser.add_argument("--calls", type=int, default=4, help="calls per graph")
    parser.add_argument("--replays", type=int, default=2, help="profiled replays per graph")
    args = parser.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if not torch.cuda.is_available():
        print("error: no CUDA device is visible; this trace needs a GPU", file=sys.stderr)
        return 5
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    graphs = build(torch, args, log)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for label, batch, graph in graphs:
            for _ in range(args.replays):
                with record_function(f"step[DECODE bs={batch}]"):
                    graph.replay()
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.json")
        prof.export_chrome_trace(raw)
        with open(raw) as fh:
            data = trim(json.load(fh), MAX_BYTES)
    data["dsv4kit"] = {
        "command": "python -m dsv4kit.validation.profile_trace " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
        "torch": torch.__version__, "graphs": [label for label, _, _ in graphs],
    }
    tmp_out = args.output + ".tmp"
    with gzip.open(tmp_out, "wt", encoding="utf-8") as fh:
        json.dump(data, fh, separators=(",", ":"))
    os.replace(tmp_out, args.output)
    names = sorted({e["name"][:80] for e in data["traceEvents"] if e.get("cat") == "kernel"})
    log(f"wrote {args.output} ({os.path.getsize(args.output)} bytes); graphs: {[g for g, _, _ in graphs]}; "
        f"kernels: {names}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
