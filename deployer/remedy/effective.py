"""Effective values: what the engine really used for an attempt, and where each value comes from.

A remedy that moves a number must start from the value the engine used, not from a guess: the attempt's own
args dump first, else preflight's dry resolution (valid only for the args it resolved), else the profile.
`EngineValues` keeps these layers in that order and answers a lookup with the value and its source
("engine resolved 0.771"). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENGINE_RESOLVED = "engine resolved"      # the attempt's own args dump
DRY_RESOLUTION = "dry resolution"        # preflight ran the engine's argument resolution for these args
PROFILE = "profile"                      # the profile sets it
MESSAGE = "engine message"               # the failure message names the value the engine used
DEFAULT = "documented default"           # none of the above: the signature's documented default


@dataclass(frozen=True)
class Known:
    """One effective value and where it comes from."""

    value: Any
    source: str

    def describe(self) -> str:
        return f"{self.source} {self.value}"


@dataclass(frozen=True)
class EngineValues:
    """Layers of (source, values), most trusted first."""

    layers: tuple[tuple[str, Mapping[str, Any]], ...] = ()

    def lookup(self, name: str) -> Known | None:
        for source, values in self.layers:
            value = values.get(name)
            if value is not None:
                return Known(value, source)
        return None

    def then(self, source: str, values: Mapping[str, Any] | None) -> EngineValues:
        """These values, with a less trusted layer added after the existing ones."""
        if not values:
            return self
        return EngineValues((*self.layers, (source, dict(values))))


@dataclass(frozen=True)
class DryResolution:
    """Preflight's dry resolution and the engine args it resolved (stale once those args change)."""

    args: Mapping[str, Any]
    resolved: Mapping[str, Any]

    def applies_to(self, args: Mapping[str, Any]) -> bool:
        return dict(self.args) == dict(args)


def engine_values(dump: Mapping[str, Any] | None, dry: DryResolution | None,
                  profile_args: Mapping[str, Any]) -> EngineValues:
    """The layers for one attempt launched with `profile_args`."""
    values = EngineValues().then(ENGINE_RESOLVED, dump)
    if dry is not None and dry.applies_to(profile_args):
        values = values.then(DRY_RESOLUTION, dry.resolved)
    return values.then(PROFILE, profile_args)
