#!/usr/bin/env bash
# Build (or reuse) a venv with the real SGLang Model Gateway (`smg` from PyPI; a Rust binary in a wheel, runs on
# a CPU), for the fleet tests that put the real router in front of stand-in engines.
#
#   scripts/build-smg-venv.sh DIR      # e.g. ~/.cache/deployer/smg-venv
#
# Rebuilt only when DIR/.stamp differs from the stamp below. DIR/wheelhouse holds smg's wheels and its dependencies
# (pip download), the local package source from which the router tests have deployer install smg itself
# (router.install with find_links, no index).
set -euo pipefail

DIR=${1:?usage: build-smg-venv.sh DIR}
PY=${PYTHON:-python3}
SMG_VERSION=${SMG_VERSION:-1.13.0}
STAMP="smg=$SMG_VERSION py=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

wheelhouse() {
  [[ -f "$DIR/wheelhouse/.stamp" && "$(cat "$DIR/wheelhouse/.stamp")" == "$STAMP" ]] && return 0
  rm -rf "$DIR/wheelhouse"
  "$DIR/bin/python" -m pip download --quiet --disable-pip-version-check --only-binary :all: \
    -d "$DIR/wheelhouse" "smg==$SMG_VERSION"
  echo "$STAMP" > "$DIR/wheelhouse/.stamp"
  echo "smg wheelhouse: $DIR/wheelhouse ($(ls "$DIR/wheelhouse" | grep -c '\.whl$') wheels)"
}

if [[ -x "$DIR/bin/smg" && -f "$DIR/.stamp" && "$(cat "$DIR/.stamp")" == "$STAMP" ]]; then
  wheelhouse
  echo "smg venv up to date: $DIR"
  exit 0
fi
source "$(dirname "$0")/cpu-venv-lib.sh"
cpu_venv_lock "$DIR"   # creates DIR's parent first: a fresh machine has no ~/.cache/deployer
start=$(date +%s)
rm -rf "$DIR"
$PY -m venv "$DIR"
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "smg==$SMG_VERSION"
"$DIR/bin/smg" launch --help >/dev/null
echo "$STAMP" > "$DIR/.stamp"
wheelhouse
echo "smg venv built in $(( $(date +%s) - start ))s: $DIR ($("$DIR/bin/python" -c 'import smg.version as v; print(v.__version__)'))"
