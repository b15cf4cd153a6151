"""An engine's flag and environment renames by version (`renames.yaml` in its package), read by preflight
(translating a profile's flags for the installed version) and by remedies (carrying a value over a rename).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from deployer.engines import engine_for


@dataclass(frozen=True)
class Rename:
    """One entry of engines/<engine>/renames.yaml."""

    old: str
    new: str | None
    kind: str  # "arg" | "env"
    since: str
    removed: str | None
    source: str


def load_renames(*, engine: str, path: Path | None = None) -> list[Rename]:
    """The engine's renames table (or the table at `path`), in file order."""
    if path is None:
        spec = engine_for(engine)
        if not spec.renames_file:
            return []
        text = (Path(spec.data_dir) / spec.renames_file).read_text(encoding="utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    entries = yaml.safe_load(text) or []
    return [
        Rename(old=str(e["old"]), new=None if e.get("new") is None else str(e["new"]), kind=str(e["kind"]),
               since=str(e["since"]), removed=None if e.get("removed") is None else str(e["removed"]),
               source=str(e.get("source", "")))
        for e in entries
    ]
