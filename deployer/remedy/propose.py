"""Remedies: turn a signature's remedy data (`RemedySpec`) into one concrete `Change` for a profile.

A remedy is a list of options tried in order; the first option that yields a change which is neither a
no-op for this profile nor already in `tried` wins. An option combines fixed edits (set/unset args and
env), a rename of a flag, the unrecognized flags of an argparse error (renamed, removed or respelt),
values read from the engine's message, and a numeric step within bounds. A flag that is neither a documented
rename nor a documented removal is never dropped: respelt when exactly one flag is close, else not touched. An option whose suggestion the
message's own numbers rule out (`skip_if`) is passed over.

Numeric steps start from the engine's effective value (`deployer.remedy.effective`): the message's value, the
attempt's args dump, preflight's dry resolution, the profile, and only then the documented default;
the change's reason says which ("engine resolved 0.771"). A change says everything it changes: a removed
flag maps to None, a rename is that removal plus the new name with the value carried over.
Pure: no I/O apart from reading the engine's renames table once.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deployer.engines.base import Engine
from deployer.engines.renames import load_renames
from deployer.flag_names import option_key
from deployer.profile.model import Profile
from deployer.remedy.effective import DEFAULT, MESSAGE, PROFILE, EngineValues, Known
from deployer.engines.followons import complete
from deployer.versions import at_least, version_in


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
    exceed_from_message: str | None = Field(
        default=None, description="regex; a value the result must be strictly above: it becomes that value + by")
    shortfall_from_message: str | None = Field(
        default=None, description="regex with groups need/need_unit, free/free_unit, total/total_unit (a CUDA OOM): "
        "a lowering frees at least (need - free) / total plus `margin`")
    margin: float = 0.01
    prefer_ratio_from_message: str | None = Field(
        default=None, description="regex with two groups: candidate = group 1 / group 2 - ratio_margin (e.g. free/total)")
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


class Comparison(_Data):
    """`left op right` over two numbers read from the message (each regex's first group, times its scale)."""

    left: str
    op: str = Field(pattern=r"^(<|<=|>|>=)$")
    right: str
    left_scale: float = 1.0
    right_scale: float = 1.0
    why: str = ""

    def holds(self, message: str) -> bool | None:
        """None when either number is missing from the message."""
        a, b = _candidates(self.left, message), _candidates(self.right, message)
        if not a or not b:
            return None
        x, y = a[0] * self.left_scale, b[0] * self.right_scale
        return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[self.op]


class RemedyOption(_Data):
    skip_if: list[Comparison] = Field(default_factory=list, description="the message's numbers rule this out")
    fix_unknown_flags: str | None = Field(
        default=None, description="regex; group 1 = argparse's unrecognized arguments: each flag is renamed "
        "(renames table), removed (a documented removal), or respelt (the one close flag of the usage text in the "
        "log); anything else is refused (the option does not apply)")
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


class Diagnosed(Protocol):
    """What a remedy needs from a diagnosis (`deployer.diagnose.Diagnosis`, which shows a remedy's preview
    and so sits above this module)."""

    @property
    def remedy(self) -> RemedySpec | None: ...

    @property
    def engine_version(self) -> str | None: ...

    def message_text(self) -> str: ...

    def engine_values(self, profile_args: dict[str, Any] | None = None) -> EngineValues: ...


@dataclass(frozen=True)
class Change:
    """One concrete patch of a profile: args/env to set (None = remove) and why.

    basis: for each moved number, the value it started from and its source ("engine resolved 0.771").
    passed: flags the engine's message shows were given, so their removal is real even when the profile
    does not name them (a flag from the template, a log diagnosed without its profile).
    """

    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str | None] = field(default_factory=dict)
    reason: str = ""
    basis: dict[str, str] = field(default_factory=dict)
    passed: frozenset[str] = frozenset()

    def key(self) -> str:
        return json.dumps({"args": self.args, "env": self.env}, sort_keys=True, default=str)

    def to_json(self) -> dict[str, Any]:
        return {"args": dict(self.args), "env": dict(self.env), "reason": self.reason, "basis": dict(self.basis)}

    def is_empty(self) -> bool:
        return not self.args and not self.env


def propose(diagnosis: Diagnosed, profile: Profile, tried: list[Change],
            values: EngineValues | None = None) -> Change | None:
    """The change the diagnosis' remedy makes to this profile, or None when nothing new applies.

    values: the engine's effective values for the failed attempt (its dump, the dry resolution); without
    them, the dump found in the diagnosed log, if any, and the profile.
    """
    if diagnosis.remedy is None:
        return None
    if values is None:
        values = diagnosis.engine_values(dict(profile.engine.args))
    return resolve(
        diagnosis.remedy,
        diagnosis.message_text(),
        args=dict(profile.engine.args),
        env=dict(profile.engine.env),
        tried=tried,
        values=values,
        version=diagnosis.engine_version,
        engine=profile.engine.definition,
    )


def resolve(
    spec: RemedySpec,
    message: str,
    *,
    args: dict[str, Any],
    env: dict[str, str],
    tried: list[Change] | None = None,
    values: EngineValues | None = None,
    version: str | None = None,
    engine: Engine,
) -> Change | None:
    """First option whose change is real (not a no-op), new (not in `tried`), not ruled out by the message,
    and complete: what the engine's next startup check needs is added (`deployer.engines.followons`)."""
    seen = {c.key() for c in tried or []}
    values = values if values is not None else EngineValues().then(PROFILE, args)
    for option in spec.options:
        if any(c.holds(message) for c in option.skip_if):
            continue
        change = _option_change(option, message, args, env, values, version, engine)
        if change is None:
            continue
        change = _completed(change, args, env, values, version, engine)
        if change is None:
            continue
        change = _without_noops(change, args, env, values)
        if not change.is_empty() and change.key() not in seen:
            return change
    return None


def _option_change(option: RemedyOption, message: str, args: dict[str, Any], env: dict[str, str],
                   values: EngineValues, version: str | None, engine: Engine) -> Change | None:
    new_args: dict[str, Any] = {}
    new_env: dict[str, str | None] = {}
    basis: dict[str, str] = {}
    passed: set[str] = set()
    notes: list[str] = []
    for name, value in option.set_args.items():
        new_args[_pick_name(name, args, values, version, engine)] = value
    for name in option.unset_args:
        new_args[_pick_name(name, args, values, version, engine)] = None
    new_env.update(option.set_env)
    new_env.update({name: None for name in option.unset_env})
    for name, pattern in option.set_args_from_message.items():
        found = re.search(pattern, message, re.MULTILINE)
        if found is None:
            return None
        new_args[_pick_name(name, args, values, version, engine)] = _typed(found.group(1))
    if option.rename_arg is not None:
        renamed = _rename(option.rename_arg, message, args, engine)
        if renamed is None:
            return None
        new_args.update(renamed)
        passed.update(k for k, v in renamed.items() if v is None)
    if option.fix_unknown_flags is not None:
        fixed = _fix_unknown_flags(option.fix_unknown_flags, message, args, engine, version)
        if fixed is None:
            return None
        new_args.update(fixed[0])
        passed.update(k for k, v in fixed[0].items() if v is None)
        notes += fixed[1]
    if option.step_arg is not None:
        stepped = _step(option.step_arg, message, values)
        if stepped is None:
            return None
        new_args[option.step_arg.arg], start = stepped
        basis[option.step_arg.arg] = start.describe()
    change = Change(args=new_args, env=new_env, basis=basis, passed=frozenset(passed))
    return dataclasses.replace(change, reason=_reason(change, args, env, values, notes))


def _completed(change: Change, args: dict[str, Any], env: dict[str, str], values: EngineValues,
               version: str | None, engine: Engine) -> Change | None:
    """The change plus what the next known startup check needs; None when that would undo the change."""
    def lookup(name: str) -> Any:
        known = values.lookup(name)
        return None if known is None else known.value

    done = complete(change.args, lookup, version, engine.knowledge)
    if done is None:
        return None
    more_args, more_env, notes = done
    if not more_args and not more_env:
        return change
    merged = dataclasses.replace(change, args={**change.args, **more_args}, env={**change.env, **more_env})
    old_notes = change.reason.split(" | ")[1:]
    return dataclasses.replace(merged, reason=_reason(merged, args, env, values, [*old_notes, *notes]))


def _pick_name(name: str, args: dict[str, Any], values: EngineValues | None,
               version: str | None, engine: Engine) -> str:
    """`a|b`: the alternative the profile already uses (a flag renamed across versions), else the one the
    engine reported (its dump names its own spelling), else the one the engine version has, else the first."""
    names = name.split("|")
    known = next((n for n in names if n in args), None)
    if known is None and values is not None:
        known = next((n for n in names if values.lookup(n) is not None), None)
    if known is None and version is not None:
        older = {old: new for old, (new, since) in rename_history(engine).items()
                 if not version_in(version, f">={since}")}
        known = next((old for old, new in older.items() if old in names and new in names), None)
    return known or names[0]


def _without_noops(change: Change, args: dict[str, Any], env: dict[str, str], values: EngineValues) -> Change:
    """Drop what would not change anything: a value the profile or the engine already has, an absent removal."""
    new_args = {k: v for k, v in change.args.items()
                if (v is None and (k in args or k in change.passed)) or (v is not None and not _has(k, v, args, values))}
    new_env = {k: v for k, v in change.env.items() if env.get(k) != v and not (v is None and k not in env)}
    kept = Change(new_args, new_env, basis={k: b for k, b in change.basis.items() if k in new_args},
                  passed=change.passed)
    notes = [n for n in change.reason.split(" | ")[1:]]
    return dataclasses.replace(kept, reason=_reason(kept, args, env, values, notes))


def _has(name: str, value: Any, args: dict[str, Any], values: EngineValues) -> bool:
    if name in args:
        return _same(args[name], value)
    known = values.lookup(name)
    return known is not None and _same(known.value, value)


def _same(old: Any, new: Any) -> bool:
    if old is None or new is None:
        return old is new
    if isinstance(old, bool) or isinstance(new, bool):
        return old is new
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return math.isclose(float(old), float(new), rel_tol=0, abs_tol=1e-9)
    return str(old) == str(new)


def describe(change: Change, args: dict[str, Any], env: dict[str, str], values: EngineValues | None = None) -> str:
    """`flag: old -> new; NAME=value` in one line; a moved number says where it started ("engine resolved 0.771")."""
    parts = []
    for name, value in change.args.items():
        parts.append(f"{name}: {_old(name, change, args, values)} -> {'(removed)' if value is None else value}")
    for name, text in change.env.items():
        parts.append(f"unset {name}" if text is None else f"{name}={text}")
    return "; ".join(parts)


def _old(name: str, change: Change, args: dict[str, Any], values: EngineValues | None) -> str:
    if name in change.basis:
        return change.basis[name]
    if name in args:
        return str(args[name])
    known = values.lookup(name) if values is not None else None
    if known is not None:
        return known.describe()
    return "(given)" if name in change.passed else "(engine default)"


def _reason(change: Change, args: dict[str, Any], env: dict[str, str], values: EngineValues,
            notes: list[str]) -> str:
    return " | ".join([describe(change, args, env, values), *notes])


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


def _step(step: StepSpec, message: str, values: EngineValues) -> tuple[float | int, Known] | None:
    """The next value and the effective value it moves from; None when none is forward and in bounds."""
    start = _current(step, message, values)
    current = float(start.value)
    preferred = _candidates(step.prefer_from_message, message) if step.prefer_from_message else []
    if step.prefer_ratio_from_message:
        preferred += _ratios(step, message)
    for candidate in preferred:
        if _forward(step, current, candidate) and _in_bounds(step, candidate):
            return _rounded(step, candidate), start
    nxt = _rounded(step, _next_value(step, message, current))
    if step.min is not None and nxt < step.min:
        nxt = step.min if current > step.min else nxt
    if step.max is not None and nxt > step.max:
        nxt = step.max if current < step.max else nxt
    nxt = _rounded(step, nxt)
    if not _in_bounds(step, nxt) or not _forward(step, current, nxt):
        return None
    return nxt, start


def _next_value(step: StepSpec, message: str, current: float) -> float:
    """One step from `current`; a threshold or a shortfall in the message can make the step larger."""
    nxt = current + step.by if step.by is not None else current * (step.factor or 1.0)
    if step.exceed_from_message and step.upward:
        above = _candidates(step.exceed_from_message, message)
        if above:
            nxt = max(nxt, above[0] + abs(step.by or 0.0) if step.by is not None else above[0] * (step.factor or 1))
    if step.shortfall_from_message and not step.upward:
        short = _shortfall(step.shortfall_from_message, message)
        if short is not None:
            nxt = min(nxt, current - math.ceil((short + step.margin) * 100) / 100)
    return nxt


_UNITS = {"b": 1.0 / (1 << 30), "kib": 1.0 / (1 << 20), "mib": 1.0 / 1024, "gib": 1.0, "tib": 1024.0,
          "kb": 1e3 / (1 << 30), "mb": 1e6 / (1 << 30), "gb": 1e9 / (1 << 30)}


def _shortfall(pattern: str, message: str) -> float | None:
    """(need - free) / total from a CUDA OOM message: the fraction of the GPU that was missing."""
    found = re.search(pattern, message, re.MULTILINE)
    if found is None:
        return None
    try:
        need, free, total = (float(found.group(n)) * _UNITS[found.group(n + "_unit").lower()]
                             for n in ("need", "free", "total"))
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return max(0.0, need - free) / total if total > 0 else None


def _current(step: StepSpec, message: str, values: EngineValues) -> Known:
    """The value the engine used: its message, its dump, the dry resolution, the profile, the documented default."""
    if step.current_from_message:
        found = _candidates(step.current_from_message, message)
        if found:
            return Known(found[0], MESSAGE)
    known = values.lookup(step.arg)
    if known is not None:
        number = _number(known.value)
        if number is not None:
            return Known(number, known.source)
    return Known(step.default, DEFAULT)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


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


def _rename(spec: RenameSpec, message: str, args: dict[str, Any], engine: Engine) -> dict[str, Any] | None:
    """{old: None, new: value}; the value is the profile's, else the one the message shows."""
    old, new, value = spec.from_, spec.to, None
    if spec.from_message:
        found = re.search(spec.from_message, message, re.MULTILINE)
        if found is None:
            return None
        old = option_key(found.group(1))
        if found.lastindex and found.lastindex >= 2 and found.group(2):
            value = _typed(found.group(2))
    if old is None:
        return None
    new = new or known_renames(engine).get(old)
    if new is None:
        return None
    if old in args:
        value = args[old]
    if value is None:
        return None
    return {old: None, new: value}


def _fix_unknown_flags(pattern: str, message: str, args: dict[str, Any], engine: Engine,
                       version: str | None) -> tuple[dict[str, Any], list[str]] | None:
    """Each flag argparse did not recognize: renamed (the engine's table), removed (a documented removal for this
    version), respelt (the one close spelling among the flags the usage text lists), loudly. A flag none of these
    fits is never dropped: the whole option does not apply (None), and `refused_flags` says why."""
    found = re.search(pattern, message, re.MULTILINE)
    if found is None:
        return None
    known = usage_flags(message)
    out: dict[str, Any] = {}
    notes: list[str] = []
    for flag, value in _flag_tokens(found.group(1).split()):
        old = flag.lstrip("-").replace("-", "_")
        carried = args.get(old, value if value is not None else True)
        new = known_renames(engine).get(old)
        if new is not None and known and new not in known:
            new = None
        if new is None and known:  # a newer name on an older engine: its old name
            new = next((o for o, n in known_renames(engine).items() if n == old and o in known), None)
        if new is None and (removal := documented_removal(engine, old, version)) is not None:
            out[old] = None
            notes.append(f"dropped {flag}: {removal}")
            continue
        if new is None and known:
            new = respelling(old, known)[0]
            if new is not None:
                notes.append(f"{flag} is not a flag of this engine; did you mean --{new.replace('_', '-')}? "
                             "respelt (the one close flag)")
        if new is None:
            return None
        out[old] = None
        out[new] = carried
    return out, notes


def refused_flags(pattern: str, message: str, engine: Engine, version: str | None) -> list[str]:
    """The flags of argparse's `unrecognized arguments` that no remedy may touch (no rename, no documented
    removal, not exactly one close spelling), one line each naming the closest flags of the usage text."""
    found = re.search(pattern, message, re.MULTILINE)
    if found is None:
        return []
    known = usage_flags(message)
    out = []
    for flag, _ in _flag_tokens(found.group(1).split()):
        old = flag.lstrip("-").replace("-", "_")
        if old in known_renames(engine) or old in known_renames(engine).values() or \
                documented_removal(engine, old, version) is not None:
            continue
        respelt, closest = respelling(old, known)
        if respelt is None:
            out.append(refusal_line(flag, closest, f"{engine.kind} {version}" if version else engine.kind))
    return out


RESPELL_CUTOFF = 0.8   # difflib ratio: a typo (mem_fraction_statc, context_lenght), not merely a similar flag
CLOSEST_CUTOFF = 0.6


def respelling(key: str, known: Iterable[str]) -> tuple[str | None, list[str]]:
    """(the one close flag `key` is a typo of, or None when none or several are close; the closest flags, best
    first, for the message). Keys are profile keys (snake_case)."""
    names = sorted({option_key(k) for k in known})
    close = difflib.get_close_matches(key, names, n=2, cutoff=RESPELL_CUTOFF)
    closest = difflib.get_close_matches(key, names, n=3, cutoff=CLOSEST_CUTOFF)
    return (close[0] if len(close) == 1 else None), closest


def refusal_line(flag: str, closest: list[str], engine: str) -> str:
    """One line: the flag, the closest flags the engine has, and why nothing was done to it."""
    near = f"closest: {', '.join('--' + c.replace('_', '-') for c in closest)}" if closest else \
        "no flag of it is close"
    if len(closest) == 1:
        near = f"did you mean --{closest[0].replace('_', '-')}? it is not close enough to respell"
    return (f"unknown flag {flag} for {engine} ({near}); refused: deployer never drops a flag that is neither a "
            "documented rename nor a documented removal")


def documented_removal(engine: Engine, key: str, version: str | None) -> str | None:
    """Why `key` may be dropped for `version`: the engine's renames table retires it (`new: null`) in or before
    that version; None when it does not (or the version is unknown)."""
    if version is None:
        return None
    for r in load_renames(engine.knowledge):
        if r.kind in ("flag", "arg") and r.new is None and option_key(r.old) == key and \
                at_least(version, r.removed or r.since):
            return (f"removed in {engine.kind} {r.removed or r.since} ({r.source}), a documented removal; {version} "
                    "has no such flag")
    return None


def _flag_tokens(tokens: list[str]) -> list[tuple[str, Any]]:
    """argparse's `unrecognized arguments:` list -> (flag, value or None) pairs (`--a 1 --b --c=x`)."""
    pairs: list[tuple[str, Any]] = []
    for token in tokens:
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            pairs.append((flag, _typed(value) if eq else None))
        elif pairs and pairs[-1][1] is None:
            pairs[-1] = (pairs[-1][0], _typed(token))
    return pairs


_USAGE_FLAG_RE = re.compile(r"\[?(--[a-z0-9][a-z0-9-]*)")


def usage_flags(message: str) -> set[str]:
    """The flags argparse's usage text (printed with its error) lists, as profile keys."""
    start = message.find("usage: ")
    if start < 0:
        return set()
    end = message.find("error: ", start)
    block = message[start: end if end >= 0 else len(message)]
    return {m.lstrip("-").replace("-", "_") for m in _USAGE_FLAG_RE.findall(block)} - {"h", "help"}


@lru_cache(maxsize=4)
def rename_history(engine: Engine) -> dict[str, tuple[str, str]]:
    """Old flag name -> (new name, first release with the new name), from the engine's renames table."""
    return {r.old.replace("-", "_"): (r.new.replace("-", "_"), r.since) for r in load_renames(engine.knowledge)
            if r.kind in ("flag", "arg") and r.new}


@lru_cache(maxsize=4)
def known_renames(engine: Engine) -> dict[str, str]:
    """Old flag name -> new flag name from the engine's renames table (the one preflight reads too)."""
    return {option_key(r.old): option_key(r.new) for r in load_renames(engine.knowledge)
            if r.kind in ("flag", "arg") and r.new}


def did_you_mean(flag: str, known_flags: Iterable[str], engine: Engine) -> list[str]:
    """Likely intended names for a flag the engine rejected: its rename, else close spellings."""
    name = option_key(flag)
    renamed = known_renames(engine).get(name)
    if renamed:
        return [renamed]
    known = [option_key(k) for k in known_flags]
    return difflib.get_close_matches(name, known, n=3, cutoff=0.7)
