#!/usr/bin/env bash
# A Python virtual environment with the pinned packages of scripts/requirements.txt, in
# target/venv (made once, then reused while the requirements file is unchanged). Prints
# `export LBKIT_PYTHON=...` for eval, as scripts/zookeeper.sh does for LBKIT_ZK.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/venv
REQ=scripts/requirements.txt
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQ" "$VENV/requirements.txt"; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ" >&2
  cp "$REQ" "$VENV/requirements.txt"
fi
echo "export LBKIT_PYTHON=$PWD/$VENV/bin/python"
