# Shared by scripts/bench-proxy.sh, bench-grpc.sh, grpc-cpu.sh, proxy-ab.sh and proxy-idle-rss.py (sourced):
# proxy configurations and the clean-up of a benchmark's processes. Each *_conf function prints
# a configuration in front of the backends on ports B1 B2 B3, listening on FRONT; nginx also
# needs WORKERS and its prefix DIR (pid file); lbkit its ADMIN port, STRATEGY and optional extra
# `[limits]` lines.

# proxy_cleanup: kill every pid in the caller's PIDS array, wait, remove $WORK (for trap EXIT).
proxy_cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}

# proxy_family PID: PID and its child processes (nginx's workers), comma-separated.
proxy_family() {
  { echo "$1"; pgrep -P "$1" || true; } | paste -sd,
}

# proxy_ticks PIDS: user + system clock ticks of the comma-separated PIDS, each process's total
# (its live threads and the ones that ended); 0 for a process that is gone.
proxy_ticks() {
  local s=0 p n
  for p in ${1//,/ }; do
    # Fields 14 and 15 of /proc/PID/stat, counted after the command name's closing parenthesis.
    n=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}')
    s=$((s + ${n:-0}))
  done
  echo "$s"
}

# rss_kb PID: total RSS (kB) of PID and its children (nginx and HAProxy workers).
rss_kb() {
  local total=0 p
  for p in $1 $(pgrep -P "$1" || true); do
    total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

# nginx_head WORKERS DIR: what both nginx configurations open with, up to inside `http {`.
nginx_head() {
  cat <<CONF
worker_processes $1;
pid $2/nginx.pid;
error_log stderr error;
events { worker_connections 4096; multi_accept on; }
http {
  access_log off;
CONF
}

# nginx_conf WORKERS FRONT B1 B2 B3 DIR: round robin, upstream keep-alive, access log off.
nginx_conf() {
  nginx_head "$1" "$6"
  cat <<CONF
  upstream b { server 127.0.0.1:$3; server 127.0.0.1:$4; server 127.0.0.1:$5; keepalive 128; }
  server {
    listen 127.0.0.1:$2;
    location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
}

# nginx_grpc_conf WORKERS FRONT B1 B2 B3 DIR: gRPC (h2c) in front, `grpc_pass` to the backends,
# round robin, upstream keep-alive, no cap on requests a connection.
nginx_grpc_conf() {
  nginx_head "$1" "$6"
  cat <<CONF
  # nginx closes a client connection after 1 000 requests by default (and an upstream one
  # too): h2load does not reconnect, so a run would end there.
  keepalive_requests 100000000;
  upstream b {
    server 127.0.0.1:$3; server 127.0.0.1:$4; server 127.0.0.1:$5;
    keepalive 128; keepalive_requests 100000000;
  }
  server {
    listen 127.0.0.1:$2 http2;
    http2_max_concurrent_streams 1024;
    location / { grpc_pass grpc://b; }
  }
}
CONF
}

# haproxy_conf WORKERS FRONT B1 B2 B3 [h2]: nbthread WORKERS, round robin, connection reuse;
# with h2, HTTP/2 on both sides (`proto h2`, for gRPC), else HTTP/1.1 with keep-alive.
haproxy_conf() {
  local proto="" keepalive="  option http-keep-alive"
  if [ "${6:-}" = h2 ]; then proto=" proto h2"; keepalive=""; fi
  cat <<CONF
global
  nbthread $1
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
${keepalive:+$keepalive
}  http-reuse always
frontend f
  bind 127.0.0.1:$2$proto
  default_backend b
backend b
  balance roundrobin
  server s1 127.0.0.1:$3$proto
  server s2 127.0.0.1:$4$proto
  server s3 127.0.0.1:$5$proto
CONF
}

# grpc_call_setup DIR: one call, `echo.Echo/Say` with message "hello", gRPC-framed (flag 0,
# length 7, protobuf), written to DIR/say.bin; sets H2LOAD_ARGS, h2load's options that send it.
grpc_call_setup() {
  printf '\x00\x00\x00\x00\x07\x0a\x05hello' > "$1/say.bin"
  H2LOAD_ARGS=(-H "content-type: application/grpc" -H "te: trailers" -d "$1/say.bin")
}

# wait_grpc PORT: wait until one call (grpc_call_setup's) through PORT succeeds (bounded: 10 s).
wait_grpc() {
  for _ in $(seq 1 50); do
    if h2load -n 1 -c 1 "${H2LOAD_ARGS[@]}" "http://127.0.0.1:$1/echo.Echo/Say" 2>/dev/null \
        | grep -q '1 succeeded'; then return 0; fi
    sleep 0.2
  done
  echo "no gRPC call succeeds through port $1" >&2; return 1
}

# lbkit_conf FRONT ADMIN B1 B2 B3 STRATEGY [LIMITS]: default limits (plus LIMITS lines, e.g.
# "header_read_timeout_ms = 60000"), retries, outlier detection. No cap on requests per client
# connection (the default is 1 000, as nginx's keepalive_requests, which bench-grpc.sh raises
# too): h2load does not reconnect after a GOAWAY, and HAProxy and Envoy have no cap.
lbkit_conf() {
  cat <<CONF
[admin]
bind = "127.0.0.1:$2"
[limits]
max_connections = 4096
max_requests_per_connection = 0
${7:-}
[[listener]]
bind = "127.0.0.1:$1"
[[route]]
service = "b"
[service.b]
endpoints = ["127.0.0.1:$3", "127.0.0.1:$4", "127.0.0.1:$5"]
strategy = "$6"
CONF
}

# envoy_conf FRONT LB_POLICY H2 B...: a static listener and cluster (ROUND_ROBIN or
# LEAST_REQUEST), circuit-breaker thresholds raised so that they never cap a benchmark (the
# defaults allow 1024 connections and requests), codec AUTO (HTTP/1.1, or h2c by its preface);
# H2 = 1 speaks HTTP/2 to the backends (gRPC). No access log.
envoy_conf() {
  local front=$1 policy=$2 h2=$3
  shift 3
  cat <<CONF
static_resources:
  listeners:
  - name: front
    address: { socket_address: { address: 127.0.0.1, port_value: $front } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route: { cluster: b, timeout: 30s }
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: b
    type: STATIC
    lb_policy: $policy
    connect_timeout: 1s
    circuit_breakers:
      thresholds:
      - { max_connections: 1000000, max_pending_requests: 1000000, max_requests: 1000000, max_retries: 1000000 }
CONF
  if [ "$h2" = 1 ]; then
    cat <<CONF
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
CONF
  fi
  cat <<CONF
    load_assignment:
      cluster_name: b
      endpoints:
      - lb_endpoints:
CONF
  local b
  for b in "$@"; do
    echo "        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $b } } }"
  done
}
