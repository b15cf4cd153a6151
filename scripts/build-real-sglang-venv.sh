#!/usr/bin/env bash
# Build (or reuse) a venv with the real SGLang serving engine and its CPU engine, for the real-engine tier
# (tests/real_engines): deployer deploys it over SSH and it serves a tiny local model on this CPU
# (`SGLANG_USE_CPU_ENGINE=1 ... --device cpu`).
#
#   scripts/build-real-sglang-venv.sh DIR     # e.g. ~/.cache/deployer/real-sglang-venv
#
# SGLang imports torchvision unconditionally and PyPI's torchvision is CUDA-linked, so this venv uses the CUDA
# build of torch 2.14.1 with torchvision 0.29.1 (both on this machine's disk; they run on a CPU,
# torch.cuda.is_available() is False). sglang goes in with --no-deps, then its requirements less the CUDA-only
# ones. No CPU build of sgl-kernel exists on PyPI: the clearly named stand-in in
# tests/standin/sgl_kernel_cpu (CPU bookkeeping helpers only) is installed as `sgl_kernel`.
# Rebuilt only when DIR/.stamp differs from the stamp below (the stand-in's hash included).
set -euo pipefail

DIR=${1:?usage: build-real-sglang-venv.sh DIR}
PY=${PYTHON:-python3}
SGLANG_VERSION=0.5.23
HERE=$(cd "$(dirname "$0")/.." && pwd)
STANDIN=$HERE/tests/standin/sgl_kernel_cpu/sgl_kernel
TORCH=("torch==2.14.1" "torchvision==0.29.1")
# sglang 0.5.23's Requires-Dist less what needs CUDA (flashinfer, sglang-kernel, flash-attn-4, cuda-python,
# nvidia-cutlass-dsl, nvidia-mathdx, nvshmem4py, quack-kernels, sgl-deep-ep/deep-gemm/flash-mla, tilelang,
# humming-kernels, torch_memory_saver, torchaudio, torchcodec) and what only serves other hardware or
# datasets (deepseek-recipe, tml-renderers, modelscope, datasets, smg-grpc-servicer, kernels).
DEPS=(
  aiohttp "anthropic>=0.20.0" dill "apache-tvm-ffi==0.1.11" "blobfile==3.0.0" build "compressed-tensors==0.18.0" distro
  easydict einops fastapi gguf interegular IPython "llguidance>=1.7.6,<2.0.0" "mistral_common>=1.11.5" msgspec
  ninja "numba==0.65.1" numpy nvidia-ml-py "openai==2.8.0" "openai-harmony==0.0.4" orjson "outlines==0.1.11"
  packaging partial_json_parser pillow "prometheus-client>=0.20.0" psutil py-spy pybase64 pydantic
  "python-dateutil<3" python-multipart "pyzmq>=25.1.2" regex requests scipy "sentencepiece==0.2.1" setproctitle
  "soundfile==0.13.1" tiktoken "timm==1.0.25" "tokenizers==0.23.2" tqdm "transformers==5.19.0" "uvicorn>=0.51"
  uvloop watchfiles "xgrammar==0.2.7" xxhash zstandard
)
STAMP="sglang=$SGLANG_VERSION torch=${TORCH[*]} deps=${DEPS[*]} standin=$(cat "$STANDIN"/*.py | sha256sum | cut -c1-16) py=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

source "$HERE/scripts/cpu-venv-lib.sh"
cpu_venv_begin "$DIR" "$STAMP" "real sglang venv"
start=$(date +%s)
cpu_venv_new "$DIR"
"${PIP[@]}" "${TORCH[@]}"
"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
"${PIP[@]}" "${TORCH[@]}" "${DEPS[@]}"
site=$("$DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r "$STANDIN" "$site/sgl_kernel"
# Smoke: the CPU engine's modules import (the stand-in included) and the version is the pinned one.
SGLANG_USE_CPU_ENGINE=1 "$DIR/bin/python" - "$SGLANG_VERSION" <<'PY'
import sys
import sgl_kernel
import sglang.srt.mem_cache.allocation  # noqa: F401  (imports the stand-in's helper on a CPU)
from sglang.version import __version__
assert sgl_kernel.STANDIN and __version__ == sys.argv[1], (__version__, sys.argv[1])
print(f"real sglang venv ok: sglang {__version__} (sgl_kernel stand-in)")
PY
cpu_venv_done "$DIR" "$STAMP" "$start"
