"""Our sparse-MLA decode kernel beside every stock implementation that runs here (GPU only).

``python -m dsv4kit.validation.bench_attention_stock [--out DIR] [--quick]``

For c4 and c128 layers (the shapes of ``bench_attention``: SWA 128 + top-512 c4 slots; SWA 128 +
a 8256-wide c128 row holding 1024 valid slots), T in {1, 16, 64} and the heads one GPU of the decode
server gets (``--decode-tp``, default 4: 16 heads, as ``attention_heads`` derives), every implementation
of ``dsv4kit.validation.implementations`` ("dsv4kit", FlashMLA on sm_90, FlashInfer on sm_120,
SGLang's Triton sm_120 kernel and its torch path) is checked against the float32 reference and
timed under CUDA-graph replay on the same distinct layers (together over the L2 size), in one
process. Targets: ours <= 1.0 x the stock default of this GPU at every point, and >= 100 x
faster than SGLang's Triton sm_120 kernel.

Writes ``bench_attention_stock.json`` and prints the table. ``--render JSON`` prints the table of
an existing result (docs/attention.md quotes it).
"""

from __future__ import annotations

import math
import os
import sys
import time

from dsv4kit.validation import attention_heads as heads_of
from dsv4kit.validation import bench_attention as base
from dsv4kit.validation import bench_cli

OURS = "dsv4kit"
TRITON_NAME = "sglang-triton-sm120"
STOCK_TARGET = 1.0  # ours / stock default
TRITON_SPEEDUP_TARGET = 100.0
SLOW_CALL_MS = 1.0  # an implementation slower than this per call is timed on 2 layers


def _time(fn, layers) -> float:
    import torch

    kw = layers[0]
    fn(**kw)
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn(**kw)
    torch.cuda.synchronize()
    if (time.perf_counter() - started) * 1e3 > SLOW_CALL_MS:
        return base.time_under_graph(fn, layers[:2], target_ms=1.0, replays=3)
    return base.time_under_graph(fn, layers)


def run(quick: bool, log, decode_tp: int = heads_of.DEFAULT_DECODE_TP, backend: str = heads_of.DEFAULT_BACKEND) -> dict:
    """Every implementation at the heads one GPU of a TP ``decode_tp`` decode server gets, padded as
    SGLang 0.5.23 pads them under ``backend`` on sm_120 (FlashMLA on sm_90 always gets 64, as SGLang
    pads there)."""
    import torch

    from dsv4kit.validation.implementations import implementations

    impls, unavailable = implementations("attention", "cuda")
    for name, why in unavailable.items():
        log(f"{name}: {why}")
    default = next((i.name for i in impls if i.stock_default), None)
    started = time.time()
    rates = {"copy_bytes_per_s": base.measure_copy_bandwidth(),
             "bf16_flops_per_s": base.measure_bf16_matmul_rate()}
    props = base.device_properties()
    points = []
    for kind, width in (("c4", 512), ("c128", base.C128_WIDTH)):
        for T in ([1, 64] if quick else [1, 16, 64]):
            heads, padded = heads_of.kernel_heads(decode_tp, T, backend)
            layers = base.build_layers(kind, T, 131072, width, 3 * props["l2_bytes"], heads=heads,
                                       padded_heads=padded)
            p = base._point(kind, T, 128, 512 if kind == "c4" else base.C128_VALID_128K, width, rates)
            p.update(layers_in_graph=len(layers), times_us={}, rel={}, failed={}, H=heads, padded_heads=padded)
            for impl in impls:
                try:
                    p["rel"][impl.name] = base.check_against_reference(impl.fn, layers[0])
                    p["times_us"][impl.name] = _time(impl.fn, layers)
                except Exception as exc:  # noqa: BLE001 - one implementation failing is recorded
                    p["times_us"][impl.name] = None
                    p["failed"][impl.name] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    log(f"{impl.name} failed on {kind} T={T}: {p['failed'][impl.name]}")
            ours, stock = p["times_us"].get(OURS), p["times_us"].get(default)
            p["vs_stock_default"] = None if not ours or not stock else ours / stock
            triton = p["times_us"].get(TRITON_NAME)
            p["speedup_vs_triton"] = None if not ours or not triton else triton / ours
            log(f"{kind} T={T}: " + "  ".join(
                f"{n}={'-' if t is None else format(t, '.1f')} us (rel {p['rel'].get(n, math.nan):.1e})"
                for n, t in p["times_us"].items()))
            points.append(p)
            del layers
            torch.cuda.empty_cache()
    vs_stock = [p["vs_stock_default"] for p in points]
    speedups = [p["speedup_vs_triton"] for p in points]
    targets = {
        "ours_le_stock_default": {
            "stock_default": default, "target": f"<= {STOCK_TARGET}",
            "value": None if None in vs_stock or not vs_stock else max(vs_stock),
            "met": bool(vs_stock) and None not in vs_stock and max(vs_stock) <= STOCK_TARGET},
        "speedup_vs_sglang_triton": {
            "target": f">= {TRITON_SPEEDUP_TARGET}",
            "value": None if None in speedups or not speedups else min(speedups),
            "met": bool(speedups) and None not in speedups and min(speedups) >= TRITON_SPEEDUP_TARGET},
    }
    return {
        "schema": 1, "kind": "dsv4kit-bench-attention-stock",
        "command": "python -m dsv4kit.validation.bench_attention_stock" + (" --quick" if quick else ""),
        "started_unix": started, "seconds": round(time.time() - started, 1),
        "environment": base._versions(props), "rates": rates, "decode_tp": decode_tp,
        "attention_backend": backend,
        "implementations": {i.name: {"origin": i.origin, "stock_default": i.stock_default}
                            for i in impls},
        "unavailable": unavailable, "stock_default": default,
        "timing": "CUDA-graph replay over distinct layers (KV together over 3x L2); an "
                  f"implementation slower than {SLOW_CALL_MS} ms a call is timed on 2 layers",
        "points": points, "targets": targets,
        "all_targets_met": all(t["met"] for t in targets.values()),
    }


def _names(result: dict) -> list[str]:
    names = list(result.get("implementations", {}))
    order = [OURS, "flashmla-sm90", "flashinfer-sm120", TRITON_NAME, "sglang-torch"]
    return [n for n in order if n in names] + [n for n in names if n not in order]


def _heads_line(result: dict) -> str:
    tp = result.get("decode_tp")
    if tp is None:
        return "Heads: all 64 (attention-TP 1)."
    shown = sorted({heads_of.label(p.get("H", 64), p.get("padded_heads", 64)) for p in result["points"]})
    return (f"Heads: decode TP {tp}, {', '.join(shown)} per GPU as SGLang 0.5.23 hands them to the kernel under "
            f"SGLANG_SM120_FLASHMLA_BACKEND={result.get('attention_backend')}; FlashMLA (sm_90) gets q padded to 64.")


def render(result: dict) -> str:
    """Markdown: time per layer call and error against the float32 reference, per implementation."""
    names = _names(result)
    default = result.get("stock_default")
    env = result["environment"]
    lines = [f"Device: {env.get('gpu')} ({env.get('capability')}), torch {env.get('torch')}, "
             f"triton {env.get('triton')}. Command: `{result['command']}`. Stock default here: "
             f"{default or 'none available'}. {_heads_line(result)}", "",
             "| layer | T | " + " | ".join(f"{n} (us)" for n in names)
             + " | ours / stock default | ours vs Triton sm_120 |",
             "|---|---:|" + "---:|" * len(names) + "---:|---:|"]
    for p in result["points"]:
        cells = ["failed" if p["times_us"].get(n) is None else f"{p['times_us'][n]:.1f}" for n in names]
        vs = "-" if p.get("vs_stock_default") is None else f"{p['vs_stock_default']:.2f}"
        sp = "-" if p.get("speedup_vs_triton") is None else f"{p['speedup_vs_triton']:.0f}x"
        lines.append(f"| {p['layer']} | {p['T']} | " + " | ".join(cells) + f" | {vs} | {sp} |")
    lines += ["", "| implementation | origin | worst rel vs float32 reference |", "|---|---|---:|"]
    for n in names:
        rels = [p["rel"][n] for p in result["points"] if n in p["rel"]]
        worst = "-" if not rels else ("nan" if any(math.isnan(r) for r in rels) else f"{max(rels):.2e}")
        origin = result["implementations"][n]["origin"].split(":", 1)[0]  # wheel:<dir> -> wheel
        lines.append(f"| {n} | {origin} | {worst} |")
    for n, why in result.get("unavailable", {}).items():
        lines.append(f"| {n} | - | {why} |")
    t = result["targets"]
    lines += ["", f"Targets: ours <= {STOCK_TARGET} x {default or 'the stock default'} at every point: "
              + ("met" if t["ours_le_stock_default"]["met"] else "NOT met")
              + (f" (worst {t['ours_le_stock_default']['value']:.2f})"
                 if t["ours_le_stock_default"]["value"] is not None else "")
              + f"; >= {TRITON_SPEEDUP_TARGET:.0f}x faster than SGLang's Triton sm_120 kernel: "
              + ("met" if t["speedup_vs_sglang_triton"]["met"] else "NOT met")
              + (f" (least {t['speedup_vs_sglang_triton']['value']:.0f}x)."
                 if t["speedup_vs_sglang_triton"]["value"] is not None else ".")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from dsv4kit.core import exitcodes

    parser = bench_cli.new_parser("bench_attention_stock",
                                  description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="directory for bench_attention_stock.json")
    parser.add_argument("--quick", action="store_true", help="T in {1, 64} only")
    parser.add_argument("--render", metavar="JSON", help="print the table of a result and exit")
    parser.add_argument("--decode-tp", type=int, default=heads_of.DEFAULT_DECODE_TP,
                        help="the decode server's TP: 64/TP heads per GPU (default: 4, the inventory's)")
    parser.add_argument("--attention-backend", choices=heads_of.BACKENDS, default=heads_of.DEFAULT_BACKEND,
                        help="SGLANG_SM120_FLASHMLA_BACKEND, which decides the padding (default: flashinfer)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        heads_of.kernel_heads(args.decode_tp, 1, args.attention_backend)
    except ValueError as exc:
        parser.error(str(exc))
    if args.render:
        return bench_cli.render_file(args.render, render)
    import torch

    if not torch.cuda.is_available():
        print("error: the attention benchmark needs a CUDA GPU (none is visible)", file=sys.stderr)
        return exitcodes.ENVIRONMENT

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    os.makedirs(args.out, exist_ok=True)
    result = run(args.quick, log, args.decode_tp, args.attention_backend)
    result["command"] = "python -m dsv4kit.validation.bench_attention_stock " + " ".join(
        sys.argv[1:] if argv is None else list(argv))
    path = os.path.join(args.out, "bench_attention_stock.json")
    bench_cli.write_json_atomic(path, result)
    print(render(result), end="")
    print(f"wrote {path}")
    failed = any(p["failed"].get(OURS) for p in result["points"])
    return exitcodes.CHECK_FAILED if failed else exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
