"""Engine knowledge, one module per engine kind; `engine_for(kind)` finds it in the registry below."""

from __future__ import annotations

import importlib

from deployer.engines.base import EngineSpec

# kind -> "module:attribute" of its EngineSpec; imported on first use.
REGISTRY: dict[str, str] = {
    "sglang": "deployer.engines.sglang:SGLANG",
    "vllm": "deployer.engines.vllm:VLLM",
}


def engine_for(kind: str) -> EngineSpec:
    where = REGISTRY.get(kind)
    if where is None:
        raise KeyError(f"unknown engine kind {kind!r}")
    module, _, name = where.partition(":")
    spec = getattr(importlib.import_module(module), name)
    assert isinstance(spec, EngineSpec)
    return spec


def known_kinds() -> tuple[str, ...]:
    return tuple(sorted(REGISTRY))
