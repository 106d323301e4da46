#!/usr/bin/env bash
# The tests' Node.js peers (scripts/node/package.json, versions locked in its
# package-lock.json): `npm ci` into target/node, made once and reused while the lock file is
# unchanged. Prints `export LBKIT_NODE=...` (a directory whose node_modules holds them) for
# eval, as scripts/python.sh does for LBKIT_PYTHON. Needs Node.js and npm (the machine's).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=target/node
if [ ! -d "$DIR/node_modules" ] || ! cmp -s scripts/node/package-lock.json "$DIR/package-lock.json"; then
  rm -rf "$DIR"
  mkdir -p "$DIR"
  cp scripts/node/package.json scripts/node/package-lock.json "$DIR/"
  (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
echo "export LBKIT_NODE=$PWD/$DIR"
