#!/usr/bin/env bash
# The loom models (exhaustive interleavings of the lock-free state): lbkit-core's retry budget,
# windowed response-time mean, live statistics and snapshot swap with guards in flight, and
# lbkit-strategy's round-robin counters. A separate target directory: `--cfg lbkit_loom` rebuilds
# everything, and must not invalidate the normal build.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg lbkit_loom ${RUSTFLAGS:-}"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
cargo test --release -p lbkit-core -p lbkit-strategy --test loom "$@"
