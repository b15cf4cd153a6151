"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

The argument side of the stand-in: `ServerArgs.add_cli_args(parser)` and `prepare_server_args(argv)` with
the real flag table (see flags.py), plus a small imitation of argument resolution: the defaults SGLang
fills in on an H200-like GPU, the Mamba radix-cache strategy choice, speculative defaults, and the era's
validation errors (raised from functions named like the real ones, so the tracebacks read alike).

Eras: 0.5.23 resolves in `resolve_once()` (called by launch_server). The seed era imitates the real 0.5.10
(server_args.py of its wheel): everything happens in `ServerArgs.__post_init__`, inside
`prepare_server_args`, there is no `resolve_once`, `--mamba-scheduler-strategy auto` becomes no_buffer,
SGLANG_ENABLE_SPEC_V2 decides overlap scheduling under speculative decoding, and mem_fraction_static follows
0.5.10's own formula (`_handle_gpu_memory_settings`, `adjust_mem_fraction_for_vlm`).

Env STANDIN_PROBE_IMPORT_S: seconds this module takes to import when deployer's probe imports it (a program run
as `python -c`), as importing the real SGLang and torch takes 5-10 s on a GPU box; the engine's own start
(`python -m sglang.launch_server`) is not slowed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from sglang.srt import flags, standin_model
from sglang.version import __version__, is_old_era

logger = logging.getLogger(__name__)

TRUTHY = ("1", "true", "yes", "on")

if sys.argv[:1] == ["-c"]:
    time.sleep(float(os.environ.get("STANDIN_PROBE_IMPORT_S") or 0))


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in TRUTHY


class _ServerArgsRecord:
    """The argument record: the raw CLI values, and after resolution the effective ones."""

    def __init__(self, **kwargs: Any) -> None:
        self._field_names: List[str] = list(kwargs)
        for key, value in kwargs.items():
            setattr(self, key, value)
        self._resolved: Optional[Dict[str, Any]] = None
        self._resolved_overrides: Dict[str, tuple] = {}
        if is_old_era():
            self.__post_init__()

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        flags.add_flags(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        attrs = flags.option_dests()
        return cls(**{attr: getattr(args, attr) for attr in attrs})

    def __post_init__(self) -> None:
        """Only the seed era resolves here."""

    def resolved_dict(self) -> Dict[str, Any]:
        assert self._resolved is not None
        return dict(self._resolved)

    def resolved_view(self) -> SimpleNamespace:
        return SimpleNamespace(**self.resolved_dict())

    def _raw(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in self._field_names}

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._field_names)
        return f"ServerArgs({body})"

    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class SeedEraServerArgs(_ServerArgsRecord):
    """0.5.10: resolution and validation inside __post_init__, in the real order (auto strategy first)."""

    def __post_init__(self) -> None:
        if self.mamba_scheduler_strategy == "auto":
            self.mamba_scheduler_strategy = "no_buffer"   # server_args.py:964 (0.5.10)
        self._handle_model_specific_adjustments()
        self._resolved = _resolve_seed_era(self._raw())
        for key, value in self._resolved.items():
            setattr(self, key, value)

    def _handle_model_specific_adjustments(self) -> None:
        model_arch = standin_model.architecture(self.model_path)
        if standin_model.is_hybrid(model_arch):
            self._handle_mamba_radix_cache(model_arch)

    def _handle_mamba_radix_cache(self, model_arch: str) -> None:
        if self.mamba_scheduler_strategy == "extra_buffer":
            if self.disable_radix_cache:
                raise ValueError(
                    "mamba extra_buffer is not compatible with --disable-radix-cache "
                    "Overlap scheduling is already supported with no_buffer + disable_radix_cache. "
                    "Please use --mamba-scheduler-strategy no_buffer instead."
                )
            return
        if self.disable_radix_cache:
            return
        if self.speculative_algorithm is not None:
            raise ValueError(
                f"Speculative decoding for {model_arch} is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
                "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
            )
        self.disable_overlap_schedule = True


class CurrentServerArgs(_ServerArgsRecord):
    """0.5.23: resolution on demand."""

    def resolve_once(self) -> None:
        if self._resolved is None:
            self._resolved = _resolve(self._raw())
        raw = self._raw()
        self._resolved_overrides = {
            k: (raw.get(k), v) for k, v in self._resolved.items() if k in raw and raw[k] != v
        }

    def resolved_dict(self) -> Dict[str, Any]:
        self.resolve_once()
        return super().resolved_dict()


ServerArgs = SeedEraServerArgs if is_old_era() else CurrentServerArgs


def _resolve(raw: Dict[str, Any]) -> Dict[str, Any]:
    """0.5.23's effective values on the pretended GPU."""
    cfg = dict(raw)
    gpu_mib = standin_model.Capacity.from_env().gpu_gb * 1024
    chunked, max_bs = standin_model.tiers(gpu_mib)
    arch = standin_model.architecture(cfg["model_path"])
    for key in ("tokenizer_path", "served_model_name"):
        if key in cfg and cfg[key] is None:
            cfg[key] = cfg["model_path"]
    if cfg.get("chunked_prefill_size") is None:
        cfg["chunked_prefill_size"] = chunked
    if "cuda_graph_max_bs_decode" in cfg and cfg["cuda_graph_max_bs_decode"] is None:
        cfg["cuda_graph_max_bs_decode"] = max_bs
    if cfg.get("mem_fraction_static") is None:
        tp = int(cfg.get("tp_size") or 1)
        cfg["mem_fraction_static"] = standin_model.auto_mem_fraction_static(gpu_mib, chunked, max_bs, tp)
    _resolve_speculative(cfg)
    if cfg.get("attention_backend") is None:
        topk = cfg.get("speculative_eagle_topk") or 1
        cfg["attention_backend"] = "triton" if topk > 1 else "fa3"
    if standin_model.is_hybrid(arch) and not cfg.get("disable_radix_cache"):
        handle_mamba_radix_cache(cfg, arch)
    return cfg


def _resolve_seed_era(raw: Dict[str, Any]) -> Dict[str, Any]:
    """0.5.10's effective values on the pretended GPU (server_args.py of the 0.5.10 wheel)."""
    cfg = dict(raw)
    gpu_mib = standin_model.Capacity.from_env().gpu_gb * 1024
    tp = int(cfg.get("tp_size") or 1)
    chunked, max_bs = _seed_era_tiers(gpu_mib, tp)
    for key in ("tokenizer_path", "served_model_name"):
        if cfg.get(key) is None:
            cfg[key] = cfg["model_path"]
    if cfg.get("chunked_prefill_size") is None:
        cfg["chunked_prefill_size"] = chunked
    if cfg.get("cuda_graph_max_bs") is None:
        cfg["cuda_graph_max_bs"] = max_bs
    spec = cfg.get("speculative_algorithm")
    if cfg.get("mem_fraction_static") is None:
        cfg["mem_fraction_static"] = _seed_era_mem_fraction(cfg, gpu_mib, tp)
    if spec is not None:
        _resolve_speculative(cfg)
        # server_args.py:2999 (0.5.10): overlap only with spec v2
        cfg["disable_overlap_schedule"] = not _env_true("SGLANG_ENABLE_SPEC_V2")
    if cfg.get("attention_backend") is None:
        topk = cfg.get("speculative_eagle_topk") or 1
        cfg["attention_backend"] = "triton" if topk > 1 else "fa3"
    if cfg.get("page_size") is None:
        cfg["page_size"] = 1
    return cfg


def _seed_era_tiers(gpu_mib: float, tp: int) -> tuple:
    """_handle_gpu_memory_settings (0.5.10): (chunked_prefill_size, cuda_graph_max_bs)."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 2048, 24 if tp < 4 else 80
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def _piecewise_tokens(max_tokens: int) -> List[int]:
    """_generate_piecewise_cuda_graph_tokens (0.5.10) up to max_tokens."""
    steps = [(4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256), (4608, 8192, 512),
             (9216, 32768, 1024)]
    return [t for lo, hi, step in steps for t in range(lo, hi + 1, step) if t <= max_tokens]


def _seed_era_mem_fraction(cfg: Dict[str, Any], gpu_mib: float, tp: int) -> float:
    """0.5.10's automatic mem_fraction_static, then its VLM reduction."""
    chunked = cfg["chunked_prefill_size"]
    reserved = 512 + max(chunked, 2048) * 1.5 + cfg["cuda_graph_max_bs"] * 2 + tp * 1 / 8 * 1024
    arch = standin_model.architecture(cfg["model_path"])
    spec = cfg.get("speculative_algorithm")
    # 0.5.10 has already turned piecewise CUDA graphs off for hybrid models and speculative decoding here
    if not (cfg.get("disable_piecewise_cuda_graph") or spec is not None or standin_model.is_hybrid(arch)):
        reserved += len(_piecewise_tokens(chunked)) * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if spec is not None:
        reserved += 6 * 1024 if spec == "STANDALONE" else 0 if spec == "NGRAM" else 4 * 1024
    mfs = round((gpu_mib - reserved) / gpu_mib, 3)
    vision = standin_model.vision_config(cfg["model_path"])
    if vision is None and arch.endswith("ForConditionalGeneration"):
        # no vision_config in config.json: transformers' defaults for the architecture (Qwen3.5: hidden 1152;
        # 0.5.10 reads num_hidden_layers, which that config lacks: 24)
        vision = {"hidden_size": 1152}
    if vision is None:
        return mfs
    ratio = (vision.get("num_hidden_layers", 24) * vision.get("hidden_size", 1024) ** 2) / (24 * 1024 ** 2)
    factor = max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    return mfs * 0.95 * factor


def _resolve_speculative(cfg: Dict[str, Any]) -> None:
    algo = cfg.get("speculative_algorithm")
    if algo is None:
        return
    if algo.upper() == "NEXTN":
        cfg["speculative_algorithm"] = "EAGLE"
    for key, default in (
        ("speculative_num_steps", 3),
        ("speculative_eagle_topk", 1),
        ("speculative_num_draft_tokens", 4),
    ):
        if cfg.get(key) is None:
            cfg[key] = default
    if cfg.get("max_running_requests") is None:
        cfg["max_running_requests"] = 48


def handle_mamba_radix_cache(cfg: Dict[str, Any], model_arch: str) -> None:
    """0.5.23: auto -> extra_buffer (overlap on) or no_buffer (overlap off), then validate."""
    if cfg.get("mamba_radix_cache_strategy") == "auto":
        if cfg.get("disable_overlap_schedule") and not (cfg.get("page_size") or 1) > 1:
            cfg["mamba_radix_cache_strategy"] = "no_buffer"
            cfg["disable_overlap_schedule"] = True
        else:
            cfg["mamba_radix_cache_strategy"] = "extra_buffer"
    if cfg["mamba_radix_cache_strategy"] == "no_buffer":
        validate_mamba_no_buffer(SimpleNamespace(**cfg), model_arch)


def validate_mamba_no_buffer(view: Any, model_arch: str) -> None:
    assert view.page_size in (1, None), "no_buffer only supports page_size=1."
    assert view.disable_overlap_schedule, (
        "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True."
    )


def prepare_server_args(argv: List[str]) -> ServerArgs:
    """Parses argv like the real one (prog "sglang serve", exit 2 on argparse errors)."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    raw_args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(raw_args.log_level).upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    server_args = ServerArgs.from_cli_args(raw_args)
    server_args._launch_command = list(argv)
    return server_args


def server_args_log_text(server_args: ServerArgs) -> str:
    """The text after `server_args=`: a dict repr in 0.5.23, the dataclass repr in old eras."""
    if is_old_era():
        return repr(server_args)
    return repr(server_args.resolved_dict())


__all__ = ["ServerArgs", "prepare_server_args", "server_args_log_text", "__version__"]
