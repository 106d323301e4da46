#!/usr/bin/env bash
# Before/after CPU a gRPC call of `lbkit proxy` builds alone, steadier than grpc-cpu.sh's ticks:
# per round and per BINARY (alternating), a proxy (one worker, round robin, h2c, no forwarding
# headers) in front of three tonic backends (lbkit-tower's echo_server example), h2load for
# 12 s, and the proxy's `task-clock` (`perf stat -p`) over 6 s from its third second; prints
# calls/s and µs a call (task-clock ms × 1000 / (calls/s × 6)).
#
#   scripts/grpc-ab.sh ROUNDS BINARY...
#   CALL=repeat scripts/grpc-ab.sh 3 /tmp/lbkit-old target/release/lbkit   # server streaming
#   SHAPE="-c32 -m8" scripts/grpc-ab.sh 3 /tmp/lbkit-old /tmp/lbkit-new
#
# CALL is `say` (unary, the default) or `repeat` (`echo.Echo/Repeat`, 10 replies a call).
# Needs h2load and perf (see grpc-cpu.sh); builds the echo_server example. Ports 29401-29411.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
# shellcheck source=scripts/proxy-configs.sh
. "$ROOT/scripts/proxy-configs.sh"
[ $# -ge 2 ] || { echo "usage: $0 ROUNDS BINARY..." >&2; exit 2; }
for tool in h2load perf; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (see grpc-cpu.sh)" >&2; exit 2; }
done
(cd "$ROOT" && cargo build --release -q -p lbkit-tower --example echo_server)
WORK=$(mktemp -d /tmp/grpc-ab.XXXXXX); PIDS=(); trap proxy_cleanup EXIT
grpc_call_setup "$WORK"
case ${CALL:-say} in
  say) ARGS=("${H2LOAD_ARGS[@]}"); METHOD=Say ;;
  repeat) # RepeatRequest { message: "hello", count: 10 }, gRPC-framed
    printf '\x00\x00\x00\x00\x09\x0a\x05hello\x10\x0a' > "$WORK/repeat.bin"
    ARGS=(-H "content-type: application/grpc" -H "te: trailers" -d "$WORK/repeat.bin")
    METHOD=Repeat ;;
  *) echo "CALL must be say or repeat, not $CALL" >&2; exit 2 ;;
esac
mkdir "$WORK/conf" # apart from h2load's output: the proxy watches its configuration's directory
{ lbkit_conf 29410 29411 29401 29402 29403 round-robin
  echo "h2c = true"; echo "forwarded_headers = []"; } > "$WORK/conf/lbkit.toml"
for p in 29401 29402 29403; do
  TOKIO_WORKER_THREADS=1 "$TARGET/release/examples/echo_server" "127.0.0.1:$p" "b$p" \
    >/dev/null 2>&1 & PIDS+=($!)
done
ROUNDS=$1; shift
for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    "$bin" proxy --threads 1 --config "$WORK/conf/lbkit.toml" > "$WORK/lbkit.log" 2>&1 & lp=$!
    PIDS+=("$lp")
    wait_grpc 29410
    # shellcheck disable=SC2086 # SHAPE is h2load's options, split on purpose
    h2load -t2 ${SHAPE:--c4 -m64} "${ARGS[@]}" -D 12 "http://127.0.0.1:29410/echo.Echo/$METHOD" \
      > "$WORK/h2load.txt" & hp=$!
    sleep 3
    perf stat -e task-clock -x, -p "$lp" -- sleep 6 2> "$WORK/stat.txt"
    wait "$hp"
    rps=$(awk '/finished in/ {print $4}' "$WORK/h2load.txt")
    grep -q ' 0 failed' "$WORK/h2load.txt" || echo "$bin: calls failed" >&2
    awk -F, -v r="$rps" -v b="$bin" -v k="$r" '/task-clock/ {
      printf "round %d %-28s %8.0f calls/s %6.2f us a call\n", k, b, r, $1 * 1000 / (r * 6) }' \
      "$WORK/stat.txt"
    kill "$lp"; wait "$lp" 2>/dev/null || true
  done
done
