"""Writes the SYNTHETIC vLLM cases of tests/cases/vllm/ that only a GPU (or the network) could produce for real:
a real 0.32.0 CPU capture (kv-cache-too-small.log, from capture_real.py) with its root-cause exception, in both
places vLLM prints it (the EngineCore's logger-prefixed copy, every line re-prefixed after \\r\\n, and the plain
copy on the process's stderr), replaced by the text the case names; the frames stay the capture's. Each case's
`provenance:` in expected.yaml (kind synthetic) names the source file:line of the text it copies.

    .venv/bin/python tests/cases/tools/make_synthetic.py
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

CASES = Path(__file__).resolve().parents[1] / "vllm"
BASE = "kv-cache-too-small"
ROOT_CAUSE = re.compile(r"ValueError: To serve at least one request with the model's max seq len[^\r\n]*")

SYNTHETIC: dict[str, dict[str, Any]] = {
    "cuda-illegal-memory-access": {
        "exception": "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
                     "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                     "below might be incorrect.\n"
                     "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "source": "torch 2.14.1 c10/cuda/CUDAException.h C10_CUDA_CHECK -> c10_cuda_check_implementation ('CUDA error: ' + "
                  "cudaGetErrorString(cudaErrorIllegalAddress)); the two lines after it are strings of the wheel's "
                  "torch/lib/libc10_cuda.so (checked in the real SGLang venv)",
    },
    "cuda-no-kernel-image": {
        "exception": "torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device\n"
                     "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                     "below might be incorrect.\n"
                     "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "source": "torch 2.14.1 c10/cuda/CUDAException.h C10_CUDA_CHECK -> c10_cuda_check_implementation ('CUDA error: ' + "
                  "cudaGetErrorString(cudaErrorNoKernelImageForDevice)); the two lines after it are strings of the "
                  "wheel's torch/lib/libc10_cuda.so (checked in the real SGLang venv)",
    },
    "nccl-unhandled-cuda-error": {
        "exception": "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                     "NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version "
                     "2.27.3\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 2 "
                     "'out of memory'",
        "source": "torch 2.14.1 torch/include/torch/csrc/distributed/c10d/NCCLUtils.hpp:71 C10D_NCCL_CHECK ('NCCL error "
                  "in: ' file:line ', ' ncclGetErrorString ...); NCCL src/misc/utils.cc ncclGetErrorString "
                  "'unhandled cuda error'",
    },
    "cuda-driver-too-old": {
        "exception": "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update "
                     "your GPU driver by downloading and installing a new version from the URL: "
                     "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install "
                     "a PyTorch version that has been compiled with your version of the CUDA driver.",
        "source": "torch 2.14.1 c10/cuda/CUDAFunctions.cpp: 'The NVIDIA driver on your system is too old (found "
                  "version ' is a string of the wheel's torch/lib/libc10_cuda.so (checked in the real SGLang venv)",
    },
    "hf-gated-repo": {
        "exception": "OSError: You are trying to access a gated repo.\n"
                     "Make sure to have access to it at https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct.\n"
                     "401 Client Error.\n\n"
                     "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/"
                     "resolve/main/config.json.",
        "source": "transformers 5.19.0 utils/hub.py:611 cached_files ('You are trying to access a gated repo.') over "
                  "huggingface_hub 1.33.0 utils/_http.py:860 hf_raise_for_status (GatedRepoError '401 Client Error. "
                  "Cannot access gated repo for url ...'), both as installed in the real SGLang venv",
    },
    # the API server's wrapper alone names the failure when the EngineCore's own error is one no signature knows
    "engine-core-unknown-cause": {
        "exception": "KeyError: 'model.layers.0.mlp.gate_up_proj.weight'",
        "source": "Python's KeyError as a model's load_weights raises it for a checkpoint weight the model class has no "
                  "parameter for (vllm 0.32.0 model_executor/models/*.py `params_dict[name]`): a root cause no "
                  "signature knows; the wrapper after it is the capture's own (v1/engine/utils.py:1432 "
                  "wait_for_engine_startup)",
    },
}


def splice(base: str, exception: str) -> str:
    out = []
    for line in base.split("\n"):
        found = ROOT_CAUSE.search(line)
        if found is None:
            out.append(line)
            continue
        head = line[: found.start()]
        tail = line[found.end():]                   # "\r" of a re-prefixed line, or nothing
        out.append(head + exception.replace("\n", "\r\n" + head if head else "\n") + tail)
    return "\n".join(out)


def main() -> None:
    base = (CASES / f"{BASE}.log").read_bytes().decode("utf-8")
    assert len(ROOT_CAUSE.findall(base)) == 2, "the base capture has its root cause twice (prefixed and plain)"
    path = CASES / "expected.yaml"
    header = "".join(line for line in path.read_text(encoding="utf-8").splitlines(True) if line.startswith("#"))
    data: dict[str, dict[str, Any]] = yaml.safe_load(path.read_text(encoding="utf-8"))
    for name, case in SYNTHETIC.items():
        (CASES / f"{name}.log").write_bytes(splice(base, case["exception"]).encode("utf-8"))
        entry = data.setdefault(name, {})
        entry["provenance"] = {
            "kind": "synthetic",
            "source": case["source"],
            "how": f"the real 0.32.0 CPU capture {BASE}.log with its root-cause exception (both copies) replaced by "
                   "this text (tests/cases/tools/make_synthetic.py); frames and startup lines are the capture's",
        }
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120), encoding="utf-8")


if __name__ == "__main__":
    main()
