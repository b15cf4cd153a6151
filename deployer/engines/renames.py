"""An engine's flag and environment renames by version (`renames.yaml` in its package), read by preflight
(translating a profile's flags for the installed version) and by remedies (carrying a value over a rename).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from deployer.engines.base import Knowledge


@dataclass(frozen=True)
class Rename:
    """One entry of engines/<engine>/renames.yaml."""

    old: str
    new: str | None
    kind: str  # "arg" | "env"
    since: str
    removed: str | None
    source: str


def load_renames(knowledge: Knowledge | None = None, *, path: Path | None = None) -> list[Rename]:
    """The engine's renames table (Knowledge.renames; or the table at `path`), in file order; [] when none."""
    file = path if path is not None else knowledge.renames if knowledge is not None else None
    if file is None:
        return []
    text = file.read_text(encoding="utf-8")
    entries = yaml.safe_load(text) or []
    return [
        Rename(old=str(e["old"]), new=None if e.get("new") is None else str(e["new"]), kind=str(e["kind"]),
               since=str(e["since"]), removed=None if e.get("removed") is None else str(e["removed"]),
               source=str(e.get("source", "")))
        for e in entries
    ]
