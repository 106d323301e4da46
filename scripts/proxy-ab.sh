#!/usr/bin/env bash
# Interleaved A/B of two or more `lbkit` binaries as a proxy (issue 8): on a shared machine one
# full run per change is not enough, so each round runs every binary once, back to back, and
# prints req/s, p99 and the CPU each process spent per request (proxy — all its processes —,
# backends, wrk), read from /proc/PID/stat over 3 s of a 5 s wrk run after a 2 s warm-up.
# The name `nginx` instead of a binary runs nginx with scripts/bench-proxy.sh's configuration.
#
#   scripts/proxy-ab.sh WORKERS CONNS ROUNDS BINARY...
#   e.g. scripts/proxy-ab.sh 1 64 3 nginx /tmp/lbkit-main target/release/lbkit
#
# Three backends (crates/lbkit-proxy/examples/backend.rs) on ports BASE_PORT+1..3, the proxy on
# BASE_PORT+10 with round-robin (STRATEGY to change). Needs wrk and curl, and nginx for `nginx`
# (scripts/bench-proxy.sh installs wrk and nginx). Also printed: how often the proxy was
# preempted per request (involuntary context switches of all its threads). PROXY_NICE=N runs
# every proxy (nginx too) at that nice value, like nginx's `worker_priority` (needs root for
# N < 0).
set -euo pipefail

[ $# -ge 4 ] || { echo "usage: $0 WORKERS CONNS ROUNDS BINARY..." >&2; exit 2; }
W=$1; C=$2; R=$3; shift 3
STRATEGY=${STRATEGY:-round-robin}
B=${BASE_PORT:-28080}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
(cd "$ROOT" && cargo build --release -q -p lbkit-proxy --example backend)
BACKEND=$TARGET/release/examples/backend
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
# shellcheck source=scripts/proxy-configs.sh
. "$ROOT/scripts/proxy-configs.sh"
WORK=$(mktemp -d /tmp/proxy-ab.XXXXXX)
PIDS=()
trap proxy_cleanup EXIT

cpu() { # user + system ticks of the given pids
  local t=0 p f
  for p in "$@"; do
    read -r -a f < <(cut -d' ' -f14,15 "/proc/$p/stat")
    t=$((t + f[0] + f[1]))
  done
  echo "$t"
}

preempted() { # involuntary context switches of every thread of the given pids
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/status; done | awk '/^nonvoluntary_ctxt_switches/ { n += $2 } END { print n + 0 }'
}

one() { # $1 binary: prints one result line
  local lbkit=$1 backends=() lp wp
  for p in 1 2 3; do "$BACKEND" $((B + p)) 1 >/dev/null 2>&1 & backends+=($!); done
  if [ "$lbkit" = nginx ]; then
    mkdir -p "$WORK/logs"
    nginx_conf "$W" $((B + 10)) $((B + 1)) $((B + 2)) $((B + 3)) "$WORK" >"$WORK/nginx.conf"
    "$NGINX" -p "$WORK" -c "$WORK/nginx.conf" -g 'daemon off;' >"$WORK/nginx.log" 2>&1 & lp=$!
  else
    lbkit_conf $((B + 10)) $((B + 11)) $((B + 1)) $((B + 2)) $((B + 3)) "$STRATEGY" >"$WORK/lb.toml"
    "$lbkit" proxy --threads "$W" --config "$WORK/lb.toml" >"$WORK/lb.log" 2>&1 & lp=$!
  fi
  PIDS=("${backends[@]}" "$lp")
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$((B + 10))/" && break; sleep 0.1; done
  if [ -n "${PROXY_NICE:-}" ]; then
    for p in $lp $(pgrep -P "$lp" || true); do
      renice -n "$PROXY_NICE" -p $(ls "/proc/$p/task") >/dev/null
    done
  fi
  wrk -t2 -c"$C" -d2s "http://127.0.0.1:$((B + 10))/" >/dev/null
  wrk -t2 -c"$C" -d5s --latency "http://127.0.0.1:$((B + 10))/" >"$WORK/wrk.out" & wp=$!
  sleep 1
  local b0 l0 w0 b1 l1 w1 s0 s1
  local lps
  read -r -a lps < <(echo "$lp" $(pgrep -P "$lp" || true))
  b0=$(cpu "${backends[@]}"); l0=$(cpu "${lps[@]}"); w0=$(cpu "$wp"); s0=$(preempted "${lps[@]}")
  sleep 3
  b1=$(cpu "${backends[@]}"); l1=$(cpu "${lps[@]}"); w1=$(cpu "$wp"); s1=$(preempted "${lps[@]}")
  wait "$wp"
  local rps p99
  rps=$(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.out")
  p99=$(awk '$1 == "99%" {print $2}' "$WORK/wrk.out")
  # Ticks are 1/100 s; 3 s of requests at rps.
  awk -v b="$lbkit" -v r="$rps" -v p="$p99" -v l=$((l1 - l0)) -v k=$((b1 - b0)) -v w=$((w1 - w0)) -v s=$((s1 - s0)) \
    'BEGIN { n = r * 3; printf "%-32s rps %6.0f p99 %-8s proxy %5.1f us/req  backends %5.1f  wrk %5.1f  preempted %.2f/req\n", b, r, p, l * 1e4 / n, k * 1e4 / n, w * 1e4 / n, s / n }'
  kill "$lp" "${backends[@]}" 2>/dev/null || true
  wait "$lp" "${backends[@]}" 2>/dev/null || true
  PIDS=()
}

echo "== $W workers x $C connections, $R rounds, $STRATEGY"
for _ in $(seq "$R"); do
  for bin in "$@"; do one "$bin"; done
done
