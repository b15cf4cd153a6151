"""`--save-fixed PATH`: write the profile that worked: the user's file plus the changes healing made.

The user's own file is the base (not the merged, expanded profile), so `extends:` and `${VAR}` references stay
as written and no secret is ever written out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def save_fixed(source: Path, changes: list[dict[str, Any]], dest: Path) -> None:
    data = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    engine = data.setdefault("engine", {})
    for change in changes:
        _apply(engine.setdefault("args", {}), change.get("args", {}))
        _apply(engine.setdefault("env", {}), change.get("env", {}))
    for key in ("args", "env"):
        if not engine.get(key):
            engine.pop(key, None)
    if isinstance(data.get("extends"), str):
        base = (source.parent / data["extends"]).resolve()
        data["extends"] = os.path.relpath(base, dest.resolve().parent)
    reasons = "; ".join(str(c.get("reason", "")) for c in changes if c.get("reason"))
    header = f"# Written by `deploy up --save-fixed` from {source.name}. Changes: {reasons or 'none'}\n"
    dest.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")


def _apply(mapping: dict[str, Any], updates: dict[str, Any]) -> None:
    for key, value in updates.items():
        dashed = key.replace("_", "-")
        mapping.pop(dashed, None)  # the user may have written the kebab form
        if value is None:
            mapping.pop(key, None)
        else:
            mapping[key] = value
