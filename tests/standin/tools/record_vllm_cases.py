"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

Records the SYNTHETIC (GPU-only) failure logs of tests/cases/vllm/ by running the stand-in vLLM (whose texts are
vLLM 0.33.0's, with the file:line of each in vllm/standin_engine.py) in each failure mode, stdout and stderr into one
file as the supervisor writes engine.log. Every failure a CPU can produce is a real capture instead
(tests/cases/tools/capture_real.py); each case's provenance is in tests/cases/vllm/expected.yaml.

    python3 tests/standin/tools/record_vllm_cases.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "cases" / "vllm"
MODEL = ["--model", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "0"]
# name -> (extra argv, env)
CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "kv-cache-too-small-h200": (["--gpu-memory-utilization", "0.9"], {"STANDIN_GPU_GB": "23.5"}),
    "no-memory-for-cache-blocks": (["--gpu-memory-utilization", "0.5"], {"STANDIN_GPU_GB": "23.5"}),
    "free-memory-below-utilization": ([], {"STANDIN_GPU_FREE_GB": "101.3"}),
    "sampler-warmup-oom": (["--max-num-seqs", "1024"], {"STANDIN_MODE": "sampler_oom"}),
    "cuda-graph-capture-oom": ([], {"STANDIN_MODE": "cudagraph_oom"}),
    "weights-oom": ([], {"STANDIN_GPU_GB": "15.0", "STANDIN_GPU_FREE_GB": "14.5", "STANDIN_WEIGHTS_GB": "15.27"}),
    "bfloat16-old-gpu": (["--gpu-memory-utilization", "0.9"],
                         {"STANDIN_GPU_CC": "7.5", "STANDIN_GPU_NAME": "Tesla T4", "STANDIN_GPU_GB": "14.58"}),
}


def record(name: str, extra: list[str], env: dict[str, str]) -> int:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT / "tests" / "standin"),
            "STANDIN_STEP_S": "0", **env}
    with open(OUT / f"{name}.log", "wb") as log:
        proc = subprocess.run([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *MODEL, *extra],
                              stdout=log, stderr=subprocess.STDOUT, env=full, timeout=60, cwd="/")
    return proc.returncode


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (extra, env) in CASES.items():
        print(f"{name}: exit {record(name, extra, env)}")


if __name__ == "__main__":
    main()
