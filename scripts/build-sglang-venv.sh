#!/usr/bin/env bash
# Build (or reuse) a CPU-only venv with real SGLang code, enough to run its argument parser and
# its argument resolution (`prepare_server_args` + `resolve_once`) without a GPU.
#
#   scripts/build-sglang-venv.sh DIR      # e.g. .cache/sglang-venv
#
# The venv is rebuilt only when DIR/.stamp is missing or differs from the stamp below (versions and
# package list), so a warm run costs a file comparison. torch comes from the local CPU wheel
# (pip's constraints cap torch to what lies on disk); sglang and triton are installed with --no-deps
# so pip can never pull a CUDA torch.
set -euo pipefail

DIR=${1:?usage: build-sglang-venv.sh DIR}
PY=${PYTHON:-python3}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

# The minimal set that `sglang.srt.server_args` and its resolution import, found by trial: start from
# nothing, import, install what is missing, repeat. Pins follow sglang 0.5.23's own requirements.
DEPS=(
  "transformers==5.19.0" "tokenizers==0.23.2" huggingface_hub safetensors
  msgspec numpy pydantic packaging psutil requests regex tqdm pyyaml filelock einops orjson pybase64
  pillow starlette pyzmq ipython aiohttp dill "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" gguf
  loguru  # compressed-tensors needs it; it is installed --no-deps below
)
# Packages whose requirements name torch: installed without dependencies so the CPU torch stays.
NODEPS=("sglang==$SGLANG_VERSION" triton "torchvision==0.28.0" "compressed-tensors==0.18.0")

STAMP="torch=$TORCH_VERSION nodeps=${NODEPS[*]} deps=${DEPS[*]} py=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

if [[ -x "$DIR/bin/python" && -f "$DIR/.stamp" && "$(cat "$DIR/.stamp")" == "$STAMP" ]]; then
  echo "sglang venv up to date: $DIR"
  exit 0
fi

start=$(date +%s)
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
$PY -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" --no-deps "${NODEPS[@]}"
"${PIP[@]}" "${DEPS[@]}"
if ! "$DIR/bin/python" -c 'import sys, torch; sys.exit(0 if torch.version.cuda is None else 1)'; then
  echo "build-sglang-venv: pip replaced the CPU torch with a CUDA one; refusing this venv" >&2
  exit 1
fi

# Smoke: the flag set must be introspectable, or the venv is useless. The test bed's sitecustomize
# (tests/sglang_real/h200) lets the CUDA-built torchvision import on this CPU torch.
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$HERE/tests/sglang_real/h200" FAKE_H200=0 "$DIR/bin/python" - <<'PY'
import argparse
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
print(f"sglang venv ok: {len(p._actions)} argparse actions")
PY
echo "$STAMP" > "$DIR/.stamp"
echo "built $DIR in $(( $(date +%s) - start ))s"
