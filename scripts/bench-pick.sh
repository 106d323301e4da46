#!/usr/bin/env bash
# Pick + finish against Pingora's `select` and the floors of its atomics (issue 18), on this
# machine, in one command: builds bench/'s `pick` bench (installing Debian's cmake when
# missing, for pingora's zlib-ng; needs root then), runs ROUNDS rounds of two copies of the
# binary alternating (scripts/bench-ab.py: one process each per round), and prints each row's
# ratio to Pingora's `select` computed within each process (scripts/bench-ratios.py).
#
#   scripts/bench-pick.sh                      # ROUNDS=8, the rows of BENCHMARKS.md's table
#   ROUNDS=12 ROWS='balancer::round_robin' scripts/bench-pick.sh
#
# ROWS is divan's filter (a regex over the bench's path); the reference row is always added.
# RAW (default: a file under the work directory, kept) receives every process's values.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-8}
ROWS=${ROWS:-'balancer::(round_robin_filter_off|weighted_random_skewed_filter_off|floor_pick)'}
REFERENCE='reference::pingora_round_robin'
WORK=$(mktemp -d /tmp/bench-pick.XXXXXX)
RAW=${RAW:-$WORK/rounds.json}
trap 'rm -f "$WORK/pick-a" "$WORK/pick-b"' EXIT   # the binaries; the values stay

if ! command -v cmake >/dev/null; then
  echo "installing cmake from Debian's packages (pingora's zlib-ng builds with it)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cmake >/dev/null
fi

export CARGO_TARGET_DIR=$ROOT/bench/target
bin=$(cd "$ROOT/bench" && cargo bench --bench pick --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "pick" and m.get("executable"):
        print(m["executable"])')
[ -x "$bin" ] || { echo "bench-pick: the pick bench did not build (cd bench && cargo bench --bench pick --no-run)" >&2; exit 1; }
cp "$bin" "$WORK/pick-a"
cp "$bin" "$WORK/pick-b"

RAW=$RAW ROUNDS=$ROUNDS "$ROOT/scripts/bench-ab.py" "$ROWS|$REFERENCE" "$WORK/pick-a" "$WORK/pick-b"
echo
"$ROOT/scripts/bench-ratios.py" "$RAW" "$REFERENCE"
echo
echo "every process's values: $RAW"
