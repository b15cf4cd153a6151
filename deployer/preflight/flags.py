"""Engine flags checked against the flag set of the engine version installed on the target.

The flag set comes from the target's own argument parser (the engine's probe, `Engine.probe`) and is cached
locally per engine version, so only the first preflight against a version pays for introspection.
`check_flags` translates known renames (either direction, by what the target accepts), catches
unknown flags ("did you mean"), bad choices, value/no-value mistakes and argparse's silent prefix
matching, and warns about environment variables the installed version no longer reads.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from deployer.engines.renames import Rename, load_renames
from deployer.flag_names import key_option, option_key
from deployer.profile.model import Profile
from deployer.remedy.propose import refusal_line, respelling
from deployer.versions import at_least, version_key

PROBE_MARKER = "DEPLOYER_PROBE_JSON "
PROBE_SCHEMA = 1


@dataclass(frozen=True)
class Flag:
    """One option of the engine's argument parser."""

    options: tuple[str, ...]
    dest: str
    nargs: str | int | None = None
    choices: tuple[str, ...] | None = None
    takes_value: bool = True
    deprecated: bool = False

    @property
    def key(self) -> str:
        """The profile key that renders to this flag's first long option (`--mem-fraction-static`)."""
        longs = [o for o in self.options if o.startswith("--")]
        return option_key(longs[0] if longs else self.options[0])


@dataclass(frozen=True)
class FlagSet:
    """Every option one engine version accepts, and the env names its source mentions."""

    engine: str
    version: str
    flags: tuple[Flag, ...]
    env_names: frozenset[str] = frozenset()

    @cached_property
    def by_option(self) -> dict[str, Flag]:
        return {opt: f for f in self.flags for opt in f.options}

    def lookup(self, key: str) -> Flag | None:
        return self.by_option.get(key_option(key))

    def has(self, key: str) -> bool:
        return self.lookup(key) is not None

    def prefix_matches(self, key: str) -> list[str]:
        """Long options argparse would take `key` as an abbreviation of (allow_abbrev)."""
        opt = key_option(key)
        return sorted(o for o in self.by_option if o.startswith("--") and o.startswith(opt) and o != opt)

    def option_keys(self) -> list[str]:
        return sorted({option_key(o) for o in self.by_option if o.startswith("--")})

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": PROBE_SCHEMA,
            "engine": self.engine,
            "version": self.version,
            "flags": [asdict(f) for f in self.flags],
            "env_names": sorted(self.env_names),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, engine: str) -> FlagSet:
        flags = tuple(
            Flag(
                options=tuple(f["options"]),
                dest=str(f["dest"]),
                nargs=f.get("nargs"),
                choices=None if f.get("choices") is None else tuple(str(c) for c in f["choices"]),
                takes_value=bool(f.get("takes_value", True)),
                deprecated=bool(f.get("deprecated", False)),
            )
            for f in data["flags"]
        )
        version = str(data.get("version") or "unknown")
        return cls(engine=str(data.get("engine", engine)), version=version, flags=flags,
                   env_names=frozenset(data.get("env_names", ())))


@dataclass
class FlagReport:
    """The profile translated for the target, and what is wrong or was changed."""

    profile: Profile
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)   # profile key -> its error line (no such flag)
    respelt: dict[str, str] = field(default_factory=dict)   # profile key -> the one close flag it was respelt as
    keyed: dict[str, str] = field(default_factory=dict)     # error or respelling line -> the profile key it is about

    @property
    def ok(self) -> bool:
        return not self.errors


# --- cache -------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """`$DEPLOYER_HOME/cache`, else the platform's user cache dir for deployer."""
    home = os.environ.get("DEPLOYER_HOME")
    if home:
        return Path(home) / "cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir("deployer"))


def _cache_file(cache_dir: Path, engine: str, version: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", version)
    return cache_dir / "flagsets" / f"{engine}-{safe}.json"


def load_cached_flagset(cache_dir: Path, engine: str, version: str) -> FlagSet | None:
    path = _cache_file(cache_dir, engine, version)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("schema") != PROBE_SCHEMA or data.get("version") != version:
        return None
    return FlagSet.from_json(data, engine=engine)


def save_flagset(cache_dir: Path, flagset: FlagSet) -> Path:
    """Write atomically, so a concurrent preflight never reads half a file."""
    path = _cache_file(cache_dir, flagset.engine, flagset.version)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(flagset.to_json()), encoding="utf-8")
    os.replace(tmp, path)
    return path


def cached_versions(cache_dir: Path, engine: str) -> list[str]:
    found = []
    for path in sorted((cache_dir / "flagsets").glob(f"{engine}-*.json")):
        try:
            version = json.loads(path.read_text(encoding="utf-8")).get("version")
        except (OSError, ValueError):
            continue
        if isinstance(version, str):
            found.append(version)
    return found


# --- probe ---------------------------------------------------------------------------------------


def parse_probe_output(stdout: str) -> dict[str, Any] | None:
    """The probe's JSON (last marker line), or None if it printed none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PROBE_MARKER):
            try:
                data = json.loads(line[len(PROBE_MARKER):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


# --- the check -----------------------------------------------------------------------------------


def check_flags(profile: Profile, flagset: FlagSet, renames: list[Rename]) -> FlagReport:
    """Translate and check `profile.engine.args`/`env` against what the target's engine accepts."""
    report = FlagReport(profile=profile)
    args: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    for key, value in profile.engine.args.items():
        new_key = _check_arg(key, value, flagset, renames, report) or key  # a bad flag stays, as an error
        if new_key == _DROPPED:
            continue
        if new_key in args or (new_key != key and new_key in profile.engine.args):
            report.errors.append(f"flag {key_option(new_key)} is given twice (also as {key_option(key)})")
            report.keyed[report.errors[-1]] = key
            continue
        args[new_key] = value
        if new_key != key:
            renamed[key] = new_key
    env = _check_env(profile.engine.env, flagset, renames, report, profile.engine.definition.launch.env_prefixes)
    if args != profile.engine.args or env != profile.engine.env:
        report.profile = _with_engine(profile, args, env, renamed)
    return report


def _with_engine(profile: Profile, args: dict[str, Any], env: dict[str, str], renamed: dict[str, str]) -> Profile:
    """A copy of `profile` with these engine args/env, in this order (argv follows it); a renamed flag stays
    as secret as it was."""
    return profile.with_engine(profile.engine.model_copy(update={"args": args, "env": env}), renamed)


_DROPPED = "\x00dropped"   # _check_arg's answer for a documented removal: the flag is left out


def _check_arg(key: str, value: Any, fs: FlagSet, renames: list[Rename], report: FlagReport) -> str | None:
    """The key to use on the target (maybe translated), _DROPPED for a documented removal, or None when the flag
    cannot be passed (an error says why)."""
    errors = len(report.errors)
    try:
        return _checked_arg(key, value, fs, renames, report)
    finally:
        for line in report.errors[errors:]:
            report.keyed[line] = key


def _checked_arg(key: str, value: Any, fs: FlagSet, renames: list[Rename], report: FlagReport) -> str | None:
    flag = fs.lookup(key)
    if flag is None:
        translated = _translate_arg(key, fs, renames, report)
        if translated is None and _removed(key, fs, renames, report):
            return _DROPPED
        if translated is None:
            translated = _unique_prefix(key, fs, report)
        if translated is None:
            return None
        key = translated
        flag = fs.lookup(key)
        assert flag is not None
    elif flag.deprecated:
        newer = [r.new for r in renames if r.kind == "arg" and r.old == key and r.new and fs.has(r.new)]
        if newer:
            report.warnings.append(
                f"{key_option(key)} is deprecated in {fs.engine} {fs.version}: written as {key_option(newer[0])}")
            key = newer[0]
            flag = fs.lookup(key)
            assert flag is not None
        else:
            report.warnings.append(f"{key_option(key)} is deprecated in {fs.engine} {fs.version}")
    _check_value(key, value, flag, report)
    return key


def _translate_arg(key: str, fs: FlagSet, renames: list[Rename], report: FlagReport) -> str | None:
    for r in renames:
        if r.kind != "arg" or r.new is None:
            continue
        if r.old == key and fs.has(r.new):
            report.warnings.append(
                f"{key_option(key)} was renamed {key_option(r.new)} in {fs.engine} {r.since} ({r.source}); "
                f"the target has {fs.version}: written as {key_option(r.new)}")
            return r.new
        if r.new == key and fs.has(r.old):
            report.warnings.append(
                f"{key_option(key)} does not exist before {fs.engine} {r.since} ({r.source}); "
                f"the target has {fs.version}: written as {key_option(r.old)}")
            return r.old
    return None


def _unique_prefix(key: str, fs: FlagSet, report: FlagReport) -> str | None:
    matches = fs.prefix_matches(key)
    if len(matches) == 1:
        full = option_key(matches[0])
        report.warnings.append(
            f"{key_option(key)} is only a prefix of {matches[0]} (argparse would accept it silently): "
            f"written as {matches[0]}")
        return full
    if len(matches) > 1:
        report.errors.append(
            f"{key_option(key)} is ambiguous in {fs.engine} {fs.version}: could be {', '.join(matches[:6])}")
        return None
    respelt, closest = respelling(key, fs.option_keys())
    if respelt is not None:  # a typo with exactly one close flag: respelt, loudly (validate calls it an error)
        report.warnings.append(
            f"unknown flag {key_option(key)} for {fs.engine} {fs.version}; did you mean {key_option(respelt)}? "
            f"respelt as {key_option(respelt)} (the one close flag; --save-fixed writes it)")
        report.respelt[key] = respelt
        report.keyed[report.warnings[-1]] = key
        return respelt
    report.errors.append(refusal_line(key_option(key), closest, f"{fs.engine} {fs.version}"))
    report.unknown[key] = report.errors[-1]
    return None


def _removed(key: str, fs: FlagSet, renames: list[Rename], report: FlagReport) -> bool:
    """A flag the renames table retires (`new: null`) in or before the installed version: left out, loudly."""
    for r in renames:
        if r.kind == "arg" and r.new is None and r.old == key and at_least(fs.version, r.removed or r.since):
            report.warnings.append(
                f"dropped {key_option(key)}: removed in {fs.engine} {r.removed or r.since} ({r.source}), a "
                f"documented removal; the target has {fs.version}")
            return True
    return False


def _check_value(key: str, value: Any, flag: Flag, report: FlagReport) -> None:
    opt = key_option(key)
    if not flag.takes_value:
        if not isinstance(value, bool) and value is not None:
            report.errors.append(f"{opt} takes no value (write {key}: true), got {value!r}")
        return
    if value is True and flag.nargs not in ("?", "*"):
        report.errors.append(f"{opt} needs a value, got true")
        return
    if flag.choices is None or value is None or isinstance(value, bool):
        return
    values = value if isinstance(value, list) else [value]
    for item in values:
        if str(item) not in flag.choices:
            hint = difflib.get_close_matches(str(item), list(flag.choices), n=1, cutoff=0.5)
            did = f"; did you mean {hint[0]}?" if hint else ""
            report.errors.append(
                f"{opt} {item}: not one of {', '.join(flag.choices)}{did}")


def _check_env(env: dict[str, str], fs: FlagSet, renames: list[Rename], report: FlagReport,
               prefixes: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in env.items():
        rename = next((r for r in renames if r.kind == "env" and r.old == name), None)
        if rename is not None and at_least(fs.version, rename.since):
            if rename.new is None:
                report.warnings.append(
                    f"env {name} is not read by {fs.engine} {fs.version} (retired in {rename.since}, "
                    f"{rename.source}); it has no effect")
            elif rename.new not in env:
                report.warnings.append(
                    f"env {name} was renamed {rename.new} in {fs.engine} {rename.since}: written as {rename.new}")
                out[rename.new] = value
                continue
        elif prefixes and name.startswith(prefixes) and fs.env_names and name not in fs.env_names:
            hint = difflib.get_close_matches(name, sorted(fs.env_names), n=1, cutoff=0.8)
            did = f"; did you mean {hint[0]}?" if hint else ""
            report.warnings.append(f"env {name} is not read anywhere in {fs.engine} {fs.version}{did}")
        out[name] = value
    return out


def translate_offline(profile: Profile, engine: str, version: str, renames: list[Rename]) -> FlagReport:
    """Translate for `version` from the renames table alone (no flag table of that release at hand).

    A flag renamed in or before `version` takes its new name; a new name used against an older release takes
    the old one; environment renames and retirements are handled as `check_flags` does. Unknown flags are not
    caught here: only the target's (or a cached) flag table knows them.
    """
    report = FlagReport(profile=profile)
    fs = FlagSet(engine=engine, version=version, flags=())
    args: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    for key, value in profile.engine.args.items():
        new_key = key
        for r in renames:
            if r.kind != "arg" or r.new is None:
                continue
            if r.old == key and at_least(version, r.since):
                report.warnings.append(f"{key_option(key)} was renamed {key_option(r.new)} in {engine} {r.since} "
                                       f"({r.source}): written as {key_option(r.new)} for {version}")
                new_key = r.new
            elif r.new == key and not at_least(version, r.since):
                report.warnings.append(f"{key_option(key)} does not exist before {engine} {r.since}: written as "
                                       f"{key_option(r.old)} for {version}")
                new_key = r.old
        if new_key != key:
            renamed[key] = new_key
        args[new_key] = value
    env = _check_env(profile.engine.env, fs, renames, report, profile.engine.definition.launch.env_prefixes)
    if args != profile.engine.args or env != profile.engine.env:
        report.profile = _with_engine(profile, args, env, renamed)
    return report


# --- offline (validate) ----------------------------------------------------------------------------


@dataclass
class OfflineCheck:
    """`engine.args` against a locally cached flag table: which table (and why that one), and what it found."""

    version: str | None          # the cached table used; None: none is cached for this engine
    basis: str                   # why that table ("the version the profile pins", "the newest cached ...")
    report: FlagReport | None = None

    def strict_problems(self) -> list[tuple[str, str]]:
        """(profile key, line) for everything `validate` calls an error: each check error, and every typo `up`
        would respell (CI should catch what `up` would have healed)."""
        if self.report is None:
            return []
        out = [(self.report.keyed.get(e, ""), e) for e in self.report.errors]
        for key, new in self.report.respelt.items():
            out.append((key, f"unknown flag {key_option(key)} for {self.report.profile.engine.kind} {self.version}; "
                             f"did you mean {key_option(new)}? (`up` would respell it; write it as {new})"))
        return out


def check_offline(profile: Profile, cache_dirs: list[Path]) -> OfflineCheck:
    """Check the profile's flags against the flag table cached for `engine.version`, else the newest cached one
    (a preflight against a box caches its table); nothing is checked when none is cached."""
    engine = profile.engine.kind
    tables: dict[str, Path] = {}
    for folder in cache_dirs:
        for version in cached_versions(folder, engine):
            tables.setdefault(version, folder)
    pinned = profile.engine.version
    if pinned is not None and pinned in tables:
        version, basis = pinned, "engine.version pins it"
    elif tables:
        version = max(tables, key=version_order)
        basis = (f"the newest cached; engine.version {pinned} has no cached table" if pinned is not None
                 else "the newest cached; the profile pins no engine.version")
    else:
        return OfflineCheck(None, f"no flag table of {engine} is cached yet (`deploy plan` against a box caches "
                                  "the one of its version)")
    flagset = load_cached_flagset(tables[version], engine, version)
    if flagset is None:
        return OfflineCheck(None, f"the cached flag table of {engine} {version} cannot be read")
    renames = load_renames(profile.engine.definition.knowledge)
    return OfflineCheck(version, basis, check_flags(profile, flagset, renames))


def version_order(version: str) -> tuple[Any, ...]:
    key = version_key(version)
    return (1, key) if key is not None else (0, version)
