#!/usr/bin/env bash
# Build (or reuse) a CPU-only venv with real vLLM code, enough to build its serve argument parser
# (`vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser())`) without a GPU.
#
#   scripts/build-vllm-venv.sh DIR      # e.g. ~/.cache/deployer/vllm-venv
#
# Rebuilt only when DIR/.stamp is missing or differs from the stamp below. vLLM 0.33.0 asks for
# torch==2.14.0 (a CUDA build on PyPI); its parser runs on the local CPU wheel 2.13.0, so vllm goes in
# with --no-deps and pip can never pull a CUDA torch. The parser needs VLLM_TARGET_DEVICE=cpu here
# (no GPU to infer the platform from); the CPU platform changes no flag name.
set -euo pipefail

DIR=${1:?usage: build-vllm-venv.sh DIR}
PY=${PYTHON:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

# What `make_arg_parser` imports, found by trial (start from nothing, import, install what is missing,
# repeat); pins follow vllm 0.33.0's own requirements where it pins.
DEPS=(
  "transformers==5.19.0" "tokenizers==0.23.2" "huggingface_hub>=1.31.0" safetensors
  packaging regex cachetools psutil numpy requests tqdm pydantic pyyaml msgspec cloudpickle pyzmq
  filelock einops pybase64 blake3 py-cpuinfo cbor2 aiohttp "openai>=2.25.0" openai-harmony pillow uvloop
  "fastapi>=0.133.0,<0.137.0" prometheus_client partial-json-parser "llguidance>=1.7.0,<1.8.0"
)
# Packages whose requirements name torch: installed without dependencies so the CPU torch stays.
NODEPS=("vllm==$VLLM_VERSION" "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11")

STAMP="torch=$TORCH_VERSION nodeps=${NODEPS[*]} deps=${DEPS[*]} py=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

source "$(cd "$(dirname "$0")" && pwd)/cpu-venv-lib.sh"
cpu_venv_lock "$DIR"
if cpu_venv_fresh "$DIR" "$STAMP"; then
  echo "vllm venv up to date: $DIR"
  exit 0
fi
start=$(date +%s)
cpu_venv_build "$DIR" build-vllm-venv "$TORCH_VERSION" NODEPS DEPS

# Smoke: the real parser must build, or the venv is useless.
VLLM_TARGET_DEVICE=cpu "$DIR/bin/python" - <<'PY'
import vllm
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = make_arg_parser(FlexibleArgumentParser())
print(f"vllm venv ok: vLLM {vllm.__version__}, {len(p._actions)} argparse actions")
PY
cpu_venv_done "$DIR" "$STAMP" "$start"
