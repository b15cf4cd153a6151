#!/usr/bin/env bash
# Build (or reuse) a venv with uv (PyPI `uv`: its Rust binary in a wheel), for the tests in which the target has uv
# on its PATH and deployer builds a managed environment with it (tests/integration/test_install_uv.py).
#
#   scripts/build-uv-venv.sh DIR      # e.g. ~/.cache/deployer/uv-venv; the binary is DIR/bin/uv
#
# Rebuilt only when DIR/.stamp differs from the stamp below.
set -euo pipefail

DIR=${1:?usage: build-uv-venv.sh DIR}
PY=${PYTHON:-python3}
UV_VERSION=${UV_VERSION:-0.13.8}
STAMP="uv=$UV_VERSION"

source "$(dirname "$0")/cpu-venv-lib.sh"
cpu_venv_lock "$DIR"
if [[ -x "$DIR/bin/uv" && -f "$DIR/.stamp" && "$(cat "$DIR/.stamp")" == "$STAMP" ]]; then
  echo "uv venv up to date: $DIR"
  exit 0
fi
start=$(date +%s)
rm -rf "$DIR"
$PY -m venv "$DIR"
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "uv==$UV_VERSION"
"$DIR/bin/uv" --version >/dev/null
echo "$STAMP" > "$DIR/.stamp"
echo "uv venv built in $(( $(date +%s) - start ))s: $DIR ($("$DIR/bin/uv" --version))"
