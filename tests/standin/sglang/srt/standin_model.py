"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

What the stand-in knows about models and GPU memory: the architecture of `--model-path` (config.json in
a directory, else guessed from the name), whether it is a hybrid Mamba model, and a small capacity model
driven by env knobs (STANDIN_GPU_MEM_GB, STANDIN_WEIGHTS_GB, STANDIN_MIN_MFS, STANDIN_MAX_MFS).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

HYBRID_ARCHS = frozenset(
    {
        "Qwen3NextForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "NemotronHForCausalLM",
        "FalconH1ForCausalLM",
    }
)
H200_MIB = 143771


def architecture(model_path: str) -> str:
    """`architectures[0]` of <model_path>/config.json, else a guess from the name."""
    config = os.path.join(model_path, "config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as fh:
            archs = json.load(fh).get("architectures") or ["LlamaForCausalLM"]
        return str(archs[0])
    name = model_path.lower()
    if "qwen3-next" in name:
        return "Qwen3NextForCausalLM"
    if "qwen3.6" in name or "qwen3.5" in name:
        return "Qwen3_5ForConditionalGeneration"
    if "qwen3" in name:
        return "Qwen3ForCausalLM"
    return "LlamaForCausalLM"


def vision_config(model_path: str) -> Optional[dict]:
    """`vision_config` of <model_path>/config.json (a multimodal model), else None."""
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as fh:
            found = json.load(fh).get("vision_config")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def is_hybrid(arch: str) -> bool:
    return arch in HYBRID_ARCHS


def _env_float(name: str) -> Optional[float]:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else None


@dataclass(frozen=True)
class Capacity:
    """GPU memory as the stand-in pretends it is (GB = GiB, as SGLang prints)."""

    gpu_gb: float
    weights_gb: float
    min_mfs: float
    max_mfs: float

    @classmethod
    def from_env(cls) -> "Capacity":
        gpu = _env_float("STANDIN_GPU_MEM_GB") or H200_MIB / 1024
        weights = _env_float("STANDIN_WEIGHTS_GB")
        weights = weights if weights is not None else min(16.0, gpu / 4)
        min_mfs = _env_float("STANDIN_MIN_MFS")
        max_mfs = _env_float("STANDIN_MAX_MFS")
        return cls(
            gpu_gb=gpu,
            weights_gb=weights,
            min_mfs=min_mfs if min_mfs is not None else round((weights + 1.0) / gpu, 3),
            max_mfs=max_mfs if max_mfs is not None else 1.0,
        )

    def avail_after_load(self) -> float:
        return self.gpu_gb - 0.6 - self.weights_gb


def auto_mem_fraction_static(gpu_mib: float, chunked: int, decode_max_bs: int, tp: int = 1) -> float:
    """0.5.23's automatic --mem-fraction-static (arg_groups/memory_hook.py), prefill capture list empty."""
    reserved = 512 + 1.5 * max(chunked, 2048) + tp / 8 * 1024 + 2 * decode_max_bs
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def tiers(gpu_mib: float) -> tuple:
    """(chunked_prefill_size, cuda_graph_max_bs) defaults by GPU memory."""
    gib = gpu_mib / 1024
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 4096, 48
    if gib < 60:
        return 4096, 32
    if gib < 160:
        return 8192, 256
    return 16384, 512
