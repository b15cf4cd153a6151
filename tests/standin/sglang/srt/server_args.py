"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

The argument side of the stand-in: `ServerArgs.add_cli_args(parser)` and `prepare_server_args(argv)` with
the real flag table (see flags.py), plus a small imitation of argument resolution: the defaults SGLang
fills in on an H200-like GPU, the Mamba radix-cache strategy choice, speculative defaults, and the era's
validation errors (raised from functions named like the real ones, so the tracebacks read alike).

Eras: 0.5.23 resolves in `resolve_once()` (called by launch_server); before 0.5.20 everything happened in
`ServerArgs.__post_init__`, inside `prepare_server_args`, and SGLANG_ENABLE_SPEC_V2 was read.
"""

from __future__ import annotations

import argparse
import logging
import os
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from sglang.srt import flags, standin_model
from sglang.version import __version__, is_old_era

logger = logging.getLogger(__name__)

TRUTHY = ("1", "true", "yes", "on")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in TRUTHY


class ServerArgs:
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

    # ---- old era: resolution and validation inside __post_init__ ----
    def __post_init__(self) -> None:
        self._handle_model_specific_adjustments()
        self._resolved = _resolve(self._raw(), old_era=True)
        for key, value in self._resolved.items():
            setattr(self, key, value)

    def _handle_model_specific_adjustments(self) -> None:
        model_arch = standin_model.architecture(self.model_path)
        if standin_model.is_hybrid(model_arch):
            self._handle_mamba_radix_cache(model_arch)

    def _handle_mamba_radix_cache(self, model_arch: str) -> None:
        if self.disable_radix_cache or self.mamba_scheduler_strategy != "no_buffer":
            return
        if self.speculative_algorithm is not None:
            raise ValueError(
                f"Speculative decoding for {model_arch} is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
                "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
            )

    # ---- 0.5.23: resolution on demand ----
    def resolve_once(self) -> None:
        if self._resolved is None:
            self._resolved = _resolve(self._raw(), old_era=False)
        raw = self._raw()
        self._resolved_overrides = {
            k: (raw.get(k), v) for k, v in self._resolved.items() if k in raw and raw[k] != v
        }

    def resolved_dict(self) -> Dict[str, Any]:
        self.resolve_once()
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


def _resolve(raw: Dict[str, Any], old_era: bool) -> Dict[str, Any]:
    """Effective values as SGLang would pick them on the pretended GPU."""
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
        if old_era:
            _resolve_mamba_old(cfg)
        else:
            handle_mamba_radix_cache(cfg, arch)
    return cfg


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


def _resolve_mamba_old(cfg: Dict[str, Any]) -> None:
    strategy = cfg.get("mamba_scheduler_strategy")
    if strategy == "auto":
        strategy = "no_buffer" if cfg.get("disable_overlap_schedule") else "extra_buffer"
        cfg["mamba_scheduler_strategy"] = strategy
    if strategy == "no_buffer" and cfg.get("speculative_algorithm") is None:
        cfg["disable_overlap_schedule"] = True


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
