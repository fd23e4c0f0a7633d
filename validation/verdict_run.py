"""Measure the kernel verdict at this host's decode shapes (``dsv4kit validate``'s last step).

For each target, every implementation ``dsv4kit.validation.implementations`` loads on this device
(ours and SGLang's own, with which one stock SGLang runs by default) is run on the same inputs:
its error against the target's reference, then ``SAMPLES`` timings under CUDA-graph replay, each
the median of several replays. ``verdict.decide`` turns that into a recommendation.

Seams for the CPU tests: ``run(..., provider=, builders=, timer=, identity_fn=)``. The defaults
import torch, the kernels and the implementations module lazily.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from dsv4kit.validation import attention_heads as heads_of
from dsv4kit.validation import verdict as v

SAMPLES = 7
TARGETS = ("indexer", "attention", "indexer_fp4")
#: Short requests on a long context: the case the indexer exists for (and where stock is fast).
SHORT_TOKENS = 2048
#: Bench defaults (``dsv4kit bench --concurrency``): the decode batch sizes the host serves.
DEFAULT_CONCURRENCY = (1, 16, 64)
#: ``validate --local``'s context when none is given: the inventory's default dsv4_context_length.
DEFAULT_CONTEXT = 131072


def parse_concurrency(text: str) -> tuple:
    """``"1,16,64"`` -> (1, 16, 64); ValueError naming the problem (an empty item too)."""
    if any(not x.strip() for x in str(text).split(",")):
        raise ValueError(f"--concurrency {text!r} has an empty item; give comma-separated integers, e.g. 1,16,64")
    try:
        values = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--concurrency {text!r} must be comma-separated integers, e.g. 1,16,64") from None
    if not values or any(c < 1 for c in values) or len(set(values)) != len(values):
        raise ValueError(f"--concurrency {text!r} needs distinct values >= 1, e.g. 1,16,64")
    return values


@dataclass(frozen=True)
class Shape:
    target: str
    label: str
    params: dict


def decode_shapes(target: str, context_length: int, concurrency: Sequence[int],
                  decode_tp: int = heads_of.DEFAULT_DECODE_TP, backend: str = heads_of.DEFAULT_BACKEND) -> list[Shape]:
    """The decode shapes of a host: one per concurrency (decode batch = concurrency), at its context.

    Indexer: the page table spans the context; every row holds ``SHORT_TOKENS`` (a short request)
    and, separately, the full context. Attention: c4 and c128 layers, T = concurrency tokens,
    ``seq_len`` = the context, and the heads one GPU of the TP ``decode_tp`` decode server hands
    the kernel, padded as SGLang pads them for ``backend`` (``attention_heads.kernel_heads``).
    """
    shapes = []
    for c in concurrency:
        if target in ("indexer", "indexer_fp4"):
            for tokens in sorted({min(SHORT_TOKENS, context_length), context_length}):
                shapes.append(Shape(target, f"B={c} ctx={context_length} L={tokens}",
                                    {"batch": c, "context": context_length, "tokens": tokens}))
        elif target == "attention":
            real, padded = heads_of.kernel_heads(decode_tp, c, backend)
            for kind in ("c4", "c128"):
                shapes.append(Shape(target, f"{kind} T={c} ctx={context_length} {heads_of.label(real, padded)}",
                                    {"kind": kind, "T": c, "context": context_length, "heads": real,
                                     "padded_heads": padded}))
        else:
            raise ValueError(f"unknown verdict target {target!r}; known: {', '.join(TARGETS)}")
    return shapes


#: Prefill chunks the indexer verdict also measures (docs/indexer.md, "Prefill and verify"): one
#: request's extend chunk of ROWS rows (one per token, causal lengths, one shared page-table row)
#: after a prefix of PREFIX tokens, where prefix + rows fits the context.
PREFILL_ROWS = (1024, 4096, 8192)
PREFILL_PREFIXES = (0, 32768, 126976)


def prefill_shapes(target: str, context_length: int) -> list[Shape]:
    """The prefill chunks of the indexer verdict (none for the other targets)."""
    if target != "indexer":
        return []
    return [Shape(target, f"prefill R={rows} prefix={prefix // 1024}K ctx={context_length}",
                  {"prefill": True, "rows": rows, "prefix": prefix, "context": context_length})
            for rows in PREFILL_ROWS for prefix in PREFILL_PREFIXES if prefix + rows <= context_length]


# --------------------------------------------------------------------------- identity
def parse_nvrm(line: str) -> Optional[str]:
    """The driver version from /proc/driver/nvidia/version's first line ("NVRM version: ... 580.95.05 ...")."""
    match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", f" {line} ")
    return match.group(1) if match else None


def nvidia_smi_gpus() -> dict:
    """{index: (name, driver)} from nvidia-smi, the tool `dsv4kit rollout plan` reads the host with."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            found[int(parts[0])] = (parts[1], parts[2])
    return found


def driver_version(smi: Optional[dict] = None) -> Optional[str]:
    """The NVIDIA driver version: /proc/driver/nvidia/version, else nvidia-smi; None without one."""
    try:
        with open("/proc/driver/nvidia/version") as fh:
            found = parse_nvrm(fh.readline())
            if found:
                return found
    except OSError:
        pass
    smi = nvidia_smi_gpus() if smi is None else smi
    return next(iter(smi.values()))[1] if smi else None


def kernels_digest() -> Optional[str]:
    """sha256 over the dsv4kit kernel sources (``dsv4kit/kernels/*.py``, by name): which kernels a
    verdict measured. The same function on the control machine gives the kernels it would ship."""
    import hashlib
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("dsv4kit.kernels")
    if spec is None or not spec.submodule_search_locations:
        return None
    digest = hashlib.sha256()
    for path in sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def sglang_version() -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def identity(device: str) -> dict:
    """What identifies the environment a verdict holds for: GPU model, driver, SGLang, and the rest."""
    import platform

    smi = nvidia_smi_gpus() if device == "cuda" else {}
    info = {"hostname": platform.node(), "device": device, "gpu": None, "gpu_torch": None, "capability": None,
            "driver": driver_version(smi), "sglang": sglang_version(), "torch": None, "cuda": None,
            "triton": None, "dsv4kit": None, "kernels_sha256": kernels_digest(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    from dsv4kit.validation.environment import software_versions, torch_device

    info.update(software_versions())
    torch_side = torch_device(device)
    if device == "cuda" and torch_side:
        info["gpu_torch"], info["capability"] = torch_side["gpu"], torch_side["capability"]
        # nvidia-smi's name of the visible GPU (CUDA_DEVICE_ORDER=PCI_BUS_ID: its index), as the
        # host is read when a report is matched to it; torch's name where nvidia-smi has none.
        visible = (info["cuda_visible_devices"] or "").split(",")[0].strip()
        named = smi.get(int(visible)) if visible.isdigit() else None
        info["gpu"] = named[0] if named else info["gpu_torch"]
    return info


# --------------------------------------------------------------------------- defaults (GPU)
def default_provider(target: str, device):
    """The implementations module of the harness (loaded ones, and {name: why unavailable})."""
    from dsv4kit.validation.implementations import implementations

    return implementations(target, device)


def _build_indexer(shape: Shape, device: str):
    """(calls, check): calls(fn) -> zero-arg callables to time; check(fn) -> rel over [0, L)."""
    import torch

    from dsv4kit.kernels.indexer_reference import compare, exact_logits_f64
    from dsv4kit.validation.bench_indexer import make_bench_inputs, table_pages

    p = shape.params
    if p.get("prefill"):
        from dsv4kit.kernels.indexer_reference import make_prefill_inputs
        from dsv4kit.validation.bench_indexer_prefill import sample_rows

        inputs = make_prefill_inputs([(p["prefix"], p["rows"])], device=device)
        args = inputs.args()
        rows = torch.tensor(sample_rows(p["rows"]), device=inputs.q_fp8.device)
        lengths = inputs.seq_lens[rows]
        reference = exact_logits_f64(inputs.q_fp8[rows], inputs.kvcache, inputs.weight[rows], lengths,
                                     inputs.page_table[rows], inputs.max_seq_len)

        def check_rows(fn) -> float:  # a sample of rows: the float64 reference is per row
            return compare(fn(*args)[rows], reference, lengths)["rel"]

        return (lambda fn: [lambda: fn(*args)]), check_rows
    pages = table_pages(p["context"])
    inputs = make_bench_inputs(torch, p["batch"], p["tokens"] // 4, pages, device=device)
    args = inputs.args()
    reference = exact_logits_f64(*args[:5], args[6])

    def check(fn) -> float:
        return compare(fn(*args), reference, inputs.seq_lens)["rel"]  # the tail is nobody's: not compared

    return (lambda fn: [lambda: fn(*args)]), check


def _build_attention(shape: Shape, device: str):
    import torch

    from dsv4kit.kernels.sparse_mla_reference import compare, sparse_mla_reference
    from dsv4kit.validation.bench_attention import build_layers

    p = shape.params
    width = 512 if p["kind"] == "c4" else p["context"] // 128 + 64
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size if device == "cuda" else 0
    layers = build_layers(p["kind"], p["T"], p["context"], width, 3 * l2,  # several layers: not served from L2
                          heads=p["heads"], padded_heads=p["padded_heads"])
    reference, _ = sparse_mla_reference(**layers[0])

    def check(fn) -> float:
        out, _ = fn(**layers[0])
        stats = compare(out, reference, p["heads"])
        return stats["rel"] if stats["nan_free"] else math.nan

    return (lambda fn: [(lambda kw=kw: fn(**kw)) for kw in layers]), check


def _build_indexer_fp4(shape: Shape, device: str):
    """FP8 and FP4 caches with the same fragmented page table; each implementation gets the
    inputs of its ``cache_format`` (dsv4kit.validation.implementations)."""
    import torch

    from dsv4kit.kernels import indexer_fp4_reference as r4
    from dsv4kit.kernels import indexer_reference as r8
    from dsv4kit.validation import bench_indexer_fp4 as b4

    p = shape.params
    pages = b4.base.table_pages(p["context"])
    point = {"batch": p["batch"], "heads": 64, "c4_len": p["tokens"] // 4, "pages": pages}
    fp8_args, fp4_args = (a[0] for a in b4.make_point_inputs(torch, point, 1, device))
    args = {"fp8": fp8_args, "fp4": fp4_args}
    exact = {"fp8": r8.exact_logits_f64(*fp8_args[:5], fp8_args[6]),
             "fp4": r4.exact_logits_f64(*fp4_args[:5], fp4_args[6])}

    def chosen(fn):
        return getattr(fn, "cache_format", "fp8")

    def check(fn) -> float:
        fmt = chosen(fn)
        return r8.compare(fn(*args[fmt]), exact[fmt], args[fmt][3])["rel"]

    return (lambda fn: [lambda: fn(*args[chosen(fn)])]), check


BUILDERS = {"indexer": _build_indexer, "attention": _build_attention,
            "indexer_fp4": _build_indexer_fp4}


def graph_samples(calls: list, samples: int = SAMPLES, target_ms: float = 2.0) -> list[float]:
    """``samples`` timings in µs per call: the calls captured in one CUDA graph, replayed.

    Each sample is the median of 3 timed batches of replays, so one slow replay does not decide it.
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up (JIT, autotune) outside capture
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for call in calls:
        call()
    end.record()
    torch.cuda.synchronize()
    repeat = int(max(1, min(50, math.ceil(target_ms / max(start.elapsed_time(end), 1e-3)))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for _ in range(repeat):
            for call in calls:
                call()
    graph.replay()
    torch.cuda.synchronize()
    per_call = repeat * len(calls)
    out = []
    for _ in range(samples):
        batch = []
        for _ in range(3):
            start.record()
            for _ in range(5):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            batch.append(start.elapsed_time(end) * 1e3 / (5 * per_call))
        out.append(sorted(batch)[1])
    del graph
    torch.cuda.synchronize()
    return out


def _bars() -> dict:
    from dsv4kit.validation import attention_suite, indexer_fp4_suite, indexer_suite

    return {"indexer": indexer_suite.KERNEL_REL_BAR, "attention": attention_suite.KERNEL_REL_BAR,
            "indexer_fp4": indexer_fp4_suite.KERNEL_REL_BAR}


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return type(exc).__name__ + (f": {text[0][:200]}" if text else "")


# --------------------------------------------------------------------------- the run
def run(targets: Sequence[str], context_length: int, concurrency: Sequence[int], device: str,
        interpret: bool, *, provider: Optional[Callable] = None, builders: Optional[dict] = None,
        timer: Optional[Callable] = None, identity_fn: Callable[[str], dict] = identity,
        bars: Optional[dict] = None, progress: Callable[[str], None] = lambda s: None,
        decode_tp: int = heads_of.DEFAULT_DECODE_TP, backend: str = heads_of.DEFAULT_BACKEND) -> dict:
    """Measure every available implementation of each target at the host's decode shapes (and,
    for the indexer, its prefill chunks); the section."""
    ident = identity_fn(device)
    shapes_info = {"context_length": context_length, "concurrency": list(concurrency), "decode_tp": decode_tp,
                   "attention_backend": backend}
    if interpret or device != "cuda":
        if provider is None:  # a stand-in provider (tests) measures anywhere
            return v.skipped(ident, shapes_info, "no GPU: timings on the Triton interpreter or the CPU "
                                                 "mean nothing for a rollout")
    provider = provider or default_provider
    builders = builders or BUILDERS
    timer = timer or graph_samples
    bars = bars or _bars()
    verdicts, problems = [], []
    for target in targets:
        shapes = (decode_shapes(target, context_length, concurrency, decode_tp, backend)
                  + prefill_shapes(target, context_length))
        try:
            impls, unavailable = provider(target, device)
        except Exception as exc:  # noqa: BLE001 - no implementations: no evidence, said why
            problems.append(f"{target}: the implementations could not be loaded: {_short(exc)}")
            verdicts.append(v.decide(target, [], {"*": _short(exc)}, [s.label for s in shapes]))
            continue
        rows = []
        for shape in shapes:
            progress(f"verdict {target} {shape.label}: {', '.join(i.name for i in impls)}")
            try:
                make_calls, check = builders[target](shape, device)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{target} {shape.label}: inputs could not be built: {_short(exc)}")
                continue
            for impl in impls:
                rel, samples, error = None, (), ""
                try:
                    rel = float(check(impl.fn))
                    samples = tuple(float(x) for x in timer(make_calls(impl.fn)))
                except Exception as exc:  # noqa: BLE001 - one implementation failing is a finding
                    error = _short(exc)
                rows.append(v.Measurement(target, impl.name, bool(impl.stock_default), shape.label, rel,
                                          bars[target], samples, error))
            del make_calls, check
            _free(device)
        verdicts.append(v.decide(target, rows, unavailable, [s.label for s in shapes]))
    status = "incomplete" if problems else "complete"
    return v.section(verdicts, ident, shapes_info, status=status, reason="; ".join(problems))


def _free(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
