"""Small, committable summaries of an Nsight Compute report of the decode kernel (stdlib only).

From the two CSV exports of one report::

    ncu -i R.ncu-rep --page raw --csv > raw.csv
    ncu -i R.ncu-rep --page source --csv --print-source sass > source.csv
    python -m dsv4kit.validation.ncu_summary raw.csv source.csv OUT_PREFIX

it writes ``OUT_PREFIX_stall_reasons.csv`` (the kernel's warp-stall samples per reason) and
``OUT_PREFIX_top_stall_sites.csv`` (the SASS instructions with the most samples, their share of
all samples and their main stall reason). The full exports are megabytes; these are what the docs
quote.
"""

from __future__ import annotations

import csv
import sys

STALL_PREFIX = "smsp__pcsamp_warps_issue_stalled_"
META = ("Kernel Name", "Block Size", "Grid Size", "device__attribute_display_name")


def _int(text: str) -> int:
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def stall_reasons(raw_rows: list) -> tuple[list, list]:
    """(header, values) of the non-zero stall-reason samples of the report's first kernel.
    ``raw_rows``: ncu's ``--page raw --csv`` export (a name row, a unit row, then a row per kernel)."""
    header, values = raw_rows[0], raw_rows[2]
    keep = [i for i, h in enumerate(header) if h in META]
    keep += [i for i, h in enumerate(header)
             if h.startswith(STALL_PREFIX) and not h.endswith("_not_issued") and _int(values[i]) > 0]
    return [header[i] for i in keep], [values[i] for i in keep]


def top_stall_sites(source_rows: list, count: int = 15) -> list:
    """Rows ``[sass_index, sass, samples, share, main_reason]`` of the ``count`` instructions with the
    most warp-stall samples, in program order. ``source_rows``: ncu's ``--page source --csv
    --print-source sass`` export (a kernel-name row, a header row, then one row per instruction)."""
    header, data = source_rows[1], source_rows[2:]
    samples = header.index("Warp Stall Sampling (All Samples)")
    source = header.index("Source")
    reasons = [i for i, h in enumerate(header) if h.startswith("stall_") and "(Not Issued)" not in h]
    total = sum(_int(r[samples]) for r in data) or 1
    top = sorted(range(len(data)), key=lambda i: -_int(data[i][samples]))[:count]
    rows = []
    for i in sorted(top):
        r = data[i]
        main = max(reasons, key=lambda k: _int(r[k]))
        rows.append([i, r[source].strip(), _int(r[samples]), f"{_int(r[samples]) / total:.3f}", header[main]])
    return rows


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m dsv4kit.validation.ncu_summary RAW_CSV SOURCE_CSV OUT_PREFIX", file=sys.stderr)
        return 2
    raw_path, source_path, prefix = args
    try:
        with open(raw_path, newline="") as fh:
            head, values = stall_reasons(list(csv.reader(fh)))
        with open(source_path, newline="") as fh:
            sites = top_stall_sites(list(csv.reader(fh)))
    except (OSError, IndexError, ValueError) as exc:
        print(f"error: cannot read the ncu exports: {exc}", file=sys.stderr)
        return 2
    with open(f"{prefix}_stall_reasons.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([head, values])
    with open(f"{prefix}_top_stall_sites.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["sass_index", "sass", "samples", "share_of_all_samples", "main_reason"], *sites])
    print(f"wrote {prefix}_stall_reasons.csv and {prefix}_top_stall_sites.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
