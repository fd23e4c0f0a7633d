"""GPU-to-GPU copy bandwidth across each tensor-parallel group, and the pairs far below the others.

PCIe-only cards reach each other through PCIe switches or, when ACS or the IOMMU redirects peer
traffic, through the CPU root complex at a fraction of the bandwidth (and NCCL may hang there).
This measures a device-to-device copy for every ordered pair in each group with torch and flags a
pair below ``ratio`` times the median of all pairs measured.

    python -m dsv4kit.validation.p2p --groups 0,1,2,3 4,5,6,7 [--mib 256] [--ratio 0.5] [--json out.json]

Exit 0: no pair flagged; 1: a pair flagged; 7: skipped (no CUDA, or fewer than two GPUs), said so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def flag_slow_pairs(bandwidth: dict[tuple[int, int], float], ratio: float = 0.5) -> list[tuple[int, int]]:
    """The pairs whose GB/s is below ``ratio`` x the median of all pairs (sorted)."""
    if len(bandwidth) < 2:
        return []
    median = statistics.median(bandwidth.values())
    return sorted(pair for pair, gbps in bandwidth.items() if gbps < ratio * median)


def parse_groups(specs: list[str]) -> list[list[int]]:
    """"0,1,2,3" "4,5,6,7" -> [[0, 1, 2, 3], [4, 5, 6, 7]]; a bad spec raises ValueError naming it."""
    groups = []
    for spec in specs:
        try:
            group = [int(part) for part in spec.split(",") if part.strip() != ""]
        except ValueError:
            raise ValueError(f"--groups {spec!r}: GPU indices separated by commas, e.g. 0,1,2,3") from None
        if len(set(group)) != len(group) or any(g < 0 for g in group):
            raise ValueError(f"--groups {spec!r}: each GPU once, indices >= 0")
        groups.append(group)
    return groups


def measure_pairs(groups: list[list[int]], mib: int = 256, repeats: int = 5) -> dict[tuple[int, int], float]:
    """GB/s of a ``mib`` MiB device-to-device copy for every ordered pair within each group (torch)."""
    import torch

    bandwidth = {}
    for group in groups:
        buffers = {g: torch.empty(mib << 20, dtype=torch.uint8, device=f"cuda:{g}") for g in group}
        for src in group:
            for dst in group:
                if src == dst:
                    continue
                buffers[dst].copy_(buffers[src])  # warm-up (and P2P mapping)
                torch.cuda.synchronize(src)
                torch.cuda.synchronize(dst)
                # Wall clock around both devices' synchronisation: the copy may run on either's stream.
                begin = time.perf_counter()
                for _ in range(repeats):
                    buffers[dst].copy_(buffers[src], non_blocking=True)
                torch.cuda.synchronize(src)
                torch.cuda.synchronize(dst)
                seconds = time.perf_counter() - begin
                bandwidth[(src, dst)] = repeats * (mib << 20) / seconds / 1e9
        del buffers
    return bandwidth


def gpus_available() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.validation.p2p", description=__doc__.splitlines()[0])
    parser.add_argument("--groups", nargs="+", default=["0,1,2,3", "4,5,6,7"], help="TP groups (prefill, decode)")
    parser.add_argument("--mib", type=int, default=256, help="copy size in MiB")
    parser.add_argument("--ratio", type=float, default=0.5, help="flag a pair below this x the median")
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args(argv)
    try:
        groups = parse_groups(args.groups)
    except ValueError as exc:
        print(f"p2p: {exc}", file=sys.stderr)
        return 2
    count = gpus_available()
    if count < 2:
        print(f"p2p: skipped: {'no CUDA GPU' if count == 0 else 'one GPU'} here; the check needs two or more")
        return 7
    groups = [[g for g in group if g < count] for group in groups]
    groups = [group for group in groups if len(group) >= 2]
    if not groups:
        print(f"p2p: skipped: no group has two of the {count} GPUs here")
        return 7
    bandwidth = measure_pairs(groups, args.mib)
    slow = flag_slow_pairs(bandwidth, args.ratio)
    median = statistics.median(bandwidth.values())
    for (src, dst), gbps in sorted(bandwidth.items()):
        print(f"GPU {src} -> GPU {dst}: {gbps:.1f} GB/s{'  SLOW' if (src, dst) in slow else ''}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"median_gbps": median, "ratio": args.ratio, "slow": slow,
                       "pairs": [{"src": s, "dst": d, "gbps": g} for (s, d), g in sorted(bandwidth.items())]}, fh, indent=2)
    if slow:
        print(f"p2p: {len(slow)} pair(s) below {args.ratio} x the median {median:.1f} GB/s: peer traffic there likely "
              "goes through the CPU root complex (ACS or IOMMU on the switch ports): see docs/provisioning.md, P2P")
        return 1
    print(f"p2p: ok, {len(bandwidth)} pairs, median {median:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
