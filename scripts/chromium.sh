#!/usr/bin/env bash
# Debian's Chromium, for the browser check of the HTML reports (crates/lbkit/tests/html_report.rs):
# installs the `chromium` package when it is missing, then prints `export LBKIT_CHROMIUM=...`
# for eval, as scripts/zookeeper.sh does for LBKIT_ZK. The tests start it headless, with a fresh
# profile and no network of its own.
set -euo pipefail
bin=$(command -v chromium || true)
if [ -z "$bin" ]; then
    echo "chromium.sh: installing Debian's chromium package" >&2
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends chromium >&2
    bin=$(command -v chromium)
fi
echo "export LBKIT_CHROMIUM=$bin"
