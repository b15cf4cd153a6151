"""SGLang's GPU memory model for preflight: will the model, its KV cache and its Mamba state fit, and what
fits if not (`plan`, this engine's Engine.memory).

Follows SGLang 0.5.23's own sizing (arg_groups/memory_hook.py for the automatic mem_fraction_static,
mem_cache/kv_cache_configurator.py for the KV/Mamba split, configs/mamba_utils.py for the state size),
written from reading it, in MiB/bytes like SGLang. Where an installed release differs (the seed era's
0.5.9-0.5.13 turn an `auto` Mamba strategy into no_buffer) its own rule is used; preflight passes the
engine-resolved mem_fraction_static when the dry resolution ran. It is an estimate: activation peaks, CUDA
context and allocator slack are what SGLang's reserve covers, and are not measured here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deployer.engines.base import KvAllocated, MemoryBudget, MemoryInput, ModelInfo, UnsupportedModel
from deployer.versions import version_in

__all__ = ["MemoryPlan", "ModelInfo", "UnsupportedModel", "plan", "plan_memory"]

MIB = 1 << 20
GIB = 1 << 30
MAMBA_FULL_MEMORY_RATIO = 0.9      # --mamba-full-memory-ratio fallback
MAMBA_BASE_SLOTS = 3               # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
SPEC_DEFAULTS = {"steps": 3, "topk": 1, "draft_tokens": 4, "max_running_requests": 48}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
MULTIMODAL_NOTE = ("a multimodal model gets a lower automatic mem_fraction_static from SGLang (ViT headroom) "
                   "than this estimate uses; the estimate is optimistic")


@dataclass(frozen=True)
class Shape:
    layers: int
    full_layers: int
    linear_layers: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    draft_layers: int
    context_len: int
    linear: dict[str, int] = field(default_factory=dict)  # key/value heads and dims, conv kernel

    @property
    def hybrid(self) -> bool:
        return self.linear_layers > 0


@dataclass
class MemoryPlan:
    gpu_total_mib: int
    gpu_free_mib: int
    weights_per_gpu_mib: float
    mem_fraction_static: float
    mfs_auto: bool
    reserved_mib: float
    kv_cell_bytes: int
    kv_tokens: int
    context_len: int
    max_running_requests: int
    mamba_state_bytes: int = 0
    mamba_slots: int = 0
    slots_per_request: int = 0
    mamba_strategy: str | None = None
    fits: bool = True
    mfs_source: str = ""                      # shown beside the value: "auto", "engine resolved", or given
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            ("GPU memory (total / free)", f"{self.gpu_total_mib} MiB / {self.gpu_free_mib} MiB"),
            ("weights per GPU", f"{self.weights_per_gpu_mib / 1024:.1f} GiB"),
            ("mem_fraction_static", f"{self.mem_fraction_static:.3f}" + (f" ({self.source()})" if self.source() else "")),
            ("reserved outside the pools", f"{self.reserved_mib:.0f} MiB" if self.mfs_auto else "-"),
            ("KV bytes per token", f"{self.kv_cell_bytes}"),
            ("KV cache tokens", f"{self.kv_tokens}"),
            ("context length", f"{self.context_len}"),
        ]
        if self.mamba_state_bytes:
            rows += [
                ("Mamba state per slot", f"{self.mamba_state_bytes / MIB:.1f} MiB"),
                ("Mamba strategy / slots per request", f"{self.mamba_strategy} / {self.slots_per_request}"),
                ("Mamba slots", f"{self.mamba_slots}"),
            ]
        rows.append(("max running requests", f"{self.max_running_requests}"))
        rows.append(("fits", "yes" if self.fits else "NO"))
        return rows

    def source(self) -> str:
        return self.mfs_source or ("auto" if self.mfs_auto else "")

    def budget(self) -> MemoryBudget:
        """The GPU as this plan divides it (its own arithmetic, below): the static pools (weights, KV, Mamba
        state), and (1 - mem_fraction_static) of the free memory left for activations and CUDA graphs; what other
        processes use counts as neither, so it is outside the parts (headroom)."""
        return MemoryBudget(total_mib=self.gpu_total_mib, weights_mib=self.weights_per_gpu_mib,
                            kv_cache_mib=self.kv_tokens * self.kv_cell_bytes / MIB,
                            mamba_state_mib=self.mamba_state_bytes * self.mamba_slots / MIB,
                            activations_graphs_mib=self.gpu_free_mib * (1 - self.mem_fraction_static))

    def kv_estimate(self) -> KvAllocated:
        return KvAllocated(self.kv_tokens, self.kv_tokens * self.kv_cell_bytes / MIB, "deployer's estimate")

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def model_shape(model: ModelInfo) -> Shape:
    t = model.text
    if t.get("kv_lora_rank"):
        raise UnsupportedModel("MLA attention (kv_lora_rank) is not modelled by the estimate")
    layers = int(t["num_hidden_layers"])
    linear_ids = _linear_layer_ids(t, layers)
    heads = int(t.get("num_attention_heads", 1))
    head_dim = int(t.get("head_dim") or int(t["hidden_size"]) // heads)
    linear = {}
    if linear_ids:
        linear = {k: int(t[k]) for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                         "linear_value_head_dim", "linear_conv_kernel_dim")}
    return Shape(
        layers=layers, full_layers=layers - len(linear_ids), linear_layers=len(linear_ids),
        kv_heads=int(t.get("num_key_value_heads") or heads), head_dim=head_dim,
        v_head_dim=int(t.get("v_head_dim") or head_dim),
        draft_layers=int(t.get("num_nextn_predict_layers") or t.get("mtp_num_hidden_layers") or 0),
        context_len=int(t.get("max_position_embeddings") or 0), linear=linear,
    )


def _linear_layer_ids(t: dict[str, Any], layers: int) -> list[int]:
    types = t.get("layer_types")
    if isinstance(types, list) and types:
        return [i for i, kind in enumerate(types) if "linear" in str(kind) or "mamba" in str(kind)]
    interval = t.get("full_attention_interval")
    if interval:
        return [i for i in range(layers) if (i + 1) % int(interval) != 0]
    return []


def mamba_state_bytes(shape: Shape, tp: int, ssm_dtype: str = "float32", conv_dtype: str = "bfloat16") -> int:
    """One request's conv + SSM state over all linear layers on one TP rank (configs/mamba_utils.py)."""
    lin = shape.linear
    conv_dim = lin["linear_num_value_heads"] * lin["linear_value_head_dim"] + \
        2 * lin["linear_num_key_heads"] * lin["linear_key_head_dim"]
    conv = conv_dim // tp * (lin["linear_conv_kernel_dim"] - 1) * DTYPE_BYTES[conv_dtype]
    ssm = lin["linear_num_value_heads"] // tp * lin["linear_value_head_dim"] * lin["linear_key_head_dim"]
    return (conv + ssm * DTYPE_BYTES[ssm_dtype]) * shape.linear_layers


def kv_cell_bytes(shape: Shape, tp: int, kv_dtype: str = "auto", speculative: bool = False) -> int:
    """KV bytes per token on one TP rank; the draft (MTP) layers keep their own KV for the same tokens."""
    layers = shape.full_layers + (shape.draft_layers if speculative else 0)
    heads = max(1, shape.kv_heads // tp)
    return heads * (shape.head_dim + shape.v_head_dim) * layers * DTYPE_BYTES.get(kv_dtype, 1 if "fp8" in kv_dtype else 2)


def default_chunk_and_bs(gpu_mib: float, tp: int) -> tuple[int, int]:
    """SGLang's defaults for chunked_prefill_size and the decode CUDA-graph max batch by GPU size."""
    gib = gpu_mib / 1024
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 4096, 48 if tp < 4 else 80
    if gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def auto_mem_fraction(gpu_mib: float, args: dict[str, Any], tp: int, pp: int) -> tuple[float, float]:
    """(mem_fraction_static, reserved MiB) the way memory_hook._handle_gpu_memory_settings computes them."""
    chunk, max_bs = default_chunk_and_bs(gpu_mib, tp)
    chunk = int(args.get("chunked_prefill_size") or chunk)
    max_bs = int(args.get("cuda_graph_max_bs_decode") or min(max_bs, _running_requests(args) or max_bs))
    reserved = 512 + max(chunk, 2048) * 1.5 + tp * pp / 8 * 1024
    if not args.get("disable_cuda_graph"):
        reserved += max_bs * 2
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3), reserved


def _running_requests(args: dict[str, Any]) -> int | None:
    value = args.get("max_running_requests")
    if value is None and args.get("speculative_algorithm"):
        return SPEC_DEFAULTS["max_running_requests"]
    return None if value is None else int(value)


# Releases whose `--mamba-scheduler-strategy auto` always means no_buffer (server_args.py __post_init__ of the
# 0.5.9-0.5.13 wheels: "if self.mamba_scheduler_strategy == 'auto': ... = 'no_buffer'"); later releases pick
# extra_buffer unless overlap scheduling is off (0.5.23 arg_groups/mamba_hook.py).
AUTO_IS_NO_BUFFER = ">=0.5.9,<0.5.14"


def with_release_rules(args: dict[str, Any], version: str | None) -> dict[str, Any]:
    """`auto` (or unset) Mamba strategy resolved as the installed release does, where that differs from 0.5.23."""
    strategy = args.get("mamba_radix_cache_strategy") or args.get("mamba_scheduler_strategy") or "auto"
    if strategy != "auto" or version is None or not version_in(version, AUTO_IS_NO_BUFFER):
        return args
    return with_args(args, mamba_scheduler_strategy="no_buffer", mamba_radix_cache_strategy=None)


def mamba_strategy(args: dict[str, Any]) -> str:
    strategy = str(args.get("mamba_radix_cache_strategy") or args.get("mamba_scheduler_strategy") or "auto")
    if strategy == "auto":
        return "no_buffer" if args.get("disable_overlap_schedule") else "extra_buffer"
    return strategy


def slots_per_request(args: dict[str, Any]) -> int:
    """State slots one running request holds (kv_cache_configurator._calculate_mamba_ratio)."""
    if args.get("disable_radix_cache"):
        return 1
    strategy = mamba_strategy(args)
    if strategy == "extra_buffer_lazy":
        return MAMBA_BASE_SLOTS + 1
    if strategy == "extra_buffer":
        return MAMBA_BASE_SLOTS + (1 if args.get("disable_overlap_schedule") else 2)
    return MAMBA_BASE_SLOTS


def plan(request: MemoryInput) -> MemoryPlan:
    """Preflight's question, answered for SGLang: the plan under the engine's resolved args, the automatic
    mem_fraction_static labelled "engine resolved" when the dry resolution chose it."""
    args = request.effective_args()
    notes = []
    # The engine's own resolution knows its automatic mem_fraction_static, including the multimodal ViT
    # headroom this estimate does not model; without it, say the estimate is optimistic.
    if request.resolved is None and request.model.multimodal and "mem_fraction_static" not in request.args:
        notes.append(MULTIMODAL_NOTE)
    result = plan_memory(request.model, args, request.gpu_free_mib, request.gpu_total_mib,
                         int(args.get("tp_size") or 1), version=request.version)
    if (request.resolved or {}).get("mem_fraction_static") is not None and "mem_fraction_static" not in request.args:
        result.mfs_source = "engine resolved"
    result.warnings[:0] = notes
    return result


def plan_memory(model: ModelInfo, args: dict[str, Any], gpu_free_mib: list[int], gpu_total_mib: list[int],
                tp: int, version: str | None = None) -> MemoryPlan:
    """Estimate one GPU's budget (the one with least free memory among those used) for these args, under the
    installed release's rules where they differ (`version`)."""
    args = with_release_rules(args, version)
    plan = _plan(model, args, gpu_free_mib, gpu_total_mib, tp)
    if not plan.fits or any("capped" in w for w in plan.warnings):
        plan.suggestions = suggest(model, args, gpu_free_mib, gpu_total_mib, tp)
    return plan


def suggest(model: ModelInfo, args: dict[str, Any], gpu_free_mib: list[int], gpu_total_mib: list[int],
            tp: int) -> list[str]:
    """Single changes that make the plan fit without capping the requested max_running_requests."""
    requested = _running_requests(args)
    out = []
    for label, new_args, new_tp in _alternatives(args, tp, len(gpu_free_mib)):
        try:
            alt = _plan(model, new_args, gpu_free_mib, gpu_total_mib, new_tp)
        except (KeyError, ValueError, ZeroDivisionError):
            continue
        if alt.fits and (requested is None or alt.max_running_requests >= requested):
            out.append(f"{label}: fits, {alt.max_running_requests} running requests, {alt.kv_tokens} KV tokens")
    return out or _more_gpus(model, args, gpu_free_mib, gpu_total_mib, tp)


def _more_gpus(model: ModelInfo, args: dict[str, Any], gpu_free_mib: list[int], gpu_total_mib: list[int],
               tp: int) -> list[str]:
    """Nothing fits on the GPUs at hand: the smallest tensor-parallel size that would, on GPUs like these."""
    free, total = min(gpu_free_mib or [0]), min(gpu_total_mib or [0])
    for n in (2, 4, 8, 16):
        if n <= tp:
            continue
        try:
            alt = _plan(model, with_args(args, tp_size=n), [free] * n, [total] * n, n)
        except (KeyError, ValueError, ZeroDivisionError):
            return []
        if alt.fits:
            return [f"tp_size {n} on {n} GPUs like this one (set engine.gpus): fits, "
                    f"{alt.max_running_requests} running requests, {alt.kv_tokens} KV tokens"]
    return []


def _alternatives(args: dict[str, Any], tp: int, gpus: int) -> list[tuple[str, dict[str, Any], int]]:
    alts: list[tuple[str, dict[str, Any], int]] = []
    if tp * 2 <= gpus:
        alts.append((f"tp_size {tp * 2}", with_args(args, tp_size=tp * 2), tp * 2))
    if mamba_strategy(args) != "no_buffer":
        alts.append(("mamba_radix_cache_strategy no_buffer + disable_overlap_schedule",
                     with_args(args, mamba_radix_cache_strategy="no_buffer", mamba_scheduler_strategy=None,
                               disable_overlap_schedule=True), tp))
    if str(args.get("mamba_ssm_dtype") or "float32") == "float32":
        alts.append(("mamba_ssm_dtype bfloat16", with_args(args, mamba_ssm_dtype="bfloat16"), tp))
    running = _running_requests(args)
    if running and running > 1:
        alts += [(f"max_running_requests {n}", with_args(args, max_running_requests=n), tp)
                 for n in (running * 3 // 4, running // 2) if n >= 1]
    ctx = args.get("context_length")
    if ctx:
        alts.append((f"context_length {int(ctx) // 2}", with_args(args, context_length=int(ctx) // 2), tp))
    if args.get("mem_fraction_static"):
        alts.append(("mem_fraction_static unset (automatic)", with_args(args, mem_fraction_static=None), tp))
    return alts


def _plan(model: ModelInfo, args: dict[str, Any], gpu_free_mib: list[int], gpu_total_mib: list[int],
          tp: int) -> MemoryPlan:
    shape = model_shape(model)
    pp = int(args.get("pp_size") or 1)
    total, free = min(gpu_total_mib[: tp * pp] or [0]), min(gpu_free_mib[: tp * pp] or [0])
    mfs_given = args.get("mem_fraction_static")
    mfs, reserved = (float(mfs_given), 0.0) if mfs_given else auto_mem_fraction(total, args, tp, pp)
    spec = bool(args.get("speculative_algorithm"))
    weights_mib = (model.weight_bytes or 0) / MIB / (tp * pp)
    context = int(args.get("context_length") or shape.context_len)
    plan = MemoryPlan(gpu_total_mib=total, gpu_free_mib=free, weights_per_gpu_mib=weights_mib,
                      mem_fraction_static=mfs, mfs_auto=not mfs_given, reserved_mib=reserved,
                      kv_cell_bytes=kv_cell_bytes(shape, tp, str(args.get("kv_cache_dtype") or "auto"), spec),
                      kv_tokens=0, context_len=context, max_running_requests=0)
    if model.weight_bytes is None:
        plan.warnings.append("weights size unknown (no model.safetensors.index.json): counted as 0")
    # kv_cache_configurator._profile_available_bytes: free after loading minus pre-load free * (1 - mfs)
    rest = (free - weights_mib - free * (1 - mfs)) * MIB
    if rest <= 0:
        need = 1 - (free - weights_mib) / free if free else 1.0
        plan.fits = False
        plan.problems.append(
            f"weights ({weights_mib / 1024:.1f} GiB per GPU) leave no memory for the KV cache under "
            f"mem_fraction_static={mfs:.3f} with {free} MiB free (needs > {need:.3f})")
        return plan
    if shape.hybrid:
        rest = _plan_mamba(plan, shape, args, tp, rest)
        if not plan.fits:
            return plan
    plan.kv_tokens = int(rest // plan.kv_cell_bytes)
    _plan_requests(plan, args)
    return plan


def _plan_mamba(plan: MemoryPlan, shape: Shape, args: dict[str, Any], tp: int, rest: float) -> float:
    """Carve the Mamba state pool out of `rest` bytes (kv_cache_configurator._handle_max_mamba_cache)."""
    per = mamba_state_bytes(shape, tp, str(args.get("mamba_ssm_dtype") or "float32"))
    ratio = slots_per_request(args)
    plan.mamba_state_bytes, plan.slots_per_request, plan.mamba_strategy = per, ratio, mamba_strategy(args)
    draft = int(args.get("speculative_num_draft_tokens") or SPEC_DEFAULTS["draft_tokens"]) \
        if args.get("speculative_algorithm") else 0
    running = _running_requests(args)
    r = float(args.get("mamba_full_memory_ratio") or MAMBA_FULL_MEMORY_RATIO)
    if args.get("max_mamba_cache_size"):
        slots = int(args["max_mamba_cache_size"])
    elif args.get("disable_radix_cache") and running:
        slots = running
    else:
        budget = rest * r / (1 + r)
        slots = int((budget - per * (1 + draft)) // (per * (1 + draft / ratio))) if draft else \
            int((budget - per) // per)
    if draft:  # speculative decoding keeps intermediate states per draft token for each running request
        capped = min(running or slots // ratio, slots // ratio)
        rest -= per * (capped + 1) * draft
    plan.mamba_slots = slots
    if slots <= 0:
        plan.fits = False
        plan.problems.append(
            f"not enough GPU memory for the Mamba state cache: {slots} slots of {per / MIB:.1f} MiB")
        return rest
    return rest - (slots + 1) * per


def _plan_requests(plan: MemoryPlan, args: dict[str, Any]) -> None:
    """max_running_requests as kv_cache_configurator.resolve_max_num_reqs caps it."""
    requested = _running_requests(args)
    estimated = max(min(int(plan.kv_tokens / max(plan.context_len, 1) * 512), 4096), 2048)
    running = min(requested or estimated, plan.kv_tokens // 2)
    if plan.slots_per_request:
        cap = plan.mamba_slots // plan.slots_per_request
        if cap <= 0:
            plan.fits = False
            plan.problems.append(f"the Mamba state cache ({plan.mamba_slots} slots, {plan.slots_per_request} "
                                 "per request) cannot serve any request")
        elif cap < running and requested:
            plan.warnings.append(
                f"max_running_requests {requested} is capped to {cap} by the Mamba state cache "
                f"({plan.mamba_slots} slots, {plan.slots_per_request} per request with {plan.mamba_strategy})")
        running = min(running, cap)
    plan.max_running_requests = running
    if plan.kv_tokens <= 0:
        plan.fits = False
        plan.problems.append("no memory left for the KV cache")
    elif plan.kv_tokens < plan.context_len:
        plan.warnings.append(f"the KV cache holds {plan.kv_tokens} tokens, less than one request of "
                             f"context_length {plan.context_len}")


def with_args(args: dict[str, Any], **changes: Any) -> dict[str, Any]:
    new = dict(args)
    new.update(changes)
    return new

