#!/usr/bin/env bash
# Faults under load, end to end (RELIABILITY.md, "Faults under load"): real processes on
# loopback — three backends, `lbkit proxy`, `lbkit register`, private ZooKeeper servers — with
# traffic flowing (8 keep-alive connections, a GET every 5 ms each) while
#   sigkill    a backend is killed (SIGKILL)
#   sigstop    a backend hangs (SIGSTOP), then resumes (SIGCONT)
#   zookeeper  ZooKeeper is paused past the session timeout, resumed, then restarted
#   cache      the registry cache's directory turns read-only, then full (a 64 KiB tmpfs)
#   reload     the configuration changes and is reloaded every 100 ms
#   mass       three of five providers leave ZooKeeper in one transaction, their servers up
# Prints a table of figures per scenario and the properties that held; exit 1 if one did not.
#
#   scripts/faults.sh [--quick] [--release] [SCENARIO...]
#
# The documented run is the default (--full: 3 s of traffic before each fault, 10 s per
# phase); --quick is what `cargo test -p lbkit --test faults` runs in CI; --release builds
# `lbkit` (proxy, register) and the run in the release profile (the default is the test
# profile, opt-level 1). Bounded: each
# scenario gives up after 180 s. Installs Debian's zookeeper when missing. The full-disk step
# needs the right to mount a tmpfs (root); without it, it is reported as not tried.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=--full
profile=()
args=()
for a in "$@"; do
    case "$a" in
    --quick) mode="" ;;
    --release) profile=(--release) ;;
    *) args+=("$a") ;;
    esac
done
scripts/zookeeper.sh install
mkdir -p target
cargo test --locked "${profile[@]}" -p lbkit --test faults -- $mode "${args[@]}" | tee target/faults.md
