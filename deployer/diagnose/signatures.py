"""Failure signatures: the engine's known failures as data (`engines/<kind>/signatures.yaml`), and version ranges.

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

from deployer.engines import engine_for
from deployer.remedy import RemedySpec, remedy_spec


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
def load_signatures(kind: str = "sglang", path: str | None = None) -> tuple[Signature, ...]:
    """The engine's signatures, in file order (earlier = more specific, tried first)."""
    spec = engine_for(kind)
    file = Path(path) if path else Path(spec.data_dir) / spec.signatures_file
    data = yaml.safe_load(file.read_text(encoding="utf-8"))
    items = data.get("signatures", []) if isinstance(data, dict) else data
    signatures = tuple(Signature.model_validate(item) for item in items)
    ids = [s.id for s in signatures]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{file}: duplicate signature ids {duplicates}")
    return signatures


def version_in(version: str, spec: str) -> bool:
    """`0.5.23` in `>=0.5.0,<0.5.20`? `*` (or empty) matches everything; unparsable versions match."""
    if spec.strip() in ("", "*"):
        return True
    have = _version_tuple(version)
    if have is None:
        return True
    for clause in spec.split(","):
        found = re.match(r"^\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$", clause)
        want = _version_tuple(found.group(2)) if found else None
        if found is None or want is None:
            raise ValueError(f"bad version range {spec!r}")
        if not _compare(have, found.group(1), want):
            return False
    return True


def _version_tuple(text: str) -> tuple[int, ...] | None:
    found = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    width = max(len(have), len(want))
    a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, ">": a > b, "<": a < b}[op]
