"""The managed environment's identity: what it contains (normalised), its content hash, where it lives on the
target, what a record of a built one says, and which ones retention must keep.

On the target:
    <workdir>/.deployer/envs/<hash>                -> <hash>.build-<id>, published (atomically) when complete
    <workdir>/.deployer/envs/<hash>.build-<id>/    the environment (a venv) and its deployer-env.json (EnvRecord);
                                                   one no link points to is a build in progress or a dead one
    <workdir>/.deployer/envs/<hash>.lock           the build lock (see install_plan.LOCK_PROTOCOL)
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping
from urllib.parse import unquote

from deployer.profile.model import Engine, EngineInstall, check_requirement_text

# Bumped when the way deployer builds an environment changes what ends up in it (the same spec must then give a
# new directory, never reuse one built the old way).
ENV_FORMAT = 1
HASH_CHARS = 16
ENVS_DIR = ".deployer/envs"
RECORD_NAME = "deployer-env.json"
BUILD_MARK = ".build-"
LINK_MARK = ".link-"
_NAME_RUN = re.compile(r"[-_.]+")
_SPACES = re.compile(r"\s+")
HASH_RE = re.compile(rf"^[0-9a-f]{{{HASH_CHARS}}}$")


def canonical_name(name: str) -> str:
    """PEP 503: lower case, runs of `-`, `_`, `.` become one `-` (`Jinja2` and `jinja2` are one package)."""
    return _NAME_RUN.sub("-", name).lower()


def normalise_requirement(text: str) -> str:
    """One requirement in a form that does not depend on how it was typed: canonical name, no spaces outside the
    marker, version clauses sorted (`torch >= 2.8, <3` and `Torch<3,>=2.8` are the same package set)."""
    text = check_requirement_text(text)
    head, sep, marker = text.partition(";")
    url_at = head.find("@")
    if url_at >= 0:
        name_part, url = head[:url_at], head[url_at + 1:].strip()
        return _name_and_extras(name_part) + " @ " + url + (f" ; {marker.strip()}" if sep else "")
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?(.*)$", head)
    assert match is not None  # check_requirement_text accepted it
    name = _name_and_extras(match.group(1) + (match.group(2) or ""))
    spec = _SPACES.sub("", match.group(3)).strip("()")
    clauses = ",".join(sorted(c for c in spec.split(",") if c))
    return name + clauses + (f" ; {_SPACES.sub(' ', marker.strip())}" if sep else "")


def _name_and_extras(text: str) -> str:
    text = _SPACES.sub("", text)
    name, _, extras = text.partition("[")
    if not extras:
        return canonical_name(name)
    items = sorted(canonical_name(e) for e in extras.rstrip("]").split(",") if e)
    return f"{canonical_name(name)}[{','.join(items)}]"


@dataclass(frozen=True)
class EnvSpec:
    """What an environment contains, normalised: equal specs are one environment, on every host."""

    packages: tuple[str, ...]
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    python: str = "python3"
    format: int = ENV_FORMAT
    remove: tuple[str, ...] = ()   # canonical names, sorted; uninstalled after the install

    @classmethod
    def from_install(cls, install: EngineInstall) -> EnvSpec:
        """The profile's `engine.install`, normalised. Package order does not matter to a resolver (sorted); index and
        find-links order can (kept)."""
        packages = tuple(sorted({normalise_requirement(p) for p in install.packages}))
        return cls(packages=packages, index_url=install.index_url,
                   extra_index_urls=tuple(install.extra_index_urls), find_links=tuple(install.find_links),
                   python=install.python, remove=tuple(sorted({canonical_name(n) for n in install.remove})))

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": self.format, "packages": list(self.packages), "index_url": self.index_url,
                                "extra_index_urls": list(self.extra_index_urls), "find_links": list(self.find_links),
                                "python": self.python}
        if self.remove:  # only when set: the environments built before `remove` existed keep their digests
            data["remove"] = list(self.remove)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvSpec:
        return cls(packages=tuple(data["packages"]), index_url=data.get("index_url"),
                   extra_index_urls=tuple(data.get("extra_index_urls") or ()),
                   find_links=tuple(data.get("find_links") or ()), python=str(data.get("python") or "python3"),
                   format=int(data.get("format", ENV_FORMAT)), remove=tuple(data.get("remove") or ()))

    @property
    def digest(self) -> str:
        """The content hash: the directory name under envs/ (sha256 of the canonical JSON, first 16 hex digits)."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_CHARS]


@dataclass(frozen=True)
class EnvPaths:
    """Where one environment lives under a target workdir (plain POSIX text: the target's paths)."""

    workdir: str
    digest: str

    @classmethod
    def of(cls, workdir: str, spec: EnvSpec) -> EnvPaths:
        return cls(workdir=workdir.rstrip("/") or "/", digest=spec.digest)

    @property
    def root(self) -> str:
        return f"{self.workdir}/{ENVS_DIR}"

    @property
    def dir(self) -> str:
        return f"{self.root}/{self.digest}"

    @property
    def python(self) -> str:
        """The engine's interpreter once built: what `engine.python` is for a profile with `install`."""
        return f"{self.dir}/bin/python"

    @property
    def record(self) -> str:
        return f"{self.dir}/{RECORD_NAME}"

    @property
    def lock(self) -> str:
        return f"{self.root}/{self.digest}.lock"

    def build_dir(self, build_id: str) -> str:
        """The directory a build writes into and the environment keeps (`dir` is published as a link to it)."""
        return f"{self.root}/{self.digest}{BUILD_MARK}{_checked_id(build_id)}"

    def link_tmp(self, build_id: str) -> str:
        """The symlink made beside `dir` and renamed over it to publish a build (rename(2) is atomic)."""
        return f"{self.root}/{self.digest}{LINK_MARK}{_checked_id(build_id)}"


def _checked_id(build_id: str) -> str:
    if not re.match(r"^[A-Za-z0-9_-]{1,64}$", build_id):
        raise ValueError(f"bad build id {build_id!r}")
    return build_id


def engine_python(engine: Engine, workdir: str) -> str:
    """The interpreter the engine runs with: its managed environment's python with `install`, else `python`."""
    if engine.install is None:
        return engine.python
    return EnvPaths.of(workdir, EnvSpec.from_install(engine.install)).python


@dataclass(frozen=True)
class ResolvedDist:
    """One distribution the resolver chose: its name, version, where it comes from, and its size when known."""

    name: str
    version: str
    url: str | None = None
    size: int | None = None
    requires_python: str | None = None

    @property
    def key(self) -> str:
        return canonical_name(self.name)

    @property
    def filename(self) -> str | None:
        """The archive's file name from its URL (`torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl`)."""
        if not self.url:
            return None
        return unquote(self.url.rsplit("/", 1)[-1].split("#", 1)[0]) or None


@dataclass(frozen=True)
class EnvRecord:
    """What `<env>/deployer-env.json` says of a built environment."""

    spec: EnvSpec
    built_at: str                      # ISO 8601 UTC
    tool: str                          # "uv 0.13.9" / "pip 23.2.1"
    python_version: str                # the environment's interpreter, "3.11.7"
    resolved: tuple[ResolvedDist, ...] = ()
    pip_config: tuple[tuple[str, str], ...] = ()   # what of the target's pip configuration the build honoured
    digest: str = field(default="")

    def to_json(self) -> str:
        return json.dumps({
            "digest": self.digest or self.spec.digest, "spec": self.spec.as_dict(), "built_at": self.built_at,
            "tool": self.tool, "python_version": self.python_version,
            "resolved": [{"name": d.name, "version": d.version, "url": d.url, "size": d.size} for d in self.resolved],
            "pip_config": [list(kv) for kv in self.pip_config],
        }, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EnvRecord:
        """A record read back from a target; unknown keys are ignored (a newer deployer may add some). ValueError
        when it is not a record."""
        try:
            data = json.loads(text)
            spec = EnvSpec.from_dict(data["spec"])
            resolved = tuple(ResolvedDist(name=str(d["name"]), version=str(d["version"]), url=d.get("url"),
                                          size=d.get("size")) for d in data.get("resolved") or ())
            return cls(spec=spec, built_at=str(data["built_at"]), tool=str(data["tool"]),
                       python_version=str(data["python_version"]), resolved=resolved,
                       pip_config=tuple((str(k), str(v)) for k, v in data.get("pip_config") or ()),
                       digest=str(data.get("digest") or spec.digest))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not an environment record: {exc}") from None

    @property
    def intact(self) -> bool:
        """The record's digest is its spec's (a directory whose record says otherwise is not this environment)."""
        return self.digest == self.spec.digest

    def versions(self) -> dict[str, str]:
        return {d.key: d.version for d in self.resolved}


def env_digest_of_python(python: str, workdir: str) -> str | None:
    """The environment a run's engine python belongs to (`<workdir>/.deployer/envs/<hash>/bin/python`), else None:
    how a run record names the env it ran from without a new field."""
    prefix = f"{workdir.rstrip('/')}/{ENVS_DIR}/"
    if not python.startswith(prefix):
        return None
    digest = python[len(prefix):].split("/", 1)[0]
    return digest if HASH_RE.match(digest) else None


def envs_in_use(run_pythons: Iterable[str], workdir: str) -> set[str]:
    """The environments any kept run references (its engine python), which retention must keep."""
    return {d for d in (env_digest_of_python(p, workdir) for p in run_pythons) if d is not None}


def prunable(entries: Iterable[str], links: Mapping[str, str], in_use: set[str], *,
             building: Iterable[str] = ()) -> list[str]:
    """Entries of envs/ that retention may remove: published environments (`<hash>` and the build it links to) no
    kept run references, and builds no link points to (dead builds, leftover link temps), except for digests whose
    lock is held now (`building`). `links`: `<hash>` -> the entry it points to. Lock files and anything deployer did
    not name are left alone."""
    held = set(building)
    published = set(links.values())
    out = []
    for entry in sorted(entries):
        digest = entry.split(".", 1)[0]
        if not HASH_RE.match(digest) or digest in held or entry.endswith(".lock"):
            continue
        if entry == digest:
            if digest not in in_use:
                out += [entry] + ([links[digest]] if digest in links else [])
        elif BUILD_MARK in entry and entry not in published:
            out.append(entry)
        elif LINK_MARK in entry:
            out.append(entry)
    return sorted(set(out))
