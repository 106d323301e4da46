#!/usr/bin/env bash
# Every test, as CI runs them: starts a standalone ZooKeeper on loopback for the discovery tests
# (scripts/zookeeper.sh installs Debian's `zookeeper` package when missing), makes the Python
# virtual environment of the metrics format test (scripts/python.sh, pinned packages), runs
# `cargo test --workspace` with any extra arguments, and stops ZooKeeper on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'scripts/zookeeper.sh stop >/dev/null 2>&1 || true' EXIT
eval "$(scripts/zookeeper.sh start)" # exports LBKIT_ZK
eval "$(scripts/python.sh)"          # exports LBKIT_PYTHON (a venv with scripts/requirements.txt)
cargo test --workspace "$@"
