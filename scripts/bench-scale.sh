#!/usr/bin/env bash
# Scale of configuration (issue 18, part 5): a proxy with 1 000 services x 100 endpoints and a
# ZooKeeper watcher following 10 000 providers with 1 % churn per second. The measurements
# are scripts/bench-scale.py's (its docstring says what each one is); this script makes what
# they need: release builds of `lbkit` and the backend example, wrk (Debian's package, when
# missing), the Python environment of scripts/python.sh (psutil, kazoo) and, for `zk`, a
# standalone ZooKeeper of scripts/zookeeper.sh (its own data dir, stopped at exit).
#
#   scripts/bench-scale.sh proxy [--sizes 1,10,100,1000 --endpoints 100 --workers 1 --rounds 3]
#   scripts/bench-scale.sh zk [--providers 1000,10000 --churn 0.01 --seconds 30 --via watch|proxy|pool]
#   scripts/bench-scale.sh files [--services 1,100 --endpoints 1000 --changes 30 --strategy S]
#   scripts/bench-scale.sh all
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
what=${1:-all}
shift || true

(cd "$ROOT" && cargo build --release -q -p lbkit --bin lbkit --example zk_pool \
  && cargo build --release -q -p lbkit-proxy --example backend)
eval "$("$ROOT/scripts/python.sh")" # LBKIT_PYTHON
if ! command -v wrk >/dev/null; then
  echo "installing wrk from Debian's packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi

run_proxy() {
  "$LBKIT_PYTHON" "$ROOT/scripts/bench-scale.py" proxy --lbkit "$TARGET/release/lbkit" \
    --backend "$TARGET/release/examples/backend" "$@"
}

run_zk() {
  export LBKIT_ZK_DIR
  LBKIT_ZK_DIR=$(mktemp -d /tmp/bench-scale-zk.XXXXXX)
  trap '"$ROOT/scripts/zookeeper.sh" stop >/dev/null 2>&1 || true; rm -rf "$LBKIT_ZK_DIR"' EXIT
  eval "$("$ROOT/scripts/zookeeper.sh" start)" # LBKIT_ZK
  "$LBKIT_PYTHON" "$ROOT/scripts/bench-scale.py" zk --lbkit "$TARGET/release/lbkit" --zk "$LBKIT_ZK" "$@"
}

case $what in
  proxy) run_proxy "$@" ;;
  zk) run_zk "$@" ;;
  files) "$LBKIT_PYTHON" "$ROOT/scripts/bench-scale.py" files --lbkit "$TARGET/release/lbkit" "$@" ;;
  all) run_proxy; echo; run_zk ;;
  *) echo "usage: scripts/bench-scale.sh proxy|zk|files|all [options of scripts/bench-scale.py]" >&2; exit 2 ;;
esac
