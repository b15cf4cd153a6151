"""The engine registry: the `Engine` of each kind (`engine_for`), the kinds known (`kinds`), and the engine a log
is from (`detect`).

It scans the engines package: every subpackage that defines `ENGINE` (an `Engine`) is an engine, registered under
its `kind`. Adding an engine touches only its own package; nothing here names one, and nothing here picks an
engine by default (where none is named, callers use only the engine-neutral knowledge of `engines/common`).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from functools import lru_cache

from deployer.engines.base import Engine

PACKAGE = __name__.rpartition(".")[0]


@lru_cache(maxsize=1)
def _registry() -> dict[str, Engine]:
    found: dict[str, Engine] = {}
    for info in pkgutil.iter_modules(sys.modules[PACKAGE].__path__, prefix=f"{PACKAGE}."):
        if not info.ispkg:
            continue
        engine = getattr(importlib.import_module(info.name), "ENGINE", None)
        if isinstance(engine, Engine):
            if engine.kind in found:
                raise RuntimeError(f"engine kind {engine.kind!r} is defined twice ({info.name})")
            found[engine.kind] = engine
    return found


def kinds() -> tuple[str, ...]:
    """The engine kinds this deployer knows, sorted."""
    return tuple(sorted(_registry()))


def engines() -> tuple[Engine, ...]:
    """Every registered engine, in the order of `kinds()`."""
    return tuple(_registry()[kind] for kind in kinds())


def engine_for(kind: str) -> Engine:
    """The engine registered under `kind`; KeyError naming the known kinds when there is none. The package named
    like the kind is asked first (status of one deployment imports one engine, not all of them)."""
    own = _own_package(kind)
    if own is not None:
        return own
    try:
        return _registry()[kind]
    except KeyError:
        raise KeyError(f"unknown engine kind {kind!r} (known: {', '.join(kinds())})") from None


@lru_cache(maxsize=8)
def _own_package(kind: str) -> Engine | None:
    """The ENGINE of the subpackage named `kind`, when there is one and it says it is that kind."""
    if not kind.isidentifier() or kind not in {i.name for i in pkgutil.iter_modules(sys.modules[PACKAGE].__path__)
                                               if i.ispkg}:
        return None
    engine = getattr(importlib.import_module(f"{PACKAGE}.{kind}"), "ENGINE", None)
    return engine if isinstance(engine, Engine) and engine.kind == kind else None


MARK_HEAD_CHARS = 1 << 20      # detect reads a log's first MiB ...
MARK_TAIL_CHARS = 256 << 10    # ... and its last 256 KiB (argparse's usage and error come last)


def detect(text: str) -> Engine | None:
    """The engine whose log `text` is, from the marks only that engine's log carries (LogFormat.markers).

    None when no engine's marks are in it, or more than one engine's: the caller says so and uses only the
    engine-neutral knowledge; nothing here picks an engine by default."""
    window = text if len(text) <= MARK_HEAD_CHARS + MARK_TAIL_CHARS else \
        text[:MARK_HEAD_CHARS] + "\n" + text[-MARK_TAIL_CHARS:]
    found = [engine for engine in engines() if any(m.search(window) for m in engine.log.markers)]
    return found[0] if len(found) == 1 else None


def detect_kind(text: str) -> str | None:
    """The kind of `detect(text)`, None when it cannot tell."""
    engine = detect(text)
    return engine.kind if engine is not None else None


def all_secret_flags() -> frozenset[str]:
    """The secret flags of every engine (for masking text whose engine is not known)."""
    out: frozenset[str] = frozenset()
    for engine in engines():
        out |= engine.launch.secret_flags
    return out
