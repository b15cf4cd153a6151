"""vLLM's GPU memory model for preflight (`plan`, this engine's Engine.memory): the budget of one GPU the
way vLLM 0.33.0 lays it out, whether one request of max_model_len fits in its KV cache blocks, and what fits if
not (a max_model_len, a gpu_memory_utilization, more GPUs).

The arithmetic is vLLM's (paths relative to vllm/ in the 0.33.0 wheel), written from reading it:
  requested  = ceil(total * gpu_memory_utilization)            v1/worker/utils.py:724 (request_memory);
               free memory below it is an error                 v1/worker/utils.py:761-770
  KV memory  = requested - non-KV (weights + non-torch + activation peak of the profile run)
               - CUDA graph memory                              v1/worker/gpu_worker.py:753-757
  blocks     = KV memory // bytes per block                     v1/core/kv_cache_planning.py:681
  per block  = sum over layers of block_size * kv_heads * (head_dim + v_head_dim) * dtype bytes
                                                                 v1/kv_cache_interface.py:583-600,
                                                                 v1/core/kv_cache_planning.py:587-593
  one request of max_model_len needs cdiv(len, block_size) pages per layer
                                                                 v1/kv_cache_interface.py:643-648, and the
               largest len that fits is the "estimated maximum model length" (kv_cache_planning.py:96-146)
vLLM measures non-torch memory, the activation peak and the CUDA graph pool at startup (a profile run and a
trial capture); those three are estimates here and are labelled so. Dense and GQA attention only: MLA and
linear-attention hybrids raise UnsupportedModel.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from deployer.engines.base import KvAllocated, MemoryBudget, MemoryInput, ModelInfo, UnsupportedModel

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_UTILIZATION = 0.92          # config/cache.py:215 gpu_memory_utilization default
DEFAULT_BLOCK_SIZE = 16             # config/cache.py:185 DEFAULT_BLOCK_SIZE (CUDA attention backends)
NON_TORCH_MIB = 768                 # estimate: CUDA context, cuBLAS workspace (vLLM measures it, mem_utils.py:306)
NCCL_MIB = 512                      # estimate: NCCL buffers when tensor parallel (measured the same way)
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1}


@dataclass(frozen=True)
class Shape:
    """What the plan reads from config.json (the text model's, for multimodal checkpoints)."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    max_position: int
    dtype_bytes: int


@dataclass(frozen=True)
class Settings:
    """The vLLM args the plan depends on, with vLLM 0.33.0's defaults filled in."""

    utilization: float
    tp: int
    pp: int
    max_model_len: int
    max_num_seqs: int
    batched_tokens: int
    block_size: int
    kv_dtype_bytes: int
    eager: bool


@dataclass
class VllmMemoryPlan:
    gpu_total_mib: int
    gpu_free_mib: int
    gpu_memory_utilization: float
    requested_mib: float
    weights_per_gpu_mib: float
    non_torch_mib: float
    activation_mib: float
    cuda_graph_mib: float
    kv_memory_mib: float
    block_size: int
    bytes_per_block: int
    kv_blocks: int
    kv_tokens: int
    max_model_len: int
    max_num_seqs: int
    fits: bool = True
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len the KV cache holds at once (kv_cache_utils.py:1149 logs it)."""
        return self.kv_tokens / self.max_model_len if self.max_model_len else 0.0

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("GPU memory (total / free)", f"{self.gpu_total_mib} MiB / {self.gpu_free_mib} MiB"),
            ("gpu_memory_utilization", f"{self.gpu_memory_utilization:.3f} = {self.requested_mib:.0f} MiB"),
            ("weights per GPU", f"{self.weights_per_gpu_mib / 1024:.1f} GiB"),
            ("activation peak (estimate)", f"{self.activation_mib:.0f} MiB"),
            ("CUDA graphs (estimate)", f"{self.cuda_graph_mib:.0f} MiB" if self.cuda_graph_mib else "none (eager)"),
            ("CUDA context etc. (estimate)", f"{self.non_torch_mib:.0f} MiB"),
            ("KV cache memory", f"{self.kv_memory_mib:.0f} MiB"),
            ("KV blocks x block size", f"{self.kv_blocks} x {self.block_size} ({self.bytes_per_block} bytes each)"),
            ("KV cache tokens", f"{self.kv_tokens}"),
            ("max_model_len", f"{self.max_model_len}"),
            ("max concurrency at max_model_len", f"{self.max_concurrency:.2f}x"),
            ("fits", "yes" if self.fits else "NO"),
        ]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "max_concurrency": round(self.max_concurrency, 2)}

    def budget(self) -> MemoryBudget:
        """The GPU as vLLM divides it: weights, the KV cache, and the activation peak, CUDA graphs and the CUDA
        context within gpu_memory_utilization; the rest of the GPU is headroom."""
        return MemoryBudget(total_mib=self.gpu_total_mib, weights_mib=self.weights_per_gpu_mib,
                            kv_cache_mib=self.kv_memory_mib,
                            activations_graphs_mib=self.activation_mib + self.cuda_graph_mib + self.non_torch_mib)

    def kv_estimate(self) -> KvAllocated:
        return KvAllocated(self.kv_tokens, self.kv_memory_mib, "deployer's estimate")


def plan(request: MemoryInput) -> VllmMemoryPlan:
    """Preflight's question, answered for vLLM, under the engine's resolved args where the dry resolution ran."""
    args = request.effective_args()
    result = plan_memory(request.model, args, request.gpu_free_mib, request.gpu_total_mib)
    if not result.fits:
        result.suggestions = suggest(request.model, args, request.gpu_free_mib, request.gpu_total_mib, result)
    return result


def model_shape(model: ModelInfo) -> Shape:
    t = model.text
    if t.get("kv_lora_rank"):
        raise UnsupportedModel("MLA attention (kv_lora_rank) is not modelled by the vLLM estimate")
    types = t.get("layer_types")
    if t.get("full_attention_interval") or (isinstance(types, list) and any("linear" in str(x) for x in types)):
        raise UnsupportedModel("linear-attention hybrids (Mamba state) are not modelled by the vLLM estimate")
    heads = int(t.get("num_attention_heads", 1))
    hidden = int(t["hidden_size"])
    dtype = str(t.get("torch_dtype") or t.get("dtype") or "bfloat16")
    return Shape(layers=int(t["num_hidden_layers"]), kv_heads=int(t.get("num_key_value_heads") or heads),
                 head_dim=int(t.get("head_dim") or hidden // heads), hidden=hidden,
                 intermediate=int(t.get("intermediate_size") or 4 * hidden), vocab=int(t.get("vocab_size") or 0),
                 max_position=int(t.get("max_position_embeddings") or 0), dtype_bytes=DTYPE_BYTES.get(dtype, 2))


def settings(args: dict[str, Any], shape: Shape, total_mib: int) -> Settings:
    """vLLM's defaults where the args are silent (engine/arg_utils.py:2970-3005: by GPU size, API server)."""
    big = total_mib * MIB >= 70 * GIB
    batched, seqs = (16384, 1024) if total_mib * MIB >= 160 * GIB else (8192, 1024) if big else (2048, 256)
    model_dtype = str(args.get("dtype") or "auto")
    weights_bytes = shape.dtype_bytes if model_dtype == "auto" else DTYPE_BYTES.get(model_dtype, 2)
    kv_dtype = str(args.get("kv_cache_dtype") or "auto")
    return Settings(
        utilization=float(args.get("gpu_memory_utilization") or DEFAULT_UTILIZATION),
        tp=int(args.get("tensor_parallel_size") or 1), pp=int(args.get("pipeline_parallel_size") or 1),
        max_model_len=int(args.get("max_model_len") or shape.max_position),
        max_num_seqs=int(args.get("max_num_seqs") or seqs),
        batched_tokens=int(args.get("max_num_batched_tokens") or batched),
        block_size=int(args.get("block_size") or DEFAULT_BLOCK_SIZE),
        kv_dtype_bytes=weights_bytes if kv_dtype == "auto" else DTYPE_BYTES.get(kv_dtype, 1 if "fp8" in kv_dtype else 2),
        eager=bool(args.get("enforce_eager")),
    )


def bytes_per_block(shape: Shape, s: Settings) -> int:
    """One block of every attention layer on one rank: K and V of block_size tokens (kv_cache_interface.py:593)."""
    layers = math.ceil(shape.layers / s.pp)
    heads = max(1, shape.kv_heads // s.tp)     # KV heads are split over TP ranks, replicated below one each
    return layers * s.block_size * heads * 2 * shape.head_dim * s.kv_dtype_bytes


def activation_mib(shape: Shape, s: Settings) -> float:
    """Estimate of the profile run's transient peak (gpu_worker.py:700): the MLP of max_num_batched_tokens
    tokens, or the sampler warm-up's float32 logits and probabilities for max_num_seqs requests
    (gpu_model_runner.py:5930's "warming up sampler"), whichever is larger."""
    forward = s.batched_tokens * (2 * shape.intermediate // s.tp + 4 * shape.hidden) * shape.dtype_bytes
    sampler = s.max_num_seqs * shape.vocab * 4 * 2
    return max(forward, sampler) / MIB


def cuda_graph_mib(shape: Shape, s: Settings) -> float:
    """Estimate of the graph pool vLLM measures with a trial capture (gpu_worker.py:707-724, on by default via
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS): the activations of the largest captured batch (min(2 x
    max_num_seqs, 512) tokens; smaller sizes reuse the pool), per layer kept alive, plus 256 MiB of graph state."""
    if s.eager:
        return 0.0
    size = min(2 * s.max_num_seqs, 512)
    per_layer = size * (2 * shape.intermediate // s.tp + 4 * shape.hidden) * shape.dtype_bytes
    return 256 + per_layer * math.ceil(shape.layers / s.pp) / 8 / MIB


def plan_memory(model: ModelInfo, args: dict[str, Any], gpu_free_mib: list[int],
                gpu_total_mib: list[int]) -> VllmMemoryPlan:
    """One GPU's budget (the one with least free memory among those the engine uses) for these args."""
    shape = model_shape(model)
    used = int(args.get("tensor_parallel_size") or 1) * int(args.get("pipeline_parallel_size") or 1)
    total, free = min(gpu_total_mib[:used] or [0]), min(gpu_free_mib[:used] or [0])
    s = settings(args, shape, total)
    requested = math.ceil(total * MIB * s.utilization) / MIB
    weights = (model.weight_bytes or 0) / MIB / used
    non_torch = NON_TORCH_MIB + (NCCL_MIB if used > 1 else 0)
    act, graphs = activation_mib(shape, s), cuda_graph_mib(shape, s)
    kv = requested - weights - non_torch - act - graphs
    per_block = bytes_per_block(shape, s)
    blocks = max(0, int(kv * MIB // per_block))
    out = VllmMemoryPlan(
        gpu_total_mib=total, gpu_free_mib=free, gpu_memory_utilization=s.utilization, requested_mib=requested,
        weights_per_gpu_mib=weights, non_torch_mib=non_torch, activation_mib=act, cuda_graph_mib=graphs,
        kv_memory_mib=kv, block_size=s.block_size, bytes_per_block=per_block, kv_blocks=blocks,
        kv_tokens=blocks * s.block_size, max_model_len=s.max_model_len, max_num_seqs=s.max_num_seqs)
    if model.weight_bytes is None:
        out.warnings.append("weights size unknown (no model.safetensors.index.json): counted as 0")
    _judge(out, s)
    return out


def _judge(out: VllmMemoryPlan, s: Settings) -> None:
    """vLLM's three startup checks, in its order (utils.py:761, kv_cache_planning.py:58 and :77)."""
    if out.gpu_free_mib < out.requested_mib:
        out.fits = False
        out.problems.append(
            f"free memory ({out.gpu_free_mib} MiB of {out.gpu_total_mib}) is less than gpu_memory_utilization "
            f"{s.utilization} of the total ({out.requested_mib:.0f} MiB): vLLM refuses to start")
    if out.kv_memory_mib <= 0:
        out.fits = False
        out.problems.append(
            f"no memory for the KV cache blocks: weights {out.weights_per_gpu_mib / 1024:.1f} GiB, activations, "
            f"CUDA graphs and context fill gpu_memory_utilization {s.utilization} ({out.requested_mib:.0f} MiB)")
        return
    needed = needed_bytes(out.max_model_len, out.bytes_per_block, out.block_size)
    if needed > out.kv_memory_mib * MIB:
        out.fits = False
        out.problems.append(
            f"one request of max_model_len {out.max_model_len} needs {needed / GIB:.2f} GiB of KV cache, more than "
            f"the {out.kv_memory_mib / 1024:.2f} GiB available; the KV cache holds {out.kv_tokens} tokens")


def needed_bytes(max_model_len: int, per_block: int, block_size: int) -> int:
    """KV bytes one request of max_model_len takes (kv_cache_interface.py:648)."""
    return -(-max_model_len // block_size) * per_block


def estimated_max_model_len(available_bytes: float, per_block: int, block_size: int, max_model_len: int) -> int:
    """The longest request that fits, as vLLM's binary search finds it (kv_cache_planning.py:96-146): the
    largest len <= max_model_len with needed_bytes(len) <= available; 0 when not even one token fits."""
    return max(0, min(max_model_len, int(available_bytes // per_block) * block_size))


def suggest(model: ModelInfo, args: dict[str, Any], gpu_free_mib: list[int], gpu_total_mib: list[int],
            failed: VllmMemoryPlan) -> list[str]:
    """Single changes that make the plan fit: the estimated maximum model length, a utilization the free
    memory allows, then more tensor-parallel GPUs."""
    out: list[str] = []
    room = failed.gpu_free_mib / failed.gpu_total_mib if failed.gpu_total_mib else 0.0
    if failed.kv_memory_mib > 0 and failed.gpu_free_mib >= failed.requested_mib:
        longest = estimated_max_model_len(failed.kv_memory_mib * MIB, failed.bytes_per_block, failed.block_size,
                                          failed.max_model_len)
        if longest > 0:
            out.append(f"max_model_len {longest}: fits, the estimated maximum model length for "
                       f"{failed.kv_memory_mib / 1024:.2f} GiB of KV cache")
    short = needed_bytes(failed.max_model_len, failed.bytes_per_block, failed.block_size) / MIB - failed.kv_memory_mib
    for label, new_args in _alternatives(args, failed, short, room, len(gpu_free_mib)):
        alt = plan_memory(model, new_args, gpu_free_mib, gpu_total_mib)
        if alt.fits:
            out.append(f"{label}: fits, {alt.kv_tokens} KV tokens, {alt.max_concurrency:.2f}x max_model_len")
    return out or _more_gpus(model, args, gpu_free_mib, gpu_total_mib, failed)


def _alternatives(args: dict[str, Any], failed: VllmMemoryPlan, short_mib: float, room: float,
                  gpus: int) -> list[tuple[str, dict[str, Any]]]:
    alts: list[tuple[str, dict[str, Any]]] = []
    if failed.gpu_free_mib < failed.requested_mib:
        util = math.floor(room * 100) / 100
        alts.append((f"gpu_memory_utilization {util}", {**args, "gpu_memory_utilization": util}))
    elif short_mib > 0:
        util = math.ceil((failed.gpu_memory_utilization + short_mib / failed.gpu_total_mib) * 100) / 100
        if util <= min(room, 0.99):
            alts.append((f"gpu_memory_utilization {util}", {**args, "gpu_memory_utilization": util}))
    tp = int(args.get("tensor_parallel_size") or 1)
    if tp * 2 <= gpus:
        alts.append((f"tensor_parallel_size {tp * 2}", {**args, "tensor_parallel_size": tp * 2}))
    return alts


def _more_gpus(model: ModelInfo, args: dict[str, Any], gpu_free_mib: list[int], gpu_total_mib: list[int],
               failed: VllmMemoryPlan) -> list[str]:
    """Nothing fits on the GPUs at hand: the smallest tensor_parallel_size that would, on GPUs like these."""
    tp = int(args.get("tensor_parallel_size") or 1)
    for n in (2, 4, 8, 16):
        if n <= tp:
            continue
        alt = plan_memory(model, {**args, "tensor_parallel_size": n}, [failed.gpu_free_mib] * n,
                          [failed.gpu_total_mib] * n)
        if alt.fits:
            where = "on the GPUs given" if n <= len(gpu_free_mib) else f"on {n} GPUs like this one (set engine.gpus)"
            return [f"tensor_parallel_size {n} {where}: fits, {alt.kv_tokens} KV tokens"]
    return []
