"""Engine knowledge: the EngineSpec interface (`base`), one package per engine (`sglang/`), the renames
table reader (`renames`); `engine_for(kind)` picks an engine.

Layer beside remote, below render: may import only the leaves and third-party libraries. No engine package
imports another (import-linter contract).
"""

from __future__ import annotations

from deployer.engines.base import EngineSpec


def engine_for(kind: str) -> EngineSpec:
    if kind == "sglang":
        from deployer.engines.sglang.spec import SGLANG

        return SGLANG
    raise KeyError(f"unknown engine kind {kind!r}")
