"""Where a single-host profile file points (deployment name, target, workdir), remembered on this machine.

`deploy status profiles/x.yaml` needs three things from the profile: the deployment's name, how to reach its host
and the workdir there. Loading the profile for them imports the profile model (pydantic) and YAML, ~100 ms of a
command whose network part is one exec channel. So after a profile has been loaded once, this is kept under
`$DEPLOYER_HOME/cache/refs/` keyed by the command's arguments (file path, --set, --host), and it is used only while
everything the load read is unchanged: the content of every file of the `extends:` chain, and the value (or
absence) of every `${VAR}` the profile names, and the user's defaults (deployer.local.settings: the config file and
the DEPLOYER_HOST/WORKDIR/ENGINE_PYTHON variables). Env values are compared as HMACs under a key kept beside the
entries (0600), so no secret's digest is stored where anyone could test guesses against it.

Only single-host profiles are remembered: replicas and nodes profiles are loaded in full by their commands.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from deployer import __version__
from deployer.errors import ProfileError
from deployer.local.history import home
from deployer.host import TargetSpec
from deployer.local.settings import KEYS, load_config

VERSION = 1
KEPT = 200                                   # entries kept (the oldest go first)
VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Target(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def user(self) -> str | None: ...
    @property
    def port(self) -> int | None: ...
    @property
    def identity_file(self) -> str | None: ...
    @property
    def known_hosts(self) -> str | None: ...
    @property
    def workdir(self) -> str: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class Loaded(Protocol):
    """What `remember` reads of a loaded profile (deployer.profile.model.Profile is one; this package sits below
    the profile, whose loader applies the user's defaults from deployer.local.settings)."""

    @property
    def name(self) -> str: ...
    @property
    def target(self) -> _Target: ...
    @property
    def templates(self) -> Mapping[str, str]: ...
    @property
    def unset(self) -> Sequence[_Named]: ...
    @property
    def files(self) -> Sequence[Path]: ...


@dataclass(frozen=True)
class Pointer:
    """The part of a single-host profile that the on-call reads need."""

    name: str
    host: str
    user: str | None
    port: int | None
    identity_file: str | None
    known_hosts: str | None
    workdir: str

    def spec(self, trust_new_host: bool = False) -> TargetSpec:
        """How to reach the host it points to."""
        return TargetSpec(host=self.host, user=self.user, port=self.port, identity_file=self.identity_file,
                          known_hosts=self.known_hosts, trust_new_host=trust_new_host)


def _dir() -> Path:
    return home() / "cache" / "refs"


def _key(path: str, overrides: tuple[str, ...], host: str | None) -> str:
    where = os.path.realpath(path)
    # deployer's own version too: another release may read the same files differently
    return hashlib.sha256(json.dumps([VERSION, __version__, where, list(overrides), host]).encode()).hexdigest()[:32]


def _mac_key(create: bool) -> bytes | None:
    key_file = _dir() / ".key"
    try:
        key = key_file.read_bytes()
        if len(key) == 32:
            return key
    except OSError:
        pass
    if not create:
        return None
    key_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = key_file.with_name(f".key.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, os.urandom(32))
    finally:
        os.close(fd)
    os.replace(tmp, key_file)
    return key_file.read_bytes()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _env_mac(key: bytes, name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else hmac.new(key, f"{name}={value}".encode(), hashlib.sha256).hexdigest()


def lookup(path: str, overrides: tuple[str, ...], host: str | None) -> Pointer | None:
    """The remembered pointer of this profile file and these arguments, if nothing it was read from changed."""
    try:
        entry = json.loads((_dir() / f"{_key(path, overrides, host)}.json").read_text(encoding="utf-8"))
        key = _mac_key(create=False)
        if key is None or entry.get("version") != VERSION:
            return None
        for file, digest in entry["files"]:
            if _digest(Path(file).read_bytes()) != digest:
                return None
        if any(_env_mac(key, name) != mac for name, mac in entry["env"]):
            return None
        if entry.get("config") != _config_digest():
            return None  # the user's defaults changed (deployer.local.settings)
        return Pointer(**entry["pointer"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # nothing remembered, or something unreadable: the caller loads the profile


def remember(path: str, overrides: tuple[str, ...], host: str | None, profile: Loaded) -> None:
    """Keep where this loaded single-host profile points; never fails the command that loaded it."""
    t = profile.target
    pointer = Pointer(profile.name, t.host, t.user, t.port, t.identity_file, t.known_hosts, t.workdir)
    names = sorted({n for text in profile.templates.values() for n in VAR_RE.findall(text)} |
                   {u.name for u in profile.unset} | {k.env for k in KEYS})
    try:
        key = _mac_key(create=True)
        if key is None:
            return
        entry: dict[str, Any] = {
            "version": VERSION, "pointer": asdict(pointer),
            "files": [[str(f), _digest(f.read_bytes())] for f in profile.files],
            "env": [[name, _env_mac(key, name)] for name in names], "config": _config_digest(),
        }
        target = _dir() / f"{_key(path, overrides, host)}.json"
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(tmp, target)
        _trim()
    except OSError:
        pass  # a read-only home: the next command loads the profile again


def _config_digest() -> str | None:
    """The user's config file as it is now (None: none); a bad one counts as changed (the load says why)."""
    try:
        return load_config().digest
    except ProfileError:
        return "unreadable"


def _trim() -> None:
    entries = sorted(_dir().glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in entries[:-KEPT]:
        old.unlink(missing_ok=True)
