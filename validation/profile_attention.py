"""One profiling target for Nsight Compute: the sparse-MLA decode kernel on a c4 layer (GPU only).

Builds the benchmark's c4 layers (128 SWA + 512 extra, H=64) for T tokens, warms up, then calls the
kernel ``--calls`` times. Run it under ncu, skipping the two warm-up launches, e.g.::

    ncu -k regex:sparse_mla_decode --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python -m dsv4kit.validation.profile_attention --tokens 64
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.validation.profile_attention")
    parser.add_argument("--tokens", type=int, default=64, help="T, decode tokens in the batch")
    parser.add_argument("--calls", type=int, default=3, help="calls after the warm-up")
    args = parser.parse_args(argv)

    import torch

    from dsv4kit.kernels.sparse_mla_decode import SM120_DECODE_MAX_TOKENS, flash_mla_with_kvcache_sm120
    from dsv4kit.validation.bench_attention import build_layers

    if not 1 <= args.tokens <= SM120_DECODE_MAX_TOKENS:  # larger T goes to the torch reference
        parser.error(f"--tokens must be in 1..{SM120_DECODE_MAX_TOKENS}, got {args.tokens}")
    if args.calls < 1:
        parser.error(f"--calls must be >= 1, got {args.calls}")
    if not torch.cuda.is_available():
        print("error: no CUDA device is visible; this profiling target needs a GPU", file=sys.stderr)
        return 5

    layers = build_layers("c4", args.tokens, 131072, 512, want_bytes=0, max_layers=2)
    for _ in range(2):  # JIT compile and warm-up
        flash_mla_with_kvcache_sm120(**layers[0])
    torch.cuda.synchronize()
    for _ in range(args.calls):
        flash_mla_with_kvcache_sm120(**layers[1])
    torch.cuda.synchronize()
    print(f"profiled {args.calls} call(s) at T={args.tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
