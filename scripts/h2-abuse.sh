#!/usr/bin/env bash
# The HTTP/2 attacks of issue 40 against a release `lbkit proxy` (one worker, its defaults but
# `stream_idle_timeout_ms = 2000`; the route's `timeout_ms` 10 s), with figures for
# RELIABILITY.md. The attacker is lbkit-proxy's `h2_abuse` example, which also serves the
# proxy's backend (counting the upstream connections the proxy makes) and runs a second client
# of the same backend meanwhile.
#
#   ROUNDS=3 SECONDS_EACH=5 scripts/h2-abuse.sh
#   LBKIT=/tmp/lbkit-old ROUNDS=1 scripts/h2-abuse.sh   # another lbkit binary (default: the build)
#
# Per round: the paced rapid reset for SECONDS_EACH seconds (50 streams, a PING, its ACK, 50
# RST_STREAMs, again; a new connection after each GOAWAY), then three streams stuck on a zero
# window while their connection's other streams are answered. One JSON line per run.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
SECONDS_EACH=${SECONDS_EACH:-5}
BASE_PORT=${BASE_PORT:-29380}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d /tmp/h2-abuse.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

(cd "$ROOT" && cargo build --release -q -p lbkit --bin lbkit \
  && cargo build --release -q -p lbkit-proxy --example h2_abuse)

FRONT=$((BASE_PORT + 1)); ADMIN=$((BASE_PORT + 2)); BACKEND=$((BASE_PORT + 3))
cat > "$WORK/proxy.toml" <<EOF
[admin]
bind = "127.0.0.1:$ADMIN"
[limits]
stream_idle_timeout_ms = 2000
[[listener]]
bind = "127.0.0.1:$FRONT"
[[route]]
service = "svc"
timeout_ms = 10000
[service.svc]
endpoints = ["127.0.0.1:$BACKEND"]
EOF
"${LBKIT:-$TARGET/release/lbkit}" proxy --config "$WORK/proxy.toml" --threads 1 >"$WORK/proxy.log" 2>&1 &
PIDS+=($!)

for r in $(seq 1 "$ROUNDS"); do
  echo "# round $r" >&2
  "$TARGET/release/examples/h2_abuse" paced "127.0.0.1:$FRONT" "$BACKEND" "$SECONDS_EACH"
  "$TARGET/release/examples/h2_abuse" zero-window "127.0.0.1:$FRONT" "$BACKEND" 3
done
echo "# the proxy's counters" >&2
curl -s "http://127.0.0.1:$ADMIN/metrics" | grep -E '^lbkit_proxy_(http2|client_connections_limited)' >&2
