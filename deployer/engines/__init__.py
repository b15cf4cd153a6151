"""Engine knowledge, one module per engine kind; `engine_for(kind)` picks it."""

from __future__ import annotations

from deployer.engines.base import EngineSpec


def engine_for(kind: str) -> EngineSpec:
    if kind == "sglang":
        from deployer.engines.sglang.spec import SGLANG

        return SGLANG
    raise KeyError(f"unknown engine kind {kind!r}")
