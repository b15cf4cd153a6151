"""What changes for one profile between two releases of its engine, each change with its source. Pure.

Flags: kept, renamed with the value carried (a renames.yaml row), dropped loudly (a documented removal), written out
in full (a prefix argparse would take silently), or refused (the new release's flag table has no such flag and no
table knows why: never dropped). Environment: renamed or retired (renames.yaml). Values: the engine's own dry
resolution on both releases side by side. Follow-on checks (followons.yaml): those only the new release has, and
what they need of these args. Memory: the engine's memory plan on both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from deployer.engines.base import Knowledge
from deployer.engines.followons import FollowOn, load_followons
from deployer.engines.renames import Rename
from deployer.flag_names import key_option, option_key
from deployer.preflight.flags import FlagSet
from deployer.versions import at_least, version_in

# resolved values that differ on every run or name the model: never a change of the release
NOISE = frozenset({"random_seed", "served_model_name", "tokenizer_path", "model_path"})


@dataclass(frozen=True)
class Side:
    """What one release makes of the profile: its flag table, the args it is given, its dry resolution (and each
    value it changed, with the resolution step that did), its memory plan's rows, the problems preflight found."""

    version: str | None
    flags: FlagSet | None
    args: dict[str, Any]
    resolution: str = "not run"
    resolved: dict[str, Any] | None = None
    changes: tuple[dict[str, Any], ...] = ()
    memory: tuple[tuple[str, str], ...] = ()
    problems: tuple[str, ...] = ()

    def step_of(self, name: str) -> str | None:
        """The resolution step that set `name` (the engine's own name for it), None when it kept the value."""
        return next((str(c.get("source")) for c in self.changes if c.get("name") == name), None)


@dataclass(frozen=True)
class Change:
    """One thing the upgrade changes or finds: `what` it is, for which flag/env/value/check, before and after, and
    where that is known from."""

    what: str        # renamed | removed | respelt | refused | env renamed | env retired | resolves | check | memory
    name: str
    before: Any
    after: Any
    source: str
    loud: bool = False   # a flag or env var the saved profile loses

    def line(self) -> str:
        head = {"renamed": f"{key_option(self.name)} -> {key_option(str(self.after))} (value {_show(self.before)} "
                           "carried)",
                "removed": f"DROPPED {key_option(self.name)} {_show(self.before)}: removed by the new release",
                "respelt": f"{key_option(self.name)} written as {key_option(str(self.after))}",
                "refused": f"REFUSED {key_option(self.name)} {_show(self.before)}: {self.after}",
                "env renamed": f"env {self.name} -> {self.after} (value carried)",
                "env retired": f"DROPPED env {self.name}={_show(self.before)}: the new release does not read it",
                "resolves": f"{self.name}: {_show(self.before)} -> {_show(self.after)}",
                "check": f"{self.name}: {self.after}"}.get(self.what, f"{self.name}: {self.before} -> {self.after}")
        return f"{head}  [{self.source}]"

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "name": self.name, "before": _plain(self.before), "after": _plain(self.after),
                "source": self.source, "loud": self.loud}


@dataclass
class Comparison:
    """The upgrade of one profile: both sides, every change, and the args/env the upgraded profile gets."""

    kind: str
    old: Side
    new: Side
    args: dict[str, Any]
    env: dict[str, str]
    changes: list[Change] = field(default_factory=list)

    @property
    def refused(self) -> list[Change]:
        return [c for c in self.changes if c.what == "refused"]

    def of(self, what: str) -> list[Change]:
        return [c for c in self.changes if c.what == what]

    def reasons(self) -> list[str]:
        """One short phrase per change the saved profile carries (its header)."""
        out = []
        for c in self.changes:
            if c.what in ("renamed", "respelt", "env renamed"):
                out.append(f"{c.name} -> {c.after}")
            elif c.what in ("removed", "env retired"):
                out.append(f"{c.name} dropped")
            elif c.what == "check" and c.after and str(c.after).startswith("also set"):
                out.append(f"{c.name}: {c.after}")
        return out


ABSENT = "\x00absent"   # a value one release's resolution does not have at all (shown `absent`)


def _show(value: Any) -> str:
    if value is ABSENT:
        return "absent"
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".")
    text = "unset" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(value: Any) -> Any:
    return "absent" if value is ABSENT else value


# --- flags and env --------------------------------------------------------------------------------------------------


def flag_changes(kind: str, args: dict[str, Any], old: str | None, new: str, fs: FlagSet | None,
                 renames: list[Rename]) -> tuple[dict[str, Any], list[Change]]:
    """The args for release `new` (flag table `fs`; None: the renames table alone) and what changed, in the
    profile's order."""
    out: dict[str, Any] = {}
    changes: list[Change] = []
    for key, value in args.items():
        change = _flag_change(kind, key, value, old, new, fs, renames)
        if change is None:
            out[key] = value
            continue
        changes.append(change)
        if change.what in ("renamed", "respelt"):
            out[str(change.after)] = value
        elif change.what == "refused":
            out[key] = value      # stays: the upgrade is refused, never saved without it
    return out, changes


def _flag_change(kind: str, key: str, value: Any, old: str | None, new: str, fs: FlagSet | None,
                 renames: list[Rename]) -> Change | None:
    flag = fs.lookup(key) if fs is not None else None
    row = next((r for r in renames if r.kind == "arg" and r.old == key), None)
    if flag is not None and not (flag.deprecated and row is not None and row.new and fs is not None
                                 and fs.has(row.new)):
        return None
    if row is not None and row.new and (fs.has(row.new) if fs is not None else at_least(new, row.since)):
        return Change("renamed", key, value, row.new, _row_source(kind, row))
    if row is not None and row.new is None and at_least(new, row.removed or row.since):
        return Change("removed", key, value, None, _row_source(kind, row), loud=True)
    if fs is None:
        return None       # no flag table: only the tables speak
    return _unknown(kind, key, value, fs)


def _unknown(kind: str, key: str, value: Any, fs: FlagSet) -> Change:
    where = f"{kind} {fs.version}'s flag table"
    matches = fs.prefix_matches(key)
    if len(matches) == 1:
        return Change("respelt", key, value, option_key(matches[0]),
                      f"{where}: argparse takes {key_option(key)} as a prefix of {matches[0]}")
    if len(matches) > 1:
        return Change("refused", key, value, f"ambiguous in {kind} {fs.version} (could be {', '.join(matches[:4])}); "
                      "no renames.yaml row says which", where)
    return Change("refused", key, value, f"{kind} {fs.version} has no such flag, and neither renames.yaml nor a "
                  "documented removal says what became of it", where)


def _row_source(kind: str, row: Rename) -> str:
    gone = f", old name rejected from {row.removed}" if row.removed else ""
    return f"{kind} renames.yaml: {row.old} -> {row.new or 'removed'} since {row.since}{gone}; {row.source}"


def env_changes(kind: str, env: dict[str, str], old: str | None, new: str, renames: list[Rename],
                secret: frozenset[str]) -> tuple[dict[str, str], list[Change]]:
    """The environment for release `new` and what changed: renamed (value carried) or retired (dropped, loudly)
    by a renames.yaml row the old release was before and the new one is at or after."""
    out: dict[str, str] = {}
    changes: list[Change] = []
    for name, value in env.items():
        row = next((r for r in renames if r.kind == "env" and r.old == name), None)
        crossed = row is not None and at_least(new, row.since) and (old is None or not at_least(old, row.since))
        if row is None or not crossed:
            out[name] = value
            continue
        shown = "***" if name in secret else value
        if row.new is None:
            changes.append(Change("env retired", name, shown, None, _row_source(kind, row), loud=True))
        else:
            out[row.new] = value
            changes.append(Change("env renamed", name, shown, row.new, _row_source(kind, row)))
    return out, changes


# --- values the engine resolves -------------------------------------------------------------------------------------


def resolution_changes(old: Side, new: Side, renames: list[Rename]) -> list[Change]:
    """The values both dry resolutions have for these args that differ: every flag the profile sets and every value
    either release's resolution changed (old names read through the renames table)."""
    if old.resolved is None or new.resolved is None:
        return []
    to_new = {r.old: r.new for r in renames if r.kind == "arg" and r.new}
    to_old = {n: o for o, n in to_new.items()}
    names = [*new.args, *(to_new.get(str(c["name"]), str(c["name"])) for c in old.changes),
             *(str(c["name"]) for c in new.changes)]
    out = []
    for name in dict.fromkeys(names):
        if name.startswith("_") or name in NOISE:
            continue
        old_name = to_old.get(name, name) if name not in old.resolved else name
        before, after = old.resolved.get(old_name, ABSENT), new.resolved.get(name, ABSENT)
        if _same(before, after):
            continue
        steps = (f"{old.version}: {old.step_of(old_name) or 'as given / default'}; "
                 f"{new.version}: {new.step_of(name) or 'as given / default'}")
        out.append(Change("resolves", name, before, after, f"dry resolution on both releases ({steps})"))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return round(float(a), 6) == round(float(b), 6)
        except (TypeError, ValueError):
            return False
    return bool(a == b)


# --- follow-on checks -----------------------------------------------------------------------------------------------


def followon_changes(knowledge: Knowledge, old: str | None, new: str, args: dict[str, Any],
                     resolved: dict[str, Any] | None) -> tuple[dict[str, Any], list[Change]]:
    """The follow-on checks only the new release has that these args touch: each that applies and fails is fixed
    (its `fix` set, said), each that applies and passes is said; the checks the old release had that the new one
    does not are said too. Returns the args with the fixes and the changes."""
    fixed = dict(args)
    out: list[Change] = []

    def value(name: str) -> Any:
        for spelling in name.split("|"):
            if spelling in fixed:
                return fixed[spelling]
        return next((v for v in ((resolved or {}).get(s) for s in name.split("|")) if v is not None), None)

    for check in load_followons(knowledge):
        in_new, in_old = version_in(new, check.versions), old is not None and version_in(old, check.versions)
        if in_new and not in_old:
            _new_check(check, value, fixed, out)
        elif in_old and not in_new and _touches(check, args):
            out.append(Change("check", check.id, None, f"gone in {new} (held for {check.versions}): "
                              f"{check.text!r}", check.source))
    return fixed, out


def _new_check(check: FollowOn, value: Any, fixed: dict[str, Any], out: list[Change]) -> None:
    if not _holds(check.when, value):
        if _touches(check, fixed):
            out.append(Change("check", check.id, None, f"new in this release, not triggered by these args "
                              f"(when {check.when})", check.source))
        return
    if not _holds(check.violated, value):
        out.append(Change("check", check.id, None, f"new in this release, passes: {check.text!r}", check.source))
        return
    for name, fix in check.fix.items():
        if fix is None:
            fixed.pop(name, None)
        else:
            fixed[name] = fix
    fixes = ", ".join(f"{k}={v}" for k, v in check.fix.items())
    out.append(Change("check", check.id, None, f"also set {fixes}: new in this release, these args fail it: "
                      f"{check.text!r}", check.source))


def _touches(check: FollowOn, args: dict[str, Any]) -> bool:
    return any(s in args for name in (*check.when, *check.violated) for s in name.split("|"))


def _holds(conditions: dict[str, Any], value: Any) -> bool:
    for name, want in conditions.items():
        have = value(name)
        if isinstance(want, dict) and ("in" in want or "not_in" in want):
            if ("in" in want and have not in want["in"]) or ("not_in" in want and have in want["not_in"]):
                return False
        elif have != want:
            return False
    return True


# --- memory ---------------------------------------------------------------------------------------------------------


def memory_rows(old: Side, new: Side) -> list[tuple[str, str, str]]:
    """The memory plan's rows on both releases, by row name (the new release's order, then rows only the old has)."""
    before, after = dict(old.memory), dict(new.memory)
    names = list(dict.fromkeys([*after, *before]))
    return [(name, before.get(name, "-"), after.get(name, "-")) for name in names]


def compare(kind: str, old: Side, new: Side, env: dict[str, str], renames: list[Rename], knowledge: Knowledge,
            secret_env: frozenset[str] = frozenset()) -> Comparison:
    """Everything that changes for this profile (old.args: as the user wrote them) from old.version to
    new.version; the new side's resolution is of the upgraded args."""
    assert new.version is not None
    args, flags = flag_changes(kind, old.args, old.version, new.version, new.flags, renames)
    new_env, envs = env_changes(kind, env, old.version, new.version, renames, secret_env)
    args, checks = followon_changes(knowledge, old.version, new.version, args, new.resolved)
    result = Comparison(kind, old, new, args, new_env, [*flags, *envs, *checks])
    result.changes += resolution_changes(old, new, renames)
    return result
