"""A model directory on the controller pushed to the target instead of fetched (`engine.weights.push`; issue 25):
what it holds (every regular file's size and sha256, read here), its content hash (the key of its place on the
target, `<workdir>/.deployer/models/<content>/`), the request the target-side receiver reads
(deployer/supervisor/push.py), what a push did or would do, and the profile pinned to the pushed copy.

The directory is read without following a symlink: a symlink, a FIFO or a device inside it is refused in one line
(copy what a link points at into the directory). `.git/` and `.cache/` at its top (a clone's history, what
`hf download --local-dir` keeps for itself) are not part of the model and are left out. Hashing a large directory
takes a while, so each file's sha256 is kept in the local cache under its path, size, mtime and inode, and read
again only when one of those changed. The engine then loads the pushed copy (its model flag the target path),
offline, under the directory's own name (args.served_model_name, profile/model.py). The target is talked to by
deployer/box/pushweights.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from deployer.errors import ProfileError
from deployer.prepare.weights import OFFLINE_ENV, Fetched, Needed, moved_text, size_text
from deployer.profile.model import Profile

MODELS_DIR = ".deployer/models"
SKIPPED_TOP = (".git", ".cache")
READ_CHUNK = 1 << 20
SAY_HASHING = 1 << 30   # bytes to hash before a push that are worth a line (a second or more)


@dataclass(frozen=True)
class LocalFile:
    name: str        # relative, with `/`
    path: Path
    size: int
    sha256: str


@dataclass(frozen=True)
class PushPlan:
    """One profile's push: the directory here, its files and its content hash."""

    source: Path
    files: tuple[LocalFile, ...]

    @property
    def content(self) -> str:
        """sha256 of the manifest (each file's name, size and sha256): the same bytes, the same key."""
        lines = "".join(f"{f.name}\0{f.size}\0{f.sha256}\n" for f in self.files)
        return hashlib.sha256(lines.encode()).hexdigest()

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    def describe(self) -> str:
        return f"{self.source.name} {self.content[:12]}"

    def request(self, workdir: str, dry: bool = False) -> bytes:
        """The JSON line the receiver reads first (`workdir`: absolute, as the target spells it)."""
        return (json.dumps({"models": models_dir(workdir), "owned_from": workdir, "content": self.content,
                            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.files],
                            "dry": dry}) + "\n").encode()


def models_dir(workdir: str) -> str:
    return f"{workdir.rstrip('/')}/{MODELS_DIR}"


def source_of(profile: Profile) -> Path:
    """The directory `engine.model_path` names on the controller (relative to the profile file)."""
    path = Path(profile.engine.model_path).expanduser()
    if not path.is_absolute() and profile.source is not None:
        path = Path(profile.source).parent / path
    return path


def plan_push(profile: Profile, cache: Path | None, say: Callable[[str], None] | None = None) -> PushPlan | None:
    """The push for this profile (its files hashed, or read from `cache`; `say`: told when many bytes must be
    read first); None without `engine.weights.push`, or when the profile is a run's record (already pushed: its
    model_path is the target's copy)."""
    weights = profile.engine.weights
    if weights is None or not weights.push or weights.pushed is not None:
        return None
    folder = source_of(profile)
    if not folder.is_dir():
        raise ProfileError(f"engine.weights.push: {folder} is not a directory here (model_path is the directory to "
                           "push, relative to the profile file)", file=str(profile.source or "<profile>"),
                           field="engine.model_path")
    hashes = HashCache(cache)
    found = _walk(folder)
    unknown = sum(st.st_size for _, path, st in found if not hashes.knows(path, st))
    if say is not None and unknown >= SAY_HASHING:
        say(f"hashing {size_text(unknown)} under {folder} (sha256 per file; kept for the next push)")
    files = tuple(LocalFile(name, path, st.st_size, hashes.sha256(path, st)) for name, path, st in found)
    hashes.save()
    if not files:
        raise ProfileError(f"engine.weights.push: {folder} holds no files", file=str(profile.source or "<profile>"),
                           field="engine.model_path")
    return PushPlan(folder, files)


def _walk(folder: Path) -> list[tuple[str, Path, os.stat_result]]:
    """Every regular file below `folder` (sorted by name), none through a symlink; anything else refused."""
    out: list[tuple[str, Path, os.stat_result]] = []
    for top, dirs, names in os.walk(folder, followlinks=False, onerror=_unreadable):
        rel = Path(top).relative_to(folder)
        if rel == Path("."):
            dirs[:] = [d for d in dirs if d not in SKIPPED_TOP]
        for entry in sorted(dirs) + sorted(names):
            path = Path(top) / entry
            st = os.lstat(path)
            name = (rel / entry).as_posix()
            if "\n" in name or "\\" in name:
                raise ProfileError(f"engine.weights.push: {path}: a file name deployer will not send")
            if stat.S_ISLNK(st.st_mode):
                raise ProfileError(f"engine.weights.push: {path} is a symbolic link; deployer pushes regular files "
                                   "only (copy what it points at into the directory)")
            if stat.S_ISREG(st.st_mode):
                out.append((name, path, st))
            elif not stat.S_ISDIR(st.st_mode):
                raise ProfileError(f"engine.weights.push: {path} is not a regular file; deployer pushes regular "
                                   "files only")
    return sorted(out, key=lambda item: item[0])


def _unreadable(exc: OSError) -> None:
    raise ProfileError(f"engine.weights.push: cannot read {exc.filename}: {exc.strerror or exc}")


class HashCache:
    """sha256 of local files, kept under (size, mtime_ns, inode) in one JSON file; None: nothing kept."""

    def __init__(self, folder: Path | None) -> None:
        self.path = folder / "push-hashes.json" if folder is not None else None
        self.known: dict[str, list[object]] = {}
        self.changed = False
        if self.path is not None:
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self.known = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                self.known = {}

    def _kept(self, path: Path, st: os.stat_result) -> str | None:
        kept = self.known.get(str(path.resolve()))
        if isinstance(kept, list) and len(kept) == 4 and kept[:3] == [st.st_size, st.st_mtime_ns, st.st_ino] and \
                isinstance(kept[3], str):
            return kept[3]
        return None

    def knows(self, path: Path, st: os.stat_result) -> bool:
        return self._kept(path, st) is not None

    def sha256(self, path: Path, st: os.stat_result) -> str:
        key, stamp = str(path.resolve()), [st.st_size, st.st_mtime_ns, st.st_ino]
        kept = self._kept(path, st)
        if kept is not None:
            return kept
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(READ_CHUNK), b""):
                    digest.update(chunk)
        except OSError as exc:
            raise ProfileError(f"engine.weights.push: cannot read {path}: {exc.strerror or exc}") from None
        self.known[key], self.changed = [*stamp, digest.hexdigest()], True
        return digest.hexdigest()

    def save(self) -> None:
        if self.path is None or not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.known), encoding="utf-8")
            tmp.replace(self.path)
        except OSError:
            pass  # a cache: the next push hashes again


def pinned_push(profile: Profile, folder: str, content: str) -> Profile:
    """The profile as it launches after the push: the engine's model flag the pushed copy, offline, and the record
    of what was pushed (`weights.pushed`)."""
    engine = profile.engine
    assert engine.weights is not None
    patched = profile.patched(env=dict(OFFLINE_ENV))
    weights = engine.weights.model_copy(update={"pushed": content})
    return patched.with_engine(patched.engine.model_copy(update={"model_path": folder, "weights": weights}))


def pinned_to_copy(profile: Profile, workdir: str, cache: Path | None) -> tuple[Profile, PushPlan, str] | None:
    """Before a push (`render`, preflight): the profile as it will launch on the copy under `workdir` (as the
    target spells it), the push, and that copy's place; None when the profile pushes nothing (or was pushed)."""
    plan = plan_push(profile, cache)
    if plan is None:
        return None
    folder = f"{models_dir(workdir)}/{plan.content}"
    return pinned_push(profile, folder, plan.content), plan, folder


@dataclass(frozen=True)
class Pushed:
    """What a push ended with on one host: the content, its place there, the bytes sent, the directory's size."""

    host: str
    content: str
    folder: str
    sent: int
    total: int
    files: int
    seconds: float

    @property
    def commit(self) -> str:
        """What the hosts of one run must agree on (a fetch's commit): the place every engine loads from."""
        return self.folder

    def to_json(self) -> dict[str, object]:
        return {"pushed": self.content, "dir": self.folder, "files": self.files, "total_bytes": self.total,
                "sent_bytes": self.sent, "seconds": round(self.seconds, 3)}

    def describe(self) -> str:
        got = moved_text(self.sent, self.seconds, "sent") if self.sent else "already there"
        return f"weights {self.content[:12]} pushed to {self.host}: {self.files} files, {size_text(self.total)}, {got}"


@dataclass(frozen=True)
class PushNeeded(Needed):
    """What a push would do on one host (`deploy plan`): the bytes to send (`missing`) against the free disk there;
    `commit` is the content hash, `folder` where the copy goes."""

    folder: str = ""

    def to_json(self) -> dict[str, object]:
        data = {k: v for k, v in super().to_json().items() if k != "commit"}
        return {**data, "pushed": self.commit, "dir": self.folder}

    def describe(self) -> str:
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (f"weights {self.commit[:12]} push to {self.host}: {size_text(self.total)}, {size_text(self.missing)} "
                f"to send, {size_text(self.free)} free ({verdict})")


WeightsDone = Union[Fetched, Pushed]        # what the weights step did on one host
WeightsNeeded = Union[Needed, PushNeeded]   # what it would do there (`deploy plan`)
