"""Remedies: turn a signature's remedy data (`RemedySpec`) into one concrete `Change` for a profile.

A remedy is a list of options tried in order; the first option that yields a change which is neither a
no-op for this profile nor already in `tried` wins. An option combines fixed edits (set/unset args and
env), a rename of a flag, values read from the engine's message, and a numeric step within bounds.
Pure: no I/O apart from reading the engine's renames table once.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from deployer.diagnose import Diagnosis
    from deployer.profile import Profile


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class StepSpec(_Data):
    """Move a numeric flag: `by` (added) or `factor` (multiplied), clamped to [min, max]."""

    arg: str
    by: float | None = None
    factor: float | None = None
    min: float | None = None
    max: float | None = None
    default: float = Field(description="the engine's value when neither profile nor message names one")
    digits: int = 3
    integer: bool = False
    prefer_from_message: str | None = Field(default=None, description="regex; its groups name candidate values")
    current_from_message: str | None = Field(default=None, description="regex; the engine's resolved value")
    prefer_ratio_from_message: str | None = Field(
        default=None, description="regex with two groups: candidate = group 1 / group 2 - ratio_margin (vLLM free/total)")
    ratio_margin: float = 0.0

    @model_validator(mode="after")
    def _one_way(self) -> StepSpec:
        if (self.by is None) == (self.factor is None):
            raise ValueError(f"step_arg {self.arg}: give exactly one of by / factor")
        return self

    @property
    def upward(self) -> bool:
        return (self.by or 0) > 0 or (self.factor or 0) > 1


class RenameSpec(_Data):
    """Rename a flag: fixed (`from`/`to`), or `from_message` (regex group = the flag) via the renames table."""

    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    from_message: str | None = None


class RemedyOption(_Data):
    set_args: dict[str, Any] = Field(default_factory=dict)
    unset_args: list[str] = Field(default_factory=list)
    set_env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)
    set_args_from_message: dict[str, str] = Field(default_factory=dict, description="flag -> regex with a group")
    rename_arg: RenameSpec | None = None
    step_arg: StepSpec | None = None


class RemedySpec(_Data):
    options: tuple[RemedyOption, ...]


def remedy_spec(data: Any) -> RemedySpec:
    """A remedy from signature data: one option (mapping) or several (list, tried in order)."""
    items = data if isinstance(data, list) else [data]
    return RemedySpec(options=tuple(RemedyOption.model_validate(item) for item in items))


@dataclass(frozen=True)
class Change:
    """One concrete patch of a profile: args/env to set (None = remove) and why."""

    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str | None] = field(default_factory=dict)
    reason: str = ""

    def key(self) -> str:
        return json.dumps({"args": self.args, "env": self.env}, sort_keys=True, default=str)

    def to_json(self) -> dict[str, Any]:
        return {"args": dict(self.args), "env": dict(self.env), "reason": self.reason}

    def is_empty(self) -> bool:
        return not self.args and not self.env


def propose(diagnosis: Diagnosis, profile: Profile, tried: list[Change]) -> Change | None:
    """The change the diagnosis' remedy makes to this profile, or None when nothing new applies."""
    if diagnosis.remedy is None:
        return None
    return resolve(
        diagnosis.remedy,
        diagnosis.message_text(),
        args=dict(profile.engine.args),
        env=dict(profile.engine.env),
        tried=tried,
    )


def resolve(
    spec: RemedySpec,
    message: str,
    *,
    args: dict[str, Any],
    env: dict[str, str],
    tried: list[Change] | None = None,
) -> Change | None:
    """First option whose change is real (not a no-op) and new (not in `tried`)."""
    seen = {c.key() for c in tried or []}
    for option in spec.options:
        change = _option_change(option, message, args, env)
        if change is None:
            continue
        change = _without_noops(change, args, env)
        if not change.is_empty() and change.key() not in seen:
            return change
    return None


def _option_change(option: RemedyOption, message: str, args: dict[str, Any], env: dict[str, str]) -> Change | None:
    new_args: dict[str, Any] = {}
    new_env: dict[str, str | None] = {}
    for name, value in option.set_args.items():
        new_args[_pick_name(name, args)] = value
    for name in option.unset_args:
        new_args[_pick_name(name, args)] = None
    new_env.update(option.set_env)
    new_env.update({name: None for name in option.unset_env})
    for name, pattern in option.set_args_from_message.items():
        found = re.search(pattern, message, re.MULTILINE)
        if found is None:
            return None
        new_args[_pick_name(name, args)] = _typed(found.group(1))
    if option.rename_arg is not None:
        renamed = _rename(option.rename_arg, message, args)
        if renamed is None:
            return None
        new_args.update(renamed)
    if option.step_arg is not None:
        stepped = _step(option.step_arg, message, args)
        if stepped is None:
            return None
        new_args[option.step_arg.arg] = stepped
    change = Change(args=new_args, env=new_env)
    return Change(args=new_args, env=new_env, reason=describe(change, args, env))


def _pick_name(name: str, args: dict[str, Any]) -> str:
    """`a|b`: the alternative the profile already uses (a flag renamed across versions), else the first."""
    names = name.split("|")
    return next((n for n in names if n in args), names[0])


def _without_noops(change: Change, args: dict[str, Any], env: dict[str, str]) -> Change:
    new_args = {
        k: v for k, v in change.args.items() if (v is None and k in args) or (v is not None and not _same(args.get(k), v))
    }
    new_env = {k: v for k, v in change.env.items() if env.get(k) != v and not (v is None and k not in env)}
    return Change(args=new_args, env=new_env, reason=describe(Change(new_args, new_env), args, env))


def _same(old: Any, new: Any) -> bool:
    if old is None or new is None:
        return old is new
    if isinstance(old, bool) or isinstance(new, bool):
        return old is new
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return math.isclose(float(old), float(new), rel_tol=0, abs_tol=1e-9)
    return str(old) == str(new)


def describe(change: Change, args: dict[str, Any], env: dict[str, str]) -> str:
    """`flag: old -> new; NAME=value` in one line."""
    parts = []
    for name, value in change.args.items():
        old = args.get(name, "(engine default)")
        parts.append(f"{name}: {old} -> {'(removed)' if value is None else value}")
    for name, text in change.env.items():
        parts.append(f"unset {name}" if text is None else f"{name}={text}")
    return "; ".join(parts)


def _typed(text: str) -> Any:
    """A value read from a message, as the type YAML would give it."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _step(step: StepSpec, message: str, args: dict[str, Any]) -> float | int | None:
    current = _current(step, message, args)
    preferred = _candidates(step.prefer_from_message, message) if step.prefer_from_message else []
    if step.prefer_ratio_from_message:
        preferred += _ratios(step, message)
    for candidate in preferred:
        if _forward(step, current, candidate) and _in_bounds(step, candidate):
            return _rounded(step, candidate)
    nxt = current + step.by if step.by is not None else current * (step.factor or 1.0)
    nxt = _rounded(step, nxt)
    if step.min is not None and nxt < step.min:
        nxt = step.min if current > step.min else nxt
    if step.max is not None and nxt > step.max:
        nxt = step.max if current < step.max else nxt
    nxt = _rounded(step, nxt)
    if not _in_bounds(step, nxt) or not _forward(step, current, nxt):
        return None
    return nxt


def _current(step: StepSpec, message: str, args: dict[str, Any]) -> float:
    value = args.get(step.arg)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if step.current_from_message:
        found = _candidates(step.current_from_message, message)
        if found:
            return found[0]
    return step.default


def _candidates(pattern: str, message: str) -> list[float]:
    out: list[float] = []
    for match in re.finditer(pattern, message, re.MULTILINE):
        for group in match.groups():
            try:
                out.append(float(group))
            except (TypeError, ValueError):
                continue
    return out


def _ratios(step: StepSpec, message: str) -> list[float]:
    """group 1 / group 2 - margin, rounded down to the step's digits (a fraction that must not be exceeded)."""
    out: list[float] = []
    for match in re.finditer(step.prefer_ratio_from_message or "", message, re.MULTILINE):
        try:
            ratio = float(match.group(1)) / float(match.group(2)) - step.ratio_margin
        except (IndexError, TypeError, ValueError, ZeroDivisionError):
            continue
        out.append(math.floor(ratio * 10 ** step.digits) / 10 ** step.digits)
    return out


def _forward(step: StepSpec, current: float, candidate: float) -> bool:
    return candidate > current + 1e-9 if step.upward else candidate < current - 1e-9


def _in_bounds(step: StepSpec, value: float) -> bool:
    low_ok = step.min is None or value >= step.min - 1e-9
    high_ok = step.max is None or value <= step.max + 1e-9
    return low_ok and high_ok


def _rounded(step: StepSpec, value: float) -> float | int:
    if step.integer:
        return int(math.floor(value)) if not step.upward else int(math.ceil(value))
    return round(value, step.digits)


def _rename(spec: RenameSpec, message: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """{old: None, new: value}; the value is the profile's, else the one the message shows."""
    old, new, value = spec.from_, spec.to, None
    if spec.from_message:
        found = re.search(spec.from_message, message, re.MULTILINE)
        if found is None:
            return None
        old = found.group(1).lstrip("-").replace("-", "_")
        if found.lastindex and found.lastindex >= 2 and found.group(2):
            value = _typed(found.group(2))
    if old is None:
        return None
    new = new or known_renames().get(old)
    if new is None:
        return None
    if old in args:
        value = args[old]
    if value is None:
        return None
    return {old: None, new: value}


@lru_cache(maxsize=4)
def known_renames(kind: str = "sglang") -> dict[str, str]:
    """Old flag name -> new flag name from the engine's renames table (the one preflight reads too)."""
    from deployer.flags import load_renames

    return {r.old.replace("-", "_"): r.new.replace("-", "_") for r in load_renames(engine=kind)
            if r.kind in ("flag", "arg") and r.new}


def did_you_mean(flag: str, known_flags: Iterable[str], kind: str = "sglang") -> list[str]:
    """Likely intended names for a flag the engine rejected: its rename, else close spellings."""
    name = flag.lstrip("-").replace("-", "_")
    renamed = known_renames(kind).get(name)
    if renamed:
        return [renamed]
    known = [k.lstrip("-").replace("-", "_") for k in known_flags]
    return difflib.get_close_matches(name, known, n=3, cutoff=0.7)
