#!/usr/bin/env bash
# What writes to a file beside `lbkit proxy`'s configuration cost the proxy: for each BINARY,
# alternating, ROUNDS rounds, a proxy (one worker, round robin, nothing to call) whose
# configuration sits in a fresh directory, and a writer appending a line to `noise.log` in that
# directory about every 0.2 ms (flushed each time: one inotify event a write) for 12 s; prints
# the proxy's CPU ticks (user + system, all its threads) over 10 s of it and the writer's rate.
#
#   scripts/watch-noise.sh ROUNDS BINARY...
#   scripts/watch-noise.sh 3 /tmp/lbkit-before target/release/lbkit
#
# Needs python3 and curl. Ports 29510 (listener) and 29511 (admin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/proxy-configs.sh
. "$ROOT/scripts/proxy-configs.sh"
[ $# -ge 2 ] || { echo "usage: $0 ROUNDS BINARY..." >&2; exit 2; }
ROUNDS=$1; shift
PIDS=()
WORK=$(mktemp -d /tmp/watch-noise.XXXXXX)
trap proxy_cleanup EXIT

writer() {
  python3 -c '
import sys, time
end, n = time.time() + 12, 0
with open(sys.argv[1], "a") as f:
    while time.time() < end:
        f.write("x\n"); f.flush(); n += 1; time.sleep(0.0002)
print(round(n / 12))' "$1"
}

for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    dir=$WORK/$r-$(basename "$bin"); mkdir -p "$dir"
    lbkit_conf 29510 29511 29501 29502 29503 round-robin > "$dir/lbkit.toml"
    "$bin" proxy --threads 1 --config "$dir/lbkit.toml" > "$dir/proxy.log" 2>&1 & pid=$!
    PIDS+=("$pid")
    for _ in $(seq 100); do
      curl -sf http://127.0.0.1:29511/metrics > /dev/null && break; sleep 0.1
    done
    writer "$dir/noise.log" > "$dir/rate" & w=$!
    sleep 1; t0=$(proxy_ticks "$pid"); sleep 10; t1=$(proxy_ticks "$pid")
    wait "$w"
    echo "round $r $bin: $((t1 - t0)) ticks in 10 s, $(cat "$dir/rate") writes/s"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
