#!/usr/bin/env bash
# Build (or reuse) a CPU-only venv with real SGLang code, enough to run its argument parser and
# its argument resolution (`prepare_server_args` + `resolve_once`) without a GPU.
#
#   scripts/build-sglang-venv.sh DIR [VERSION]   # e.g. ~/.cache/deployer/sglang-venv 0.5.23
#
# VERSION (default 0.5.23, or env SGLANG_VERSION) picks the release and the dependency pins it needs:
# 0.5.23 is the current release; 0.5.10 is the seed era (the first release whose resolution raises the
# radix-cache error of `--mamba-scheduler-strategy no_buffer` with speculative decoding).
#
# The venv is rebuilt only when DIR/.stamp is missing or differs from the stamp below (versions and
# package list), so a warm run costs a file comparison. torch comes from the local CPU wheel
# (pip's constraints cap torch to what lies on disk); sglang and triton are installed with --no-deps
# so pip can never pull a CUDA torch.
set -euo pipefail

DIR=${1:?usage: build-sglang-venv.sh DIR [VERSION]}
SGLANG_VERSION=${2:-${SGLANG_VERSION:-0.5.23}}
PY=${PYTHON:-python3}
# The only torch wheel here is the local CPU build; each release pins another torch, but its argument
# parser and resolution run on this one (checked by the smoke below and by tests/sglang_real).
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

# The minimal set that `sglang.srt.server_args` and its resolution import, found by trial: start from
# nothing, import, install what is missing, repeat. Pins follow each release's own requirements.
COMMON=(
  huggingface_hub safetensors
  msgspec numpy pydantic packaging psutil requests regex tqdm pyyaml filelock einops orjson pybase64
  pillow starlette pyzmq ipython aiohttp dill "sentencepiece==0.2.1" gguf
  loguru  # compressed-tensors needs it; it is installed --no-deps below
)
case "$SGLANG_VERSION" in
  0.5.23)
    DEPS=("${COMMON[@]}" "transformers==5.19.0" "tokenizers==0.23.2" "apache-tvm-ffi==0.1.11")
    NODEPS=("sglang==$SGLANG_VERSION" triton "torchvision==0.28.0" "compressed-tensors==0.18.0") ;;
  0.5.10)  # its METADATA: transformers==5.3.0, openai==2.6.1, apache-tvm-ffi>=0.1.5,<0.2
    DEPS=("${COMMON[@]}" "transformers==5.3.0" "apache-tvm-ffi==0.1.11" "openai==2.6.1" partial_json_parser)
    NODEPS=("sglang==$SGLANG_VERSION" triton "torchvision==0.28.0" "compressed-tensors==0.18.0") ;;
  *) echo "build-sglang-venv: no dependency pins for sglang $SGLANG_VERSION (known: 0.5.23, 0.5.10)" >&2
     exit 2 ;;
esac

STAMP="sglang=$SGLANG_VERSION torch=$TORCH_VERSION nodeps=${NODEPS[*]} deps=${DEPS[*]} py=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

HERE=$(cd "$(dirname "$0")/.." && pwd)
source "$HERE/scripts/cpu-venv-lib.sh"
cpu_venv_lock "$DIR"
if cpu_venv_fresh "$DIR" "$STAMP"; then
  echo "sglang venv up to date: $DIR"
  exit 0
fi
start=$(date +%s)
cpu_venv_build "$DIR" build-sglang-venv "$TORCH_VERSION" NODEPS DEPS

# Smoke: the flag set must be introspectable, or the venv is useless. The test bed's sitecustomize
# (tests/sglang_real/h200) lets the CUDA-built torchvision import on this CPU torch.
PYTHONPATH="$HERE/tests/sglang_real/h200" FAKE_H200=0 "$DIR/bin/python" - "$SGLANG_VERSION" <<'PY'
import argparse, sys
from sglang.srt.server_args import ServerArgs
from sglang.version import __version__
assert __version__ == sys.argv[1], (__version__, sys.argv[1])
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
print(f"sglang {__version__} venv ok: {len(p._actions)} argparse actions")
PY
cpu_venv_done "$DIR" "$STAMP" "$start"
