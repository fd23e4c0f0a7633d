"""Benchmark of the sparse-MLA decode kernel under CUDA-graph replay (GPU only).

``python -m dsv4kit.validation.bench_attention [--out DIR] [--quick]``

For T in {1, 16, 64} and H = 64 it times, per layer call:

* c4 layers: SWA 128 + top-512 c4 slots (all valid);
* c128 layers at 1M context: SWA 128 + an 8256-wide c128 index row of which a 128K-token request
  fills 1024 slots;

for the fused MMA kernel and the SIMT baseline ("before"), and compares both with the floor
``max(KV bytes / copy bandwidth, bf16 MMA FLOPs / bf16 matmul rate)``, the two rates measured in
the same run (``KV bytes = T * valid entries * 584``; ``FLOPs = 4 * T * H * valid * 512`` for
QKᵀ and PV). Each timed graph calls the kernel on several distinct layers whose KV together
exceeds the L2 cache, as the model's layers do, so the KV comes from HBM. A sweep over the valid
c128 length at fixed width shows that the time follows the valid length, not the width. Every
timed configuration is first checked against the float32 reference.

Writes ``bench_attention.json`` (device, versions, measured rates, per point times in us and
ratios, targets met / missed), ``bench_attention.md`` (the table) and ``bench_attention.png``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from typing import Callable, Optional

from dsv4kit.validation import bench_cli

H = 64
C128_WIDTH = 8256
C128_VALID_128K = 131072 // 128  # 1024
TARGET_FLOOR_RATIO = 2.0
TARGET_SPEEDUP = 20.0
LENGTH_SWEEP = [128, 512, 1024, 2048, 4096, 8192]
DEVICE = "cuda"  # the tests run the bookkeeping on "cpu" with the timers replaced


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Measured rates
# --------------------------------------------------------------------------------------------

def measure_copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (``dsv4kit.validation.timing``)."""
    import torch

    from dsv4kit.validation import timing

    return timing.copy_bandwidth(torch, nbytes)


def measure_bf16_matmul_rate(n: int = 8192) -> float:
    """bf16 tensor-core FLOP/s on random data (``dsv4kit.validation.timing``)."""
    import torch

    from dsv4kit.validation import timing

    return timing.bf16_rate(torch, n)


# --------------------------------------------------------------------------------------------
# Inputs: distinct layers
# --------------------------------------------------------------------------------------------

def _clone_cache(cache):
    from dsv4kit.kernels.sparse_mla_reference import v4_cache_view

    rows = cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))
    return v4_cache_view(rows.clone().reshape(-1), cache.shape[0], cache.shape[1])


def build_layers(kind: str, T: int, seq_len: int, extra_width: int, want_bytes: int, max_layers: int = 12,
                 heads: Optional[int] = None, padded_heads: Optional[int] = None):
    """Layer 0 from the input generator (unique slots per token), the others as copies of its
    caches in fresh memory, until their KV bytes reach ``want_bytes``. q has ``heads`` real heads
    in ``padded_heads`` (default: the module's ``H``, unpadded)."""
    import torch

    from dsv4kit.kernels.sparse_mla_reference import make_inputs

    heads = heads or H
    padded = padded_heads or heads
    base = make_inputs(T=T, heads=heads, padded_heads=padded, swa_page_size=256, extra=kind, extra_width=extra_width,
                       seq_lens=[seq_len] * T, nan_padding=False, strided_q=False, unique_slots=True,
                       seed=T * 7 + extra_width, device=DEVICE)
    kw = dict(base.kwargs)
    kw["q"] = _in_64_heads(kw["q"])
    layer_bytes = kw["k_cache"].untyped_storage().nbytes() + kw["extra_k_cache"].untyped_storage().nbytes()
    count = max(2, min(max_layers, math.ceil(want_bytes / max(1, layer_bytes))))
    layers = [kw]
    for _ in range(count - 1):
        other = dict(kw)
        other["k_cache"] = _clone_cache(kw["k_cache"])
        other["extra_k_cache"] = _clone_cache(kw["extra_k_cache"])
        other["q"] = _in_64_heads(torch.randn(kw["q"].shape, device=kw["q"].device).to(torch.bfloat16))
        layers.append(other)
    return layers


def _in_64_heads(q):
    """q as the leading heads of a 64-head buffer, as SGLang allocates it where it pads (an
    implementation that needs 64 heads, FlashMLA on sm_90, widens it without a copy)."""
    if q.shape[2] >= 64:
        return q
    wide = q.new_zeros(q.shape[0], q.shape[1], 64, q.shape[3])
    wide[:, :, :q.shape[2]].copy_(q)
    return wide[:, :, :q.shape[2]]


def with_extra_length(layers, valid: int):
    """The same layers with the c128 rows refilled to ``valid`` ascending slots (width unchanged)."""
    import torch

    out = []
    for kw in layers:
        new = dict(kw)
        slots_avail = kw["extra_k_cache"].shape[0] * kw["extra_k_cache"].shape[1]
        T, _, width = kw["extra_indices_in_kvcache"].shape
        idx = torch.full((T, 1, width), -1, dtype=torch.int32, device=DEVICE)
        base = torch.arange(valid, device=DEVICE, dtype=torch.int64)
        for t in range(T):
            start = (t * valid) % max(1, slots_avail - valid)
            idx[t, 0, :valid] = (start + base).clamp_max(slots_avail - 1).to(torch.int32)
        new["extra_indices_in_kvcache"] = idx
        new["extra_topk_length"] = torch.full((T,), valid, dtype=torch.int32, device=DEVICE)
        out.append(new)
    return out


# --------------------------------------------------------------------------------------------
# Timing under graph replay
# --------------------------------------------------------------------------------------------

def time_under_graph(fn, layers, target_ms: float = 3.0, replays: int = 7) -> float:
    """Microseconds per layer call: one graph of ``reps`` passes over all layers (distinct
    inputs, so cold in L2), the median of ``replays`` replays (``dsv4kit.validation.timing``)."""
    import torch

    from dsv4kit.validation import timing

    calls = [lambda kw=kw: fn(**kw) for kw in layers]
    one_pass_us = timing.graph_time_us(torch, calls, rounds=1, samples=1) * len(layers)
    reps = int(max(1, min(50, math.ceil(target_ms * 1e3 / max(one_pass_us, 1.0)))))
    return timing.graph_time_us(torch, calls, rounds=reps, samples=replays)


def check_against_reference(fn, kw) -> float:
    from dsv4kit.kernels.sparse_mla_reference import compare, sparse_mla_reference

    ref, _ = sparse_mla_reference(**kw)
    out, _ = fn(**kw)
    stats = compare(out, ref, kw["q"].shape[2])
    return stats["rel"] if stats["nan_free"] else math.nan


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------

def device_properties() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(), "capability": "sm_%d%d" % torch.cuda.get_device_capability(),
            "sm_count": props.multi_processor_count, "l2_bytes": getattr(props, "L2_cache_size", 50 << 20)}


def _versions(props: dict) -> dict:
    import torch
    import triton

    from dsv4kit.kernels.sparse_mla_decode import TILES_ENV

    info = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "host": platform.node(), TILES_ENV: os.environ.get(TILES_ENV),
            MMA_SYNC_ENV: os.environ.get(MMA_SYNC_ENV), **props}
    try:
        from dsv4kit import __version__

        info["dsv4kit"] = __version__
    except ImportError:
        pass
    return info


def _point(kind: str, T: int, valid_swa: int, valid_extra: int, width_extra: int, rates: dict) -> dict:
    valid = valid_swa + valid_extra
    kv_bytes = T * valid * 584
    flops = 4 * T * H * valid * 512
    floor_bw = kv_bytes / rates["copy_bytes_per_s"] * 1e6
    floor_mma = flops / rates["bf16_flops_per_s"] * 1e6
    return {"layer": kind, "T": T, "H": H, "valid_swa": valid_swa, "valid_extra": valid_extra,
            "width": 128 + width_extra, "kv_bytes": kv_bytes, "mma_flops": flops,
            "floor_bandwidth_us": floor_bw, "floor_mma_us": floor_mma, "floor_us": max(floor_bw, floor_mma)}


def run_benchmark(quick: bool, checkpoint: Callable[[dict], None] = lambda partial: None) -> dict:
    import torch

    from dsv4kit.kernels import sparse_mla_decode as dec
    from dsv4kit.kernels.sparse_mla_simt import simt_sparse_mla_decode

    torch.manual_seed(0)
    started = time.time()
    _log("measuring copy bandwidth and bf16 matmul rate ...")
    rates = {"copy_bytes_per_s": measure_copy_bandwidth(), "bf16_flops_per_s": measure_bf16_matmul_rate()}
    _log(f"  copy {rates['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {rates['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s")
    props = device_properties()
    l2 = props["l2_bytes"]
    want_bytes = 3 * l2

    points = []
    token_counts = [1, 64] if quick else [1, 16, 64]
    c128_layers_t64 = None
    for kind, seq_len, width in (("c4", 131072, 512), ("c128", 131072, C128_WIDTH)):
        for T in token_counts:
            _log(f"{kind} T={T}: building layers ...")
            layers = build_layers(kind, T, seq_len, width, want_bytes)
            valid_extra = 512 if kind == "c4" else C128_VALID_128K
            p = _point(kind, T, 128, valid_extra, width, rates)
            p["layers_in_graph"] = len(layers)
            p["kernel_rel"] = check_against_reference(dec.flash_mla_with_kvcache_sm120, layers[0])
            p["simt_rel"] = check_against_reference(simt_sparse_mla_decode, layers[0])
            p["kernel_us"] = time_under_graph(dec.flash_mla_with_kvcache_sm120, layers)
            p["simt_us"] = time_under_graph(simt_sparse_mla_decode, layers, target_ms=1.0, replays=3)
            p["speedup_vs_simt"] = p["simt_us"] / p["kernel_us"]
            p["ratio_to_floor"] = p["kernel_us"] / p["floor_us"]
            p["simt_ratio_to_floor"] = p["simt_us"] / p["floor_us"]
            cfg = dec.default_config(H, dec.device_capability(layers[0]["q"].device), T)
            p["num_splits"] = dec.choose_num_splits(T, -(-H // cfg.block_h), 128 + width, cfg.block_n,
                                                    props["sm_count"])
            _log(f"  kernel {p['kernel_us']:.1f} us (rel {p['kernel_rel']:.2e}), SIMT {p['simt_us']:.1f} us, "
                 f"floor {p['floor_us']:.1f} us -> {p['ratio_to_floor']:.2f}x floor, "
                 f"{p['speedup_vs_simt']:.1f}x vs SIMT")
            points.append(p)
            if kind == "c128" and T == 64:
                c128_layers_t64 = layers
            else:
                del layers
            torch.cuda.empty_cache()

    checkpoint({"rates": rates, "points": points})
    # c128: time follows the valid length at a fixed 8256 width.
    sweep = []
    if c128_layers_t64 is not None or quick:
        layers = c128_layers_t64 or build_layers("c128", 64, 131072, C128_WIDTH, want_bytes)
        lengths = [128, 1024, 8192] if quick else LENGTH_SWEEP
        for valid in lengths:
            lay = with_extra_length(layers, valid)
            s = _point("c128", 64, 128, valid, C128_WIDTH, rates)
            s["kernel_rel"] = check_against_reference(dec.flash_mla_with_kvcache_sm120, lay[0])
            s["kernel_us"] = time_under_graph(dec.flash_mla_with_kvcache_sm120, lay)
            if valid in (lengths[0], lengths[-1]):
                s["simt_us"] = time_under_graph(simt_sparse_mla_decode, lay, target_ms=1.0, replays=3)
            s["ratio_to_floor"] = s["kernel_us"] / s["floor_us"]
            _log(f"c128 T=64 valid={valid}: kernel {s['kernel_us']:.1f} us, floor {s['floor_us']:.1f} us"
                 + (f", SIMT {s['simt_us']:.1f} us" if "simt_us" in s else ""))
            sweep.append(s)
            del lay
        del layers
        torch.cuda.empty_cache()

    checkpoint({"rates": rates, "points": points, "c128_length_sweep": sweep})
    # Tile / pipelining variants are timed by ``--sweep`` (bench_attention_sweep.json).
    target_point = next((p for p in points if p["layer"] == "c4" and p["T"] == 64), None)
    targets = {}
    if target_point:
        targets["c4_T64_within_2x_floor"] = {
            "value": target_point["ratio_to_floor"], "target": f"<= {TARGET_FLOOR_RATIO}",
            "met": target_point["ratio_to_floor"] <= TARGET_FLOOR_RATIO}
        targets["c4_T64_20x_faster_than_simt"] = {
            "value": target_point["speedup_vs_simt"], "target": f">= {TARGET_SPEEDUP}",
            "met": target_point["speedup_vs_simt"] >= TARGET_SPEEDUP}
    if len(sweep) >= 2:
        by_len = {s["valid_extra"]: s["kernel_us"] for s in sweep}
        lo, hi = min(by_len), max(by_len)
        growth = by_len[hi] / by_len[lo]
        targets["c128_time_follows_valid_length"] = {
            "value": growth, "target": f"time({hi} valid) / time({lo} valid) >= 2 at width {C128_WIDTH}",
            "met": growth >= 2.0}
    correct = all((p.get("kernel_rel", 1.0) or 1.0) <= 1e-2 for p in points + sweep)
    targets["kernel_rel_le_1e-2_on_all_points"] = {"value": max(p["kernel_rel"] for p in points + sweep),
                                                   "target": "<= 1e-2", "met": correct}
    return {
        "schema": 1, "kind": "dsv4kit-bench-attention",
        "command": "python -m dsv4kit.validation.bench_attention" + (" --quick" if quick else ""),
        "started_unix": started, "seconds": round(time.time() - started, 1),
        "environment": _versions(props), "rates": rates, "l2_bytes": l2,
        "default_config": dec.default_config(H, dec.device_capability(torch.device(DEVICE))).__dict__,
        "points": points, "c128_length_sweep": sweep, "targets": targets,
        "all_targets_met": all(t["met"] for t in targets.values()),
    }


# --------------------------------------------------------------------------------------------
# Variant sweep (diagnostics): several tile / pipelining variants timed in one run
# --------------------------------------------------------------------------------------------

MMA_SYNC_ENV = "DISABLE_MMA_V3"  # Triton: lower tl.dot to mma.sync (MMAv2) on sm_90, as on sm_120


def sm120_variants() -> list:
    """Variants of ``--sweep`` on sm_120 and of ``--sweep --mma-sync`` on sm_90: the sm_120 code path
    (tiled kernel) in shapes that fit sm_120's 101376 bytes of shared memory a block
    (``tests/kernels/test_attention_aot.py`` builds each for sm_120)."""
    from dsv4kit.kernels.sparse_mla_decode import DecodeConfig as D, default_config

    variants = [("default", default_config(H, (12, 0)), None),
                ("h32_n16_w8_pf", D(32, 16, 8, 1, 1), None),
                ("h32_n32_w8_s2", D(32, 32, 8, 2, 0), None),
                ("h32_n32_w8_no_prefetch", D(32, 32, 8, 1, 0), None),
                ("h16_n32_w4_pf", D(16, 32, 4, 1, 1), None),
                ("h32_n16_w4_pf", D(32, 16, 4, 1, 1), None),
                ("h32_n32_w4_pf", D(32, 32, 4, 1, 1), None),
                ("h32_n32_w8_pf_nosplit", default_config(H, (12, 0)), 1)]
    return _unique(variants)


def _unique(variants: list) -> list:
    seen, out = set(), []
    for name, cfg, splits in variants:
        if (cfg, splits) not in seen:
            seen.add((cfg, splits))
            out.append((name, cfg, splits))
    return out


def sweep_variants(capability: tuple) -> list:
    """(name, DecodeConfig, num_splits for T=64 or None) tried by ``--sweep`` on this GPU."""
    from dsv4kit.kernels.sparse_mla_decode import DecodeConfig as D, default_config

    if capability[0] == 12:  # the RTX PRO 6000 itself: only shapes that fit its shared memory
        return sm120_variants()

    variants = [("default", default_config(H, capability), None),
                ("h64_wide_n64_w8_s3", D(64, 64, 8, 3, 0, True), None),
                ("h64_wide_n64_w8_s2", D(64, 64, 8, 2, 0, True), None),
                ("h64_wide_n32_w8_s3", D(64, 32, 8, 3, 0, True), None),
                ("h64_wide_n32_w8_s2", D(64, 32, 8, 2, 0, True), None),
                ("h64_wide_n64_w8_s2_idx_ahead", D(64, 64, 8, 2, 2, True), None),
                ("h64_wide_n64_w8_s3_nosplit", D(64, 64, 8, 3, 0, True), 1),
                ("h64_wide_n64_w8_s3_split3", D(64, 64, 8, 3, 0, True), 3),
                ("h32_n32_w8_pf", D(32, 32, 8, 1, 1), None),
                ("h16_n32_w4_pf", D(16, 32, 4, 1, 1), None),
                ("h32_n16_w8_pf", D(32, 16, 8, 1, 1), None)]
    return _unique(variants)


def compiled_mma_kinds() -> dict:
    """Which MMA instructions the decode kernels compiled in this process use, from their PTX:
    ``{"mma.sync": bool, "wgmma": bool}`` (``--mma-sync`` records it to show the flag took effect).
    Reads Triton's per-device kernel caches; empty when this Triton keeps them elsewhere."""
    from dsv4kit.kernels import sparse_mla_decode as dec

    kinds = {}
    for fn in dec.DECODE_KERNELS:
        for caches in getattr(fn, "device_caches", {}).values():
            for compiled in (caches[0].values() if caches else ()):
                ptx = compiled.asm.get("ptx", "")
                kinds["mma.sync"] = kinds.get("mma.sync", False) or "mma.sync" in ptx
                kinds["wgmma"] = kinds.get("wgmma", False) or "wgmma" in ptx
    return kinds


def _zero_length(layers):
    """The same layers with every length 0: the launch + prologue/epilogue cost of a call."""
    import torch

    out = []
    for kw in layers:
        new = dict(kw)
        new["topk_length"] = torch.zeros_like(kw["topk_length"])
        new["extra_topk_length"] = torch.zeros_like(kw["extra_topk_length"])
        out.append(new)
    return out


def run_sweep(quick: bool = False, checkpoint: Callable[[dict], None] = lambda partial: None,
              mma_sync: bool = False) -> dict:
    """Each variant is checked against the float32 reference (c4 T=64 and T=1) before it is timed.

    Times per layer call under graph replay: c4 at T = 64 / 16 / 1 over layers spread across
    3x L2 (as the benchmark), c4 T=64 on a single layer (KV resident in L2: separates DRAM /
    TLB latency from the rest), c4 T=64 with all lengths 0 (launch + fixed cost), and c128 T=64
    for the two fastest variants.
    """
    import torch

    from dsv4kit.kernels import sparse_mla_decode as dec

    started = time.time()
    props = device_properties()
    want_bytes = 3 * props["l2_bytes"]
    cap = dec.device_capability(torch.device(DEVICE))
    layers = {T: build_layers("c4", T, 131072, 512, want_bytes) for T in (1, 16, 64)}
    small = layers[64][:1]
    zero = _zero_length(layers[64][:1])
    results = []
    variants = sm120_variants() if mma_sync else sweep_variants(cap)
    for name, cfg, splits in variants[: 4 if quick else None]:
        def fn(cfg=cfg, splits=splits, **kw):
            return dec.flash_mla_with_kvcache_sm120(config=cfg, num_splits=splits, **kw)

        def fn_auto(cfg=cfg, **kw):
            return dec.flash_mla_with_kvcache_sm120(config=cfg, **kw)

        entry = {"name": name, "config": cfg.__dict__.copy(), "num_splits_T64": splits or "auto"}
        t0 = time.time()
        try:
            # Three calls in a row at T=64 (nothing may carry over from one call to the next).
            entry["rel_T64"] = max(check_against_reference(fn, layers[64][0]) for _ in range(3))
            entry["rel_T16"] = check_against_reference(fn_auto, layers[16][0])
            entry["rel_T1"] = check_against_reference(fn_auto, layers[1][0])
            ok = all(not math.isnan(v) and v <= 1e-2 for v in (entry["rel_T64"], entry["rel_T16"], entry["rel_T1"]))
            entry["correct"] = ok
            if ok:
                entry["c4_T64_us"] = time_under_graph(fn, layers[64])
                entry["c4_T64_l2_resident_us"] = time_under_graph(fn, small)
                entry["c4_T64_zero_length_us"] = time_under_graph(fn, zero)
                entry["c4_T16_us"] = time_under_graph(fn_auto, layers[16])
                entry["c4_T1_us"] = time_under_graph(fn_auto, layers[1])
                # Still right after hundreds of graph-replayed launches.
                entry["rel_T64_after_replays"] = check_against_reference(fn, layers[64][0])
                entry["correct"] = entry["rel_T64_after_replays"] <= 1e-2
        except Exception as exc:  # noqa: BLE001 - a variant that does not build is a result too
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        entry["seconds"] = round(time.time() - t0, 1)
        _log(f"sweep {name}: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in entry.items() if k not in ("name", "config")))
        results.append(entry)
        checkpoint({"variants": results})
    del layers, small, zero
    torch.cuda.empty_cache()
    timed = sorted((e for e in results if "c4_T64_us" in e), key=lambda e: e["c4_T64_us"])
    if timed:
        c128 = build_layers("c128", 64, 131072, C128_WIDTH, want_bytes)
        for entry in timed[:2]:
            cfg = dec.DecodeConfig(**entry["config"])
            splits = None if entry["num_splits_T64"] == "auto" else entry["num_splits_T64"]

            def fn(cfg=cfg, splits=splits, **kw):
                return dec.flash_mla_with_kvcache_sm120(config=cfg, num_splits=splits, **kw)
            try:
                entry["rel_c128_T64"] = check_against_reference(fn, c128[0])
                entry["c128_T64_us"] = time_under_graph(fn, c128)
            except Exception as exc:  # noqa: BLE001
                entry["c128_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            _log(f"sweep {entry['name']}: c128 T=64 {entry.get('c128_T64_us', entry.get('c128_error'))}")
        del c128
        torch.cuda.empty_cache()
    return {"schema": 1, "kind": "dsv4kit-bench-attention-sweep",
            "command": "python -m dsv4kit.validation.bench_attention --sweep" + (" --mma-sync" if mma_sync else "")
            + (" --quick" if quick else ""),
            "mma": "mma.sync (DISABLE_MMA_V3=1: the sm_120 code path)" if mma_sync else "default for the GPU",
            "compiled_mma_kinds": compiled_mma_kinds(),
            "started_unix": started, "seconds": round(time.time() - started, 1),
            "environment": _versions(props), "variants": results,
            "fastest_c4_T64": timed[0]["name"] if timed else None}


def _dim_split(config: dict) -> int:
    """Programs the 512 output dims are spread over (run 3 recorded a count, run 5 a flag; both
    kernels were removed after their runs)."""
    value = config.get("dim_split", 1)
    return (2 if value else 1) if isinstance(value, bool) else int(value)


def fastest_tiles(result: dict) -> Optional[str]:
    """``DSV4KIT_SPARSE_MLA_TILES`` value of the fastest correct variant at c4 T=64 among those
    with the automatic split count (the only kind the tiles variable can select)."""
    auto = [e for e in result["variants"] if e.get("num_splits_T64") == "auto" and "c4_T64_us" in e
            and _dim_split(e["config"]) == 1 and not e["config"].get("fused_combine")  # run 3's extras
            and not e["config"].get("p_scratch") and not e["config"].get("idx_once")  # run 4's extras
            and int(e["config"].get("prefetch", 0)) <= 2]  # run 4's indices two steps ahead
    if not auto:
        return None
    c = min(auto, key=lambda e: e["c4_T64_us"])["config"]
    return ",".join(str(int(c[k])) for k in ("block_h", "block_n", "num_warps", "num_stages", "prefetch", "wide"))


def sweep_table(result: dict) -> str:
    cols = ["c4_T64_us", "c4_T64_l2_resident_us", "c4_T64_zero_length_us", "c4_T16_us", "c4_T1_us", "c128_T64_us"]
    lines = ["| variant | BLOCK_H | BLOCK_N | warps | stages | prefetch | wide | splits T=64 | "
             + " | ".join(c.replace("_us", " us").replace("_", " ") for c in cols) + " | rel T=64 |",
             "|---" * (9 + len(cols)) + "|"]
    # Run 3 (bench_attention_sweep_h200_run3.json, commit 3e4e88c) also varied the dim split,
    # programs per SM and an in-kernel combine; those kernels were removed after it.
    extended = any("dim_split" in e["config"] for e in result["variants"])
    if extended:
        lines[0] = lines[0].replace("| wide |", "| wide | dim split | CTAs/SM | fused combine |")
        lines[1] = "|---" * (12 + len(cols)) + "|"
    # Round 4 (bench_attention_sweep_h200_run4.json, commit 2b094cd) added P through a scratch
    # tile and indices loaded once a step; those kernels were removed after it.
    round4 = any("p_scratch" in e["config"] for e in result["variants"])
    if round4:
        lines[0] = lines[0].replace("| wide |", "| wide | P scratch | idx once |")
        lines[1] = "|---" * (11 + len(cols)) + "|"
    for e in result["variants"]:
        cfg = e["config"]
        cells = [f"{e[c]:.1f}" if c in e else "-" for c in cols]
        rel = f"{e['rel_T64']:.1e}" if "rel_T64" in e else e.get("error", "-")[:60]
        dim_split = _dim_split(cfg)
        ext = (f"{dim_split} | {cfg.get('ctas_per_sm', 1)} | "
               f"{'yes' if cfg.get('fused_combine') else 'no'} | ") if extended else ""
        if round4:
            ext += f"{'yes' if cfg.get('p_scratch') else 'no'} | {'yes' if cfg.get('idx_once') else 'no'} | "
        lines.append(f"| {e['name']} | {cfg['block_h']} | {cfg['block_n']} | {cfg['num_warps']} | "
                     f"{cfg['num_stages']} | {int(cfg.get('prefetch', 0))} | {'yes' if cfg.get('wide') else 'no'} | "
                     f"{ext}{e['num_splits_T64']} | "
                     + " | ".join(cells) + f" | {rel} |")
    return "\n".join(lines) + "\n"


def table(result: dict) -> str:
    env = result["environment"]
    lines = [f"Device: {env['gpu']} ({env['capability']}), torch {env['torch']}, triton {env['triton']}; "
             f"copy {result['rates']['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
             f"{result['rates']['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s (measured in the run).",
             "", "| layer | T | valid (SWA+extra) | width | MMA kernel us | SIMT us | floor us | kernel/floor | SIMT/kernel | rel |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        lines.append(f"| {p['layer']} | {p['T']} | {p['valid_swa']}+{p['valid_extra']} | {p['width']} | "
                     f"{p['kernel_us']:.1f} | {p['simt_us']:.1f} | {p['floor_us']:.1f} | "
                     f"{p['ratio_to_floor']:.2f} | {p['speedup_vs_simt']:.1f} | {p['kernel_rel']:.1e} |")
    if result["c128_length_sweep"]:
        lines += ["", "c128, T=64, width 128 + 8256, valid c128 length swept:", "",
                  "| valid c128 | MMA kernel us | floor us | kernel/floor | SIMT us |", "|---|---|---|---|---|"]
        for s in result["c128_length_sweep"]:
            simt = f"{s['simt_us']:.1f}" if "simt_us" in s else "-"
            lines.append(f"| {s['valid_extra']} | {s['kernel_us']:.1f} | {s['floor_us']:.1f} | "
                         f"{s['ratio_to_floor']:.2f} | {simt} |")
    if result.get("config_sweep"):  # benchmark runs before --sweep existed timed the tiles here
        lines += ["", "Tile configurations, c4 T=64:", "",
                  "| BLOCK_H | BLOCK_N | warps | stages | splits | us | kernel/floor | rel |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in result["config_sweep"]:
            cfg = c["config"]
            head = (f"| {cfg['block_h']} | {cfg['block_n']} | {cfg['num_warps']} | {cfg['num_stages']} | "
                    f"{c.get('num_splits', 'auto')} | ")
            if "error" in c:
                lines.append(head + "error | - | - |")
            else:
                lines.append(head + f"{c['kernel_us']:.1f} | {c['ratio_to_floor']:.2f} | {c['rel']:.1e} |")
    lines += ["", "Targets:", ""]
    for name, t in result["targets"].items():
        lines.append(f"- {name}: {t['value']:.3g} (target {t['target']}) -> {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines) + "\n"


def comparison_table(before: dict, after: dict) -> str:
    """Per (layer, T): the kernel time of an earlier benchmark JSON next to a later one's."""
    old = {(p["layer"], p["T"]): p for p in before["points"]}
    lines = ["| layer | T | before us | now us | speed-up | SIMT us | now vs SIMT | floor us | now/floor |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in after["points"]:
        b = old.get((p["layer"], p["T"]))
        before_us = f"{b['kernel_us']:.1f}" if b else "-"
        gain = f"{b['kernel_us'] / p['kernel_us']:.1f}x" if b else "-"
        lines.append(f"| {p['layer']} | {p['T']} | {before_us} | {p['kernel_us']:.1f} | {gain} | {p['simt_us']:.1f} | "
                     f"{p['speedup_vs_simt']:.1f}x | {p['floor_us']:.1f} | {p['ratio_to_floor']:.2f} |")
    return "\n".join(lines) + "\n"


def render(result: dict) -> str:
    """The table of a committed JSON: a benchmark or a ``--sweep``."""
    if result.get("kind") == "dsv4kit-bench-attention-sweep":
        return sweep_table(result)
    return table(result)


#: Printed under the figure: what a bar is and what the terms mean.
PLOT_NOTE = (
    "Bars and points: the median time of one layer call over the timed CUDA-graph replays (a single "
    "median per point; no interval is drawn).\n"
    "c4 layer: the 128-token sliding window (SWA) plus the top-512 entries of the 4x-compressed KV. "
    "c128 layer: SWA plus the 128x-compressed KV (width 8256; a 128K-token request fills 1024).\n"
    "T: query tokens per request in one decode call (1 = plain decode). "
    "floor: max(KV bytes / measured copy bandwidth, bf16 MMA FLOPs / measured bf16 matmul rate), "
    "the time no kernel can beat on this GPU.")


def plot(result: dict, path: str) -> Optional[str]:
    return bench_cli.save_figure(figure, result, path)


def figure(result: dict):
    """The benchmark figure (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.4))
    pts = result["points"]
    labels = [f"{p['layer']}\nT={p['T']}" for p in pts]
    x = range(len(pts))
    width = 0.27
    ax1.bar([i - width for i in x], [p["simt_us"] for p in pts], width, label="SIMT baseline")
    ax1.bar(list(x), [p["kernel_us"] for p in pts], width, label="MMA kernel")
    ax1.bar([i + width for i in x], [p["floor_us"] for p in pts], width, label="floor")
    ax1.set_yscale("log")
    ax1.set_xticks(list(x))
    ax1.set_xticklabels(labels)
    ax1.set_xlabel("layer kind, T = query tokens per decode call")
    ax1.set_ylabel("us per layer call (median, CUDA-graph replay)")
    ax1.set_title(f"Sparse-MLA decode, H={result['points'][0].get('H', 64)}, {result['environment']['gpu']}")
    ax1.legend()
    sweep = result["c128_length_sweep"]
    if sweep:
        ax2.plot([s["valid_extra"] for s in sweep], [s["kernel_us"] for s in sweep], "o-", label="MMA kernel")
        ax2.plot([s["valid_extra"] for s in sweep], [s["floor_us"] for s in sweep], "--", label="floor")
        simt = [s for s in sweep if "simt_us" in s]
        ax2.plot([s["valid_extra"] for s in simt], [s["simt_us"] for s in simt], "s:", label="SIMT baseline")
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel(f"valid c128 slots (width {C128_WIDTH})")
        ax2.set_ylabel("us per layer call")
        ax2.set_title("c128 layer, T=64: time follows the valid length")
        ax2.legend()
    fig.text(0.01, 0.01, PLOT_NOTE, fontsize=7, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def _write_result(out_dir: str, stem: str, result: dict, text: str) -> None:
    """Print the table and write ``<stem>.json`` and ``<stem>.md`` under ``out_dir``."""
    print(text)
    bench_cli.write_text_atomic(os.path.join(out_dir, f"{stem}.json"), json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    bench_cli.write_text_atomic(os.path.join(out_dir, f"{stem}.md"), text)


def main(argv=None) -> int:
    parser = bench_cli.new_parser("bench_attention",
                                  description="Time the sparse-MLA decode kernel vs the SIMT baseline and the floor.")
    parser.add_argument("--out", default=".", help="directory for bench_attention.json/.md/.png")
    parser.add_argument("--quick", action="store_true", help="fewer points and configurations")
    parser.add_argument("--sweep", action="store_true",
                        help="time the kernel variants (tiles, pipelining, splits) instead of the benchmark; "
                             "writes bench_attention_sweep.json/.md")
    parser.add_argument("--mma-sync", action="store_true",
                        help="with --sweep: time the sm_120 code path (the tiled kernel in sm_120-sized tiles) "
                             "with mma.sync instead of wgmma (sets Triton's DISABLE_MMA_V3=1; needs sm_90)")
    parser.add_argument("--fastest-tiles", metavar="SWEEP_JSON", default=None,
                        help="print the DSV4KIT_SPARSE_MLA_TILES value of a sweep's fastest variant and exit")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE_JSON", "AFTER_JSON"), default=None,
                        help="print the before/after table of two benchmark JSONs and exit")
    parser.add_argument("--render", metavar="JSON", default=None,
                        help="print the table of a committed result JSON and exit (no GPU needed)")
    parser.add_argument("--decode-tp", type=int, default=None,
                        help="time at the heads one GPU of a decode server at this TP gets (4: 16 heads, "
                             "unpadded under SGLang's default FlashInfer backend); default: all 64 heads")
    args = parser.parse_args(argv)
    if args.mma_sync and not args.sweep:
        parser.error("--mma-sync only applies to --sweep")
    if args.fastest_tiles:
        try:
            with open(args.fastest_tiles) as fh:
                tiles = fastest_tiles(json.load(fh))
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: cannot read {args.fastest_tiles}: {exc}", file=sys.stderr)
            return 2
        if tiles is None:
            print("error: no timed variant in the sweep", file=sys.stderr)
            return 1
        print(tiles)
        return 0
    if args.compare:
        try:
            docs = []
            for path in args.compare:
                with open(path) as fh:
                    docs.append(json.load(fh))
            print(comparison_table(*docs), end="")
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: cannot compare {args.compare}: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.render:
        return bench_cli.render_file(args.render, render)
    try:
        import torch
    except ImportError:
        print("error: torch is not installed", file=sys.stderr)
        return 5
    if not torch.cuda.is_available():
        print("error: no CUDA device is visible; this benchmark needs a GPU", file=sys.stderr)
        return 5
    os.makedirs(args.out, exist_ok=True)
    partial_path = os.path.join(args.out, "bench_attention_sweep.partial.json" if args.sweep
                                else "bench_attention.partial.json")

    def checkpoint(partial: dict) -> None:  # what is done so far survives a timeout
        bench_cli.write_text_atomic(partial_path, json.dumps(partial, indent=2, default=str) + "\n")

    if args.sweep:
        if args.mma_sync:
            if torch.cuda.get_device_capability(0)[0] != 9:
                print("error: --mma-sync emulates sm_120's mma.sync on an sm_90 GPU; this GPU is sm_%d%d"
                      % torch.cuda.get_device_capability(0), file=sys.stderr)
                return 2
            os.environ[MMA_SYNC_ENV] = "1"  # read by Triton when it compiles, before the first launch
        result = run_sweep(args.quick, checkpoint, mma_sync=args.mma_sync)
        if os.path.exists(partial_path):
            os.remove(partial_path)
        _write_result(args.out, "bench_attention_sweep", result, sweep_table(result))
        return 0
    if args.decode_tp:
        from dsv4kit.validation.attention_heads import kernel_heads

        global H
        H = kernel_heads(args.decode_tp, 1)[1]
    result = run_benchmark(args.quick, checkpoint)
    result["command"] = "python -m dsv4kit.validation.bench_attention " + " ".join(
        sys.argv[1:] if argv is None else list(argv))
    if os.path.exists(partial_path):
        os.remove(partial_path)
    _write_result(args.out, "bench_attention", result, table(result))
    png = plot(result, os.path.join(args.out, "bench_attention.png"))
    _log(f"wrote {args.out}/bench_attention.json, .md" + (", .png" if png else ""))
    return 0 if result["all_targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
