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
