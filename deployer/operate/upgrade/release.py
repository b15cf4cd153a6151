"""The release an upgrade goes to (`--engine KIND==VERSION`) and the profile that runs it: the same flags, the
engine's python of that release (given, or a managed environment built beside the old one), `engine.version`
pinned to it so preflight checks that the python really has it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from deployer.errors import ProfileError
from deployer.profile.model import EngineInstall, Profile
from deployer.versions import version_key

_RELEASE = re.compile(r"^\s*(?P<kind>[A-Za-z][A-Za-z0-9_-]*)\s*==\s*(?P<version>[^\s=<>!,]+)\s*$")


@dataclass(frozen=True)
class Release:
    """One release of one engine kind."""

    kind: str
    version: str

    def __str__(self) -> str:
        return f"{self.kind}=={self.version}"


def parse_release(text: str, profile_kind: str) -> Release:
    """`KIND==VERSION` for the profile's engine kind; ProfileError (one line, exit 2) for anything else."""
    found = _RELEASE.match(text)
    if found is None:
        raise ProfileError(f"--engine {text!r}: write the release as KIND==VERSION, e.g. {profile_kind}==0.5.23")
    kind, version = found.group("kind"), found.group("version")
    if kind != profile_kind:
        raise ProfileError(f"--engine {text}: the profile's engine is {profile_kind}, not {kind} (an upgrade keeps "
                           "the engine; write a new profile to change it)")
    if version_key(version) is None:
        raise ProfileError(f"--engine {text}: {version!r} is not a release version")
    return Release(kind, version)


def for_release(profile: Profile, release: Release, python: str | None) -> Profile:
    """The profile run by `release`: from `python` when given (that release's engine python on the target), else
    from a managed environment with the engine's package pinned to the release (engine.install's other packages
    kept; none: the engine's package alone)."""
    engine = profile.engine
    if python is not None:
        update: dict[str, object] = {"python": python, "install": None, "version": release.version}
    else:
        update = {"install": upgraded_install(profile, release), "version": release.version}
    return profile.with_engine(engine.model_copy(update=update))


def upgraded_install(profile: Profile, release: Release) -> EngineInstall:
    """engine.install with the engine's requirement replaced by `NAME==VERSION` (the distribution it named, else
    the engine's first distribution)."""
    names = profile.engine.definition.install.names
    install = profile.engine.install
    if install is None:
        return EngineInstall(packages=[f"{names[0]}=={release.version}"])
    packages, placed = [], False
    for requirement in install.packages:
        name = _requirement_name(requirement)
        if name in {_canonical(n) for n in names}:
            packages.append(f"{_written_name(requirement)}=={release.version}")
            placed = True
        else:
            packages.append(requirement)
    if not placed:
        packages.insert(0, f"{names[0]}=={release.version}")
    return install.model_copy(update={"packages": packages})


_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?")


def _written_name(requirement: str) -> str:
    found = _NAME.match(requirement)
    return (found.group(1) + (found.group(2) or "")) if found else requirement


def _requirement_name(requirement: str) -> str:
    found = _NAME.match(requirement)
    return _canonical(found.group(1)) if found else ""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
