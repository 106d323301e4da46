# Shared by scripts/bench-proxy.sh, scripts/proxy-ab.sh and scripts/proxy-idle-rss.py (sourced):
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

# nginx_conf WORKERS FRONT B1 B2 B3 DIR: round robin, upstream keep-alive, access log off.
nginx_conf() {
  cat <<CONF
worker_processes $1;
pid $6/nginx.pid;
error_log stderr error;
events { worker_connections 4096; multi_accept on; }
http {
  access_log off;
  upstream b { server 127.0.0.1:$3; server 127.0.0.1:$4; server 127.0.0.1:$5; keepalive 128; }
  server {
    listen 127.0.0.1:$2;
    location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
}

# lbkit_conf FRONT ADMIN B1 B2 B3 STRATEGY [LIMITS]: default limits (plus LIMITS lines, e.g.
# "header_read_timeout_ms = 60000"), retries, outlier detection.
lbkit_conf() {
  cat <<CONF
[admin]
bind = "127.0.0.1:$2"
[limits]
max_connections = 4096
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
