#!/usr/bin/env bash
# Where a unary gRPC call's CPU goes: HAProxy (`proto h2` both sides) and `lbkit proxy`
# (`h2c = true`, round robin, no forwarding headers), one worker each, alternating, ROUNDS
# rounds (issue 18). Each run: three tonic backends (lbkit-tower's echo_server example), a 2 s
# h2load warm-up, then 8 s measured; prints req/s, the proxy's CPU a call (user + system ticks
# of all its threads over the 8 s) and its system calls a call (`perf stat -e
# raw_syscalls:sys_enter` over 4 s in the middle of the run).
#
#   ROUNDS=3 SHAPE="-c4 -m64" scripts/grpc-cpu.sh
#   SHAPE="-c32 -m8" scripts/grpc-cpu.sh
#
# Needs haproxy, h2load (scripts/bench-grpc.sh installs both) and perf (Debian's linux-perf);
# the proxies and backends share the machine's cores with h2load, as in bench-grpc.sh.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
SHAPE=${SHAPE:-"-c4 -m64"}
BASE_PORT=${BASE_PORT:-29180}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
# shellcheck source=scripts/proxy-configs.sh
. "$ROOT/scripts/proxy-configs.sh"
WORK=$(mktemp -d /tmp/grpc-cpu.XXXXXX)
PIDS=()
trap proxy_cleanup EXIT

for tool in haproxy h2load perf; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (see the header)" >&2; exit 2; }
done
(cd "$ROOT" && cargo build --release -q -p lbkit --bin lbkit \
  && cargo build --release -q -p lbkit-tower --example echo_server)

B1=$((BASE_PORT + 1)); B2=$((BASE_PORT + 2)); B3=$((BASE_PORT + 3)); FRONT=$((BASE_PORT + 10))
ADMIN=$((BASE_PORT + 11))
grpc_call_setup "$WORK"
# shellcheck disable=SC2206 # SHAPE is h2load's options, split on purpose
H2LOAD=(h2load -t2 $SHAPE "${H2LOAD_ARGS[@]}" "http://127.0.0.1:$FRONT/echo.Echo/Say")

{ lbkit_conf "$FRONT" "$ADMIN" "$B1" "$B2" "$B3" round-robin
  echo "h2c = true"; echo "forwarded_headers = []"; } > "$WORK/lbkit.toml"
haproxy_conf 1 "$FRONT" "$B1" "$B2" "$B3" h2 > "$WORK/haproxy.cfg"

for p in $B1 $B2 $B3; do
  TOKIO_WORKER_THREADS=1 "$TARGET/release/examples/echo_server" "127.0.0.1:$p" "b$p" \
    >"$WORK/echo-$p.log" 2>&1 & PIDS+=($!)
done

ticks() { # user + system clock ticks of every thread of pid $1
  local s=0 t
  for t in /proc/"$1"/task/*; do s=$((s + $(awk '{print $14 + $15}' "$t/stat"))); done
  echo "$s"
}

measure() { # $1 pid, $2 label
  wait_grpc "$FRONT"
  "${H2LOAD[@]}" -D 2 >/dev/null
  local before after calls hp rps
  before=$(ticks "$1")
  "${H2LOAD[@]}" -D 8 > "$WORK/out.txt" & hp=$!
  sleep 2
  calls=$(perf stat -e raw_syscalls:sys_enter -p "$1" -x, -- sleep 4 2>&1 \
    | awk -F, '/raw_syscalls/ {print $1}')
  wait "$hp"
  after=$(ticks "$1")
  rps=$(awk '/finished in/ {print $4}' "$WORK/out.txt")
  awk -v l="$2" -v r="$rps" -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v s="$calls" \
    'BEGIN { printf "%-8s %9.0f req/s  %5.1f us CPU a call  %5.2f system calls a call\n",
             l, r, t * 1e6 / hz / (r * 8), s / (r * 4) }'
  kill "$1"; wait "$1" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  echo "-- round $round of $ROUNDS ($SHAPE)"
  haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 & PIDS+=($!)
  measure $! haproxy
  "$TARGET/release/lbkit" proxy --threads 1 --config "$WORK/lbkit.toml" >"$WORK/lbkit.log" 2>&1 &
  PIDS+=($!)
  measure $! lbkit
done
