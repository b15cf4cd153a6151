"""vLLM's memory plan against numbers worked from vLLM 0.33.0's own arithmetic (see engines/vllm/memory.py for
the source lines) and against the numbers vLLM printed in the recorded logs of tests/cases/vllm."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from deployer.engines import engine_for
from deployer.engines.base import MemoryInput, ModelInfo, UnsupportedModel
from deployer.engines.vllm.memory import (
    DEFAULT_UTILIZATION,
    MIB,
    bytes_per_block,
    estimated_max_model_len,
    model_shape,
    needed_bytes,
    plan,
    settings,
)

CASES = Path(__file__).parent.parent / "cases" / "vllm"
GIB = 1 << 30
H200 = 143771   # MiB
# Qwen/Qwen3-8B (the model of the recorded vLLM logs): its config.json and weights' total_size
MODEL_DIR = Path(__file__).parent.parent / "fixtures" / "models" / "qwen3-8b"
QWEN3_8B: dict[str, Any] = json.loads((MODEL_DIR / "config.json").read_text())
WEIGHTS = json.loads((MODEL_DIR / "model.safetensors.index.json").read_text())["metadata"]["total_size"]


def ask(args: dict[str, Any], free: list[int] | None = None, total: list[int] | None = None,
        config: dict[str, Any] | None = None) -> Any:
    model = ModelInfo(config or QWEN3_8B, WEIGHTS)
    return plan(MemoryInput(model=model, args=args, resolved=None, gpu_free_mib=free or [H200 - 700],
                            gpu_total_mib=total or [H200], version="0.33.0"))


def format_gib(n: float) -> str:
    """vllm/utils/mem_utils.py format_gib: round(bytes / GiB, 2)."""
    return f"{round(n / GIB, 2)}"


def test_the_engine_exposes_its_memory_model() -> None:
    assert engine_for("vllm").memory is plan


def test_a_block_is_k_and_v_of_16_tokens_for_every_layer_split_over_tp() -> None:
    shape = model_shape(ModelInfo(QWEN3_8B, WEIGHTS))
    one = settings({}, shape, H200)
    assert one.block_size == 16 and one.utilization == DEFAULT_UTILIZATION == 0.92
    # 36 layers x 16 tokens x 8 KV heads x (128 + 128) x 2 bytes (bf16)
    assert bytes_per_block(shape, one) == 36 * 16 * 8 * 256 * 2 == 2_359_296
    assert bytes_per_block(shape, settings({"tensor_parallel_size": 2}, shape, H200)) == 2_359_296 // 2
    # more ranks than KV heads: each rank keeps (a replica of) one head
    assert bytes_per_block(shape, settings({"tensor_parallel_size": 16}, shape, H200)) == 36 * 16 * 1 * 256 * 2
    assert bytes_per_block(shape, settings({"kv_cache_dtype": "fp8"}, shape, H200)) == 2_359_296 // 2


def test_defaults_follow_the_gpu_size_as_arg_utils_does() -> None:
    shape = model_shape(ModelInfo(QWEN3_8B, WEIGHTS))
    assert (settings({}, shape, H200).batched_tokens, settings({}, shape, H200).max_num_seqs) == (8192, 1024)
    assert settings({}, shape, 183_359).batched_tokens == 16384          # B200: >= 160 GiB
    assert (settings({}, shape, 24_564).batched_tokens, settings({}, shape, 24_564).max_num_seqs) == (2048, 256)
    assert settings({"max_model_len": 8192}, shape, H200).max_model_len == 8192
    assert settings({}, shape, H200).max_model_len == 40960             # the model's max_position_embeddings


def test_the_budget_is_utilization_of_the_total_minus_what_is_not_kv() -> None:
    p = ask({"gpu_memory_utilization": 0.9, "max_model_len": 32768})
    assert p.requested_mib == math.ceil(H200 * MIB * 0.9) / MIB
    assert p.kv_memory_mib == pytest.approx(p.requested_mib - p.weights_per_gpu_mib - p.non_torch_mib
                                            - p.activation_mib - p.cuda_graph_mib)
    assert p.kv_blocks == int(p.kv_memory_mib * MIB // 2_359_296) and p.kv_tokens == p.kv_blocks * 16
    assert p.fits and not p.problems and p.max_concurrency > 1
    eager = ask({"gpu_memory_utilization": 0.9, "max_model_len": 32768, "enforce_eager": True})
    assert eager.cuda_graph_mib == 0 and eager.kv_tokens > p.kv_tokens


def test_needed_and_estimated_length_match_what_vllm_printed() -> None:
    """kv-cache-too-small-h200.log: max seq len 40960 needs 5.62 GiB; 4.12 GiB available -> estimated maximum 30000."""
    text = (CASES / "kv-cache-too-small-h200.log").read_text()
    found = re.search(r"max seq len \((\d+)\), \(([0-9.]+) GiB KV cache is needed.*memory \(([0-9.]+) GiB\)\."
                      r".*estimated maximum model length is (\d+)", text)
    assert found is not None
    length, needed, available, estimate = int(found[1]), found[2], float(found[3]), int(found[4])
    assert format_gib(needed_bytes(length, 2_359_296, 16)) == needed
    assert estimated_max_model_len(available * GIB, 2_359_296, 16, length) == estimate


def test_estimated_length_is_the_binary_search_result() -> None:
    """kv_cache_planning.estimate_max_model_len's binary search over needed_bytes, done the slow way."""
    for available in (1, 2_359_295, 2_359_296, 5 * GIB + 12345, 7 * GIB):
        left, right, best = 1, 40960, 0
        while left <= right:
            mid = (left + right) // 2
            if needed_bytes(mid, 2_359_296, 16) <= available:
                best, left = mid, mid + 1
            else:
                right = mid - 1
        assert estimated_max_model_len(available, 2_359_296, 16, 40960) == best


def test_a_kv_cache_too_small_for_max_model_len_says_what_fits() -> None:
    p = ask({"gpu_memory_utilization": 0.14})
    assert not p.fits and "one request of max_model_len 40960 needs 5.62 GiB" in p.problems[0]
    longest = estimated_max_model_len(p.kv_memory_mib * MIB, p.bytes_per_block, 16, 40960)
    assert 0 < longest < 40960 and p.suggestions[0].startswith(f"max_model_len {longest}: fits")
    assert ask({"gpu_memory_utilization": 0.14, "max_model_len": longest}).fits
    assert not ask({"gpu_memory_utilization": 0.14, "max_model_len": longest + 16}).fits
    util = next(s for s in p.suggestions if s.startswith("gpu_memory_utilization"))
    value = float(util.split()[1].rstrip(":"))
    assert 0.14 < value < 0.2 and ask({"gpu_memory_utilization": value}).fits
    assert not ask({"gpu_memory_utilization": round(value - 0.01, 2)}).fits   # the smallest that fits


def test_free_memory_below_the_utilization_is_refused_as_vllm_does() -> None:
    """free-memory-below-utilization.log: 101.30/139.80 GiB free, 0.92 asked -> vLLM refuses; 0.72 fits."""
    total, free = round(139.80 * 1024), round(101.30 * 1024)
    p = ask({}, free=[free], total=[total])
    assert not p.fits and "is less than gpu_memory_utilization 0.92" in p.problems[0]
    assert format_gib(p.requested_mib * MIB) == "128.62"          # the log's "(0.92, 128.62 GiB)"
    assert p.suggestions[0].startswith("gpu_memory_utilization 0.72: fits")
    assert ask({"gpu_memory_utilization": 0.72}, free=[free], total=[total]).fits


def test_no_memory_for_blocks_and_a_model_too_big_for_one_gpu() -> None:
    p = ask({"gpu_memory_utilization": 0.1})
    assert not p.fits and p.kv_blocks == 0 and "no memory for the KV cache blocks" in p.problems[0]
    big = {**QWEN3_8B, "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
           "intermediate_size": 28672, "max_position_embeddings": 131072, "vocab_size": 128256}
    model = ModelInfo(big, 141_000_000_000)
    alone = plan(MemoryInput(model, {}, None, [81_000], [81_559], None))
    assert not alone.fits and alone.suggestions == [
        s for s in alone.suggestions if s.startswith("tensor_parallel_size 4 on 4 GPUs")] and alone.suggestions
    two = plan(MemoryInput(model, {"tensor_parallel_size": 2}, None, [81_000] * 2, [81_559] * 2, None))
    assert two.weights_per_gpu_mib == pytest.approx(141_000_000_000 / MIB / 2)


def test_the_gpu_with_least_free_memory_among_those_used_sets_the_budget() -> None:
    p = ask({"tensor_parallel_size": 2}, free=[H200 - 700, 90_000, 1_000], total=[H200] * 3)
    assert p.gpu_free_mib == 90_000 and not p.fits          # the third GPU is not used


def test_unmodelled_architectures_say_so() -> None:
    with pytest.raises(UnsupportedModel):
        model_shape(ModelInfo({**QWEN3_8B, "kv_lora_rank": 512}, None))
    with pytest.raises(UnsupportedModel):
        model_shape(ModelInfo({**QWEN3_8B, "full_attention_interval": 4}, None))


def test_resolved_args_win_and_unknown_weights_are_a_warning() -> None:
    model = ModelInfo(QWEN3_8B, None)
    p = plan(MemoryInput(model, {"max_model_len": 40960}, {"max_model_len": 8192}, [H200 - 700], [H200], None))
    assert p.max_model_len == 8192 and any("weights size unknown" in w for w in p.warnings)
    rows = dict(p.rows())
    assert rows["max_model_len"] == "8192" and rows["fits"] == "yes" and p.to_json()["kv_tokens"] == p.kv_tokens
