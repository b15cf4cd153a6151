"""What this machine knows, offline, of the engine version a profile will meet on its target, and the profile
translated for that version the way preflight translates it before `up` launches (for `deploy render`).

The version comes from, in order: `engine.version` (the profile pins it); the version the last preflight against
the same target and engine python found (each preflight records it in the local cache); the newest flag table
cached for the engine (an assumption, said as one); else none, and the flags stay as written.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from deployer.engines.renames import load_renames
from deployer.preflight import flags as fl
from deployer.profile.model import Profile


@dataclass
class KnownVersion:
    """The engine version a translation is for, and why that one (`known`: the target's own, not assumed)."""

    version: str | None
    basis: str
    known: bool = False


@dataclass
class ForTarget:
    """A profile translated for the version its target runs: what `up` would launch, with what was done to it."""

    profile: Profile
    version: KnownVersion
    warnings: list[str] = field(default_factory=list)   # renames, retired env, respelt typos
    errors: list[str] = field(default_factory=list)     # what preflight would refuse before launch

    def notes(self) -> list[str]:
        """One line on the version, then what the translation did (and what `up` would refuse)."""
        kind = self.profile.engine.kind
        if self.version.version is None:
            head = f"flags as written, not translated: {self.version.basis}"
        elif self.version.known:
            head = f"flags as `up` runs them on {kind} {self.version.version} ({self.version.basis})"
        else:
            head = (f"flags translated for {kind} {self.version.version}, an assumption ({self.version.basis}); "
                    "`up` translates them for the version the target has")
        return ([head] + self.warnings
                + [f"`up` would refuse this before launch: {error}" for error in self.errors])

    def to_json(self) -> dict[str, object]:
        return {"version": self.version.version, "known": self.version.known, "basis": self.version.basis,
                "warnings": list(self.warnings), "errors": list(self.errors)}


def local_caches() -> list[Path]:
    """Where preflight caches (`$DEPLOYER_HOME/cache`) and the user cache dir (`validate` reads both)."""
    from deployer.local.history import home

    return [home() / "cache", fl.default_cache_dir()]


def _target_file(cache_dir: Path, profile: Profile) -> Path:
    """One record per (target, engine, engine python): a box can hold several venvs."""
    t = profile.target
    who = json.dumps([t.host, t.user, t.port, profile.engine.kind, profile.engine.python])
    return cache_dir / "targets" / f"{hashlib.sha256(who.encode()).hexdigest()[:20]}.json"


def record_target_version(cache_dir: Path, profile: Profile, version: str) -> None:
    """After a preflight: the engine version this target's engine python has (atomic write; best effort)."""
    path = _target_file(cache_dir, profile)
    data = {"host": profile.target.host, "engine": profile.engine.kind, "python": profile.engine.python,
            "version": version, "at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a cache: the next preflight records it again


def _last_seen(cache_dirs: list[Path], profile: Profile) -> tuple[str, float] | None:
    for folder in cache_dirs:
        try:
            data = json.loads(_target_file(folder, profile).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("version"), str):
            at = data.get("at")
            return data["version"], float(at) if isinstance(at, (int, float)) else 0.0
    return None


def known_version(profile: Profile, cache_dirs: list[Path]) -> KnownVersion:
    """The version `up` will meet on the profile's target, as far as the local cache knows it."""
    kind, host = profile.engine.kind, profile.target.host
    if profile.engine.version is not None:
        return KnownVersion(profile.engine.version, "engine.version pins it", known=True)
    seen = _last_seen(cache_dirs, profile)
    if seen is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(seen[1])) if seen[1] else "earlier"
        return KnownVersion(seen[0], f"the last preflight against {host} found it, {when}", known=True)
    cached = sorted({v for folder in cache_dirs for v in fl.cached_versions(folder, kind)}, key=fl.version_order)
    unknown = f"the {kind} version on {host} is not known here (no engine.version, no preflight against it yet)"
    if cached:
        return KnownVersion(cached[-1], f"{unknown}; assumed the newest cached flag table")
    return KnownVersion(None, f"{unknown}; `up` translates them for the version the target has (`deploy plan` "
                              "shows it and lets `render` show the same)")


def for_target(profile: Profile, cache_dirs: list[Path]) -> ForTarget:
    """The profile as preflight would hand it to the launch for the known (or assumed) version."""
    version = known_version(profile, cache_dirs)
    if version.version is None:
        return ForTarget(profile, version)
    renames = load_renames(profile.engine.definition.knowledge)
    flagset = next((f for f in (fl.load_cached_flagset(d, profile.engine.kind, version.version) for d in cache_dirs)
                    if f is not None), None)
    report = (fl.check_flags(profile, flagset, renames) if flagset is not None
              else fl.translate_offline(profile, profile.engine.kind, version.version, renames))
    if flagset is None:
        version.basis += "; no flag table of it is cached: the renames table alone translates"
    return ForTarget(report.profile, version, list(report.warnings), list(report.errors))
