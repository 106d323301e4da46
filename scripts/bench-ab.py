#!/usr/bin/env python3
"""Compare divan bench binaries (before/after builds) on this shared, noisy machine.

The binaries run alternately, one process each per round, ROUNDS rounds (default 12), and the
table shows every row's median, minimum and maximum over the rounds, and the ratio of medians
to the first binary's. Several rounds are needed because a row of one binary is bimodal
between process runs here: the pick bench ran weighted random at 33 or 53 ns a pick in
consecutive runs of the same binary, with the same environment, with address randomization on
or off (BENCHMARKS.md, "Timing between process runs"). A difference is the code's when it holds
in the median and in the minimum; one that shows only in some rounds is not.

    scripts/bench-ab.py 'balancer::(round_robin_filter_off|floor)' /tmp/pick-before /tmp/pick-after
    ROUNDS=16 scripts/bench-ab.py 'load::' /tmp/before /tmp/after
    RAW=/tmp/rounds.json scripts/bench-ab.py 'pick::' /tmp/a /tmp/b   # also every round's value

Build each binary with `cargo bench --bench NAME --no-run` (a worktree of the older commit with
CARGO_TARGET_DIR pointing at the same target directory shares the dependencies) and copy it out
of target/release/deps/ before building the next. The filter is divan's (a regex over the
bench's path); the value compared is divan's median column of each row.
"""

import json
import os
import re
import statistics
import subprocess
import sys

UNIT = {"ns": 1.0, "µs": 1e3, "ms": 1e6, "s": 1e9}
NODE = re.compile(r"[├╰]─ (\S+)")
TIME = re.compile(r"([\d.]+) (ns|µs|ms|s)\b")


def parse(output):
    """Divan's tree output -> {row: median ns}; a row is its path below the binary's root,
    `group::bench` or `group::bench/arg`."""
    path, rows = {}, {}
    for line in output.splitlines():
        node = NODE.search(line)
        if not node:
            continue
        depth = node.start()  # deeper rows are indented further
        path = {d: n for d, n in path.items() if d < depth}
        path[depth] = node.group(1)
        times = TIME.findall(line[node.end():])
        if len(times) < 4:  # a group's line; a row has fastest, slowest, median, mean
            continue
        names = [path[d] for d in sorted(path)]
        row = "::".join(names[:-1]) + "/" + names[-1] if names[-1].isdigit() else "::".join(names)
        value, unit = times[2]
        rows[row] = float(value) * UNIT[unit]
    return rows


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    pattern, bins = sys.argv[1], sys.argv[2:]
    for b in bins:
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            print(f"bench-ab: not an executable: {b}", file=sys.stderr)
            return 2
    try:
        rounds = int(os.environ.get("ROUNDS", "12"))
    except ValueError:
        print("bench-ab: ROUNDS must be a number", file=sys.stderr)
        return 2
    samples = {}
    for _ in range(rounds):
        for b in bins:
            run = subprocess.run(
                [b, "--bench", pattern], capture_output=True, text=True, check=False
            )
            if run.returncode != 0:
                print(f"bench-ab: {b} failed:\n{run.stderr}", file=sys.stderr)
                return 1
            for row, ns in parse(run.stdout).items():
                samples.setdefault((row, b), []).append(ns)
    if not samples:
        print(f"bench-ab: no row matched {pattern!r}", file=sys.stderr)
        return 1
    raw = os.environ.get("RAW")
    if raw:
        # Every round's value, {row: {binary: [ns, ...]}}, for per-round ratios.
        dump = {}
        for (row, b), s in samples.items():
            dump.setdefault(row, {})[os.path.basename(b)] = s
        with open(raw, "w", encoding="utf-8") as f:
            json.dump(dump, f, indent=1, sort_keys=True)
    rows = sorted({row for row, _ in samples})
    width = max(len(r) for r in rows)
    names = [os.path.basename(b) for b in bins]
    print("row".ljust(width), "  ".join(f"{n:>29}" for n in names), "  median / first's")
    for row in rows:
        cells, medians = [], []
        for b in bins:
            s = samples.get((row, b))
            if not s:
                cells.append(f"{'-':>29}")
                medians.append(None)
                continue
            m = statistics.median(s)
            medians.append(m)
            cells.append(f"{m:9.1f} ({min(s):7.1f}-{max(s):7.1f})")
        base = medians[0]
        ratios = " ".join("-" if m is None or not base else f"{m / base:.2f}" for m in medians[1:])
        print(row.ljust(width), "  ".join(cells), " ", ratios)
    print(
        f"\nns per iteration: median (min-max) over {rounds} rounds, one process of each "
        "binary per round, alternating"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
