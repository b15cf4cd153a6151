"""Failure signatures: the engine's known failures as data (`engines/<kind>/signatures.yaml`), and the
engine-neutral ones every engine shares (`engines/common/signatures.yaml`).

Each signature has an id, regexes, the engine versions it applies to, a summary, whether it is transient, the
source of its text, a hint for people, and a remedy (see remedy.py).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from deployer.engines import Engine

from deployer.engines import common
from deployer.remedy.propose import RemedySpec, remedy_spec
from deployer.versions import version_in

__all__ = ["Signature", "common_signatures", "engine_signatures", "load_signatures", "version_in"]


class Signature(BaseModel):
    """One known failure, as written in the engine's signatures file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    patterns: list[str] = Field(min_length=1)
    versions: str = "*"
    summary: str
    transient: bool = False
    source: str
    hint: str | None = None
    requires: list[str] = Field(default_factory=list, description="regexes that must also occur in the log")
    excludes: list[str] = Field(default_factory=list, description="regexes that must not occur in the log")
    remedy: RemedySpec | None = None
    _compiled: tuple[re.Pattern[str], ...] = PrivateAttr(default=())

    @field_validator("remedy", mode="before")
    @classmethod
    def _remedy(cls, value: Any) -> Any:
        return None if value is None or isinstance(value, RemedySpec) else remedy_spec(value)

    def model_post_init(self, context: Any) -> None:
        self._compiled = tuple(re.compile(p, re.MULTILINE) for p in self.patterns)

    def search(self, text: str) -> re.Match[str] | None:
        for pattern in self._compiled:
            found = pattern.search(text)
            if found:
                return found
        return None

    def fits(self, whole: str) -> bool:
        """The extra conditions on the rest of the log."""
        needed = all(re.search(p, whole, re.MULTILINE) for p in self.requires)
        return needed and not any(re.search(p, whole, re.MULTILINE) for p in self.excludes)


@lru_cache(maxsize=8)
def load_signatures(engine: Engine | None, path: str | None = None) -> tuple[Signature, ...]:
    """The signatures a log of `engine` is matched against, in order (earlier = more specific, tried first):
    the engine's own file (`path` instead, when given), then the engine-neutral ones of `engines/common`.
    `engine` None (a log whose engine cannot be told): the engine-neutral ones only."""
    common = common_signatures()
    if engine is None:
        return common
    own = engine_signatures(engine, path)
    clash = sorted({s.id for s in own} & {s.id for s in common})
    if clash:
        raise ValueError(f"{engine.kind}: signature ids {clash} are defined by the engine and in engines/common")
    return own + common


@lru_cache(maxsize=8)
def engine_signatures(engine: Engine, path: str | None = None) -> tuple[Signature, ...]:
    """Only the engine's own signatures (Knowledge.signatures, or the file at `path`), in file order; () when
    it has none."""
    file = Path(path) if path else engine.knowledge.signatures
    return _read(file) if file is not None else ()


@lru_cache(maxsize=1)
def common_signatures() -> tuple[Signature, ...]:
    """The engine-neutral signatures (engines/common/signatures.yaml), in file order."""
    return _read(common.SIGNATURES_FILE)


def _read(file: Path) -> tuple[Signature, ...]:
    data = yaml.safe_load(file.read_text(encoding="utf-8"))
    items = data.get("signatures", []) if isinstance(data, dict) else data
    signatures = tuple(Signature.model_validate(item) for item in items)
    ids = [s.id for s in signatures]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{file}: duplicate signature ids {duplicates}")
    return signatures
