#!/usr/bin/env python3
"""Each row's ratio to a reference row, computed within each process, from the per-round values
`scripts/bench-ab.py` writes with RAW=FILE.

    scripts/bench-ratios.py RAW.json 'reference::pingora_round_robin'

The rows of one process are bimodal between processes on this machine (BENCHMARKS.md, "Timing
between process runs"), so a ratio of two medians taken over different processes can mix
modes; a ratio within each process does not. Every process of every binary in the file counts
as one. A row `group::bench/ARG` is divided by the reference row with the same ARG, or, when the
reference has no such argument, by the reference's largest argument (Pingora's benches stop at
65 535 endpoints where lbkit's go to 100 000). Prints, per row, its median in ns and the median,
worst (largest) and best ratio over the processes.
"""

import json
import statistics
import sys


def arg_of(row):
    head, sep, arg = row.rpartition("/")
    return (head, int(arg)) if sep and arg.isdigit() else (row, None)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, reference = sys.argv[1], sys.argv[2]
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        print(f"bench-ratios: cannot read {path}: {e}", file=sys.stderr)
        return 2
    refs = {}
    for row, per_binary in raw.items():
        head, arg = arg_of(row)
        if head == reference:
            refs[arg] = per_binary
    if not refs:
        print(f"bench-ratios: no row named {reference!r} in {path}", file=sys.stderr)
        return 2
    largest = max((a for a in refs if a is not None), default=None)
    rows = sorted(r for r in raw if arg_of(r)[0] != reference)
    width = max((len(r) for r in rows), default=3)
    print("row".ljust(width), "   median ns   ratio: median   worst    best   reference")
    for row in rows:
        _, arg = arg_of(row)
        ref_arg = arg if arg in refs else largest
        ref = refs[ref_arg]
        values, ratios = [], []
        for binary, series in raw[row].items():
            for value, base in zip(series, ref.get(binary, [])):
                values.append(value)
                ratios.append(value / base)
        if not ratios:
            continue
        ref_name = reference if ref_arg is None else f"{reference}/{ref_arg}"
        print(
            row.ljust(width),
            f"{statistics.median(values):11.1f}   {statistics.median(ratios):13.3f}"
            f" {max(ratios):7.3f} {min(ratios):7.3f}   {ref_name}",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
