"""Engine knowledge, one module per engine kind; `engine_for(kind)` picks it."""

from __future__ import annotations

from deployer.engines.base import EngineSpec


def engine_for(kind: str) -> EngineSpec:
    if kind == "sglang":
        from deployer.engines.sglang import SGLANG

        return SGLANG
    raise KeyError(f"unknown engine kind {kind!r}")


KINDS = ("sglang",)


def all_secret_flags() -> frozenset[str]:
    """The secret flags of every engine kind (for masking text whose engine is not known)."""
    out: frozenset[str] = frozenset()
    for kind in KINDS:
        out |= engine_for(kind).secret_flags
    return out
