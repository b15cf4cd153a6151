"""Follow-on constraints: startup checks that a remedy's new arguments must also pass.

A remedy that fixes one check can walk straight into another (a cache strategy that forbids overlap
scheduling). The engine's table of such checks (`Knowledge.followons` in the engine's package, from the real
source, with the releases each holds for) lets `complete` add what the next check needs, or say that the
remedy cannot be completed (its own changes would have to be undone), so the caller picks another option.
Pure, apart from reading the table once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from deployer.engines.base import Knowledge
from deployer.versions import version_in


class FollowOn(BaseModel):
    """One startup check: when `when` holds for the resulting args and `violated` too, `fix` is needed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    versions: str
    when: dict[str, Any]
    violated: dict[str, Any]
    fix: dict[str, Any] = Field(default_factory=dict)
    fix_env: dict[str, str] = Field(default_factory=dict)
    text: str
    source: str


@lru_cache(maxsize=4)
def load_followons(knowledge: Knowledge) -> tuple[FollowOn, ...]:
    """The engine's follow-on table (Knowledge.followons), in file order; () when it has none."""
    if knowledge.followons is None:
        return ()
    data = yaml.safe_load(knowledge.followons.read_text(encoding="utf-8")) or {}
    return tuple(FollowOn.model_validate(item) for item in data.get("followons", []))


Lookup = Callable[[str], Any]


def complete(changes: Mapping[str, Any], lookup: Lookup, version: str | None,
             knowledge: Knowledge) -> tuple[dict[str, Any], dict[str, str], list[str]] | None:
    """What else the change must set so that no known check fails: (args, env, notes), or None when a check
    could only pass by undoing part of the change itself.

    lookup(name): the value the engine will have for a name the change does not set (profile, dump, dry
    resolution). Checks with a version range apply only when the engine version is known and in range.
    """
    args: dict[str, Any] = {}
    env: dict[str, str] = {}
    notes: list[str] = []

    def value(name: str) -> Any:
        for spelling in name.split("|"):
            for layer in (args, changes):
                if spelling in layer:
                    return layer[spelling]
        return next((v for v in (lookup(s) for s in name.split("|")) if v is not None), None)

    for _ in range(3):  # a fix may trigger another check; the table is small and acyclic
        added = False
        for check in load_followons(knowledge):
            if version is None or not version_in(version, check.versions):
                continue
            if not (_holds(check.when, value) and _holds(check.violated, value)):
                continue
            if any(name in changes and changes[name] != fix for name, fix in check.fix.items()):
                return None
            new = {k: v for k, v in check.fix.items() if k not in args}
            if new or any(env.get(k) != v for k, v in check.fix_env.items()):
                args.update(new)
                env.update(check.fix_env)
                notes.append(f"also {', '.join(f'{k}={v}' for k, v in check.fix.items())}: {check.text!r} "
                             f"({check.source})")
                added = True
        if not added:
            break
    return args, env, notes


def _holds(conditions: Mapping[str, Any], value: Lookup) -> bool:
    for name, want in conditions.items():
        have = value(name)
        if isinstance(want, dict) and ("in" in want or "not_in" in want):
            if "in" in want and have not in want["in"]:
                return False
            if "not_in" in want and have in want["not_in"]:
                return False
        elif have != want:
            return False
    return True
