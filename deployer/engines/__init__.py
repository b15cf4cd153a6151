"""Engine knowledge: the EngineSpec interface (`base`), one package per engine (`sglang/`, `vllm/`), the
renames and follow-on table readers (`renames`, `followons`); the registry below finds the engines.

The registry scans this package: every subpackage that defines `ENGINE` (an EngineSpec) is an engine,
registered under its `kind`. Adding an engine touches only its own package; nothing here names one.
Layer below profile (which validates `engine.kind` against `kinds()`): may import only the leaves and
third-party libraries, never a Profile (engines take plain values). No engine package imports another
(import-linter contract).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from deployer.engines.base import EngineSpec


@lru_cache(maxsize=1)
def _registry() -> dict[str, EngineSpec]:
    found: dict[str, EngineSpec] = {}
    for info in pkgutil.iter_modules(__path__, prefix=f"{__name__}."):
        if not info.ispkg:
            continue
        spec = getattr(importlib.import_module(info.name), "ENGINE", None)
        if isinstance(spec, EngineSpec):
            if spec.kind in found:
                raise RuntimeError(f"engine kind {spec.kind!r} is defined twice ({info.name})")
            found[spec.kind] = spec
    return found


def kinds() -> tuple[str, ...]:
    """The engine kinds this deployer knows, sorted."""
    return tuple(sorted(_registry()))


def engine_for(kind: str) -> EngineSpec:
    """The engine registered under `kind`; KeyError naming the known kinds when there is none."""
    try:
        return _registry()[kind]
    except KeyError:
        raise KeyError(f"unknown engine kind {kind!r} (known: {', '.join(kinds())})") from None


def default_kind() -> str:
    """The kind of the one engine marked `default` (where nothing names an engine)."""
    marked = [kind for kind in kinds() if engine_for(kind).default]
    if len(marked) != 1:
        raise RuntimeError(f"exactly one engine must be the default, found {marked or 'none'}")
    return marked[0]


MARK_HEAD_CHARS = 1 << 20      # detect_kind reads a log's first MiB ...
MARK_TAIL_CHARS = 256 << 10    # ... and its last 256 KiB (argparse's usage and error come last)


def detect_kind(text: str) -> str | None:
    """The engine whose log `text` is, from the marks only that engine's log carries (EngineSpec.log_markers).

    None when no engine's marks are in it, or more than one engine's: the caller says so and uses only the
    engine-neutral knowledge; nothing here picks an engine by default."""
    window = text if len(text) <= MARK_HEAD_CHARS + MARK_TAIL_CHARS else \
        text[:MARK_HEAD_CHARS] + "\n" + text[-MARK_TAIL_CHARS:]
    found = [kind for kind in kinds() if any(m.search(window) for m in engine_for(kind).log_markers)]
    return found[0] if len(found) == 1 else None


def all_secret_flags() -> frozenset[str]:
    """The secret flags of every engine kind (for masking text whose engine is not known)."""
    out: frozenset[str] = frozenset()
    for kind in kinds():
        out |= engine_for(kind).secret_flags
    return out
