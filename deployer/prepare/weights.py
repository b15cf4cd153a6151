"""Weights as a step of their own (issue 25, item 3): what to fetch for a profile, the request the target-side
fetch reads (deployer/supervisor/fetch.py), its lines as progress, and the profile pinned to the commit
it fetched.

A profile with `engine.weights` has its hub repo fetched on the target before anything is stopped; the engine
then runs with HF_HUB_OFFLINE=1 and its revision flag set to that commit, so it loads exactly those files from
the cache and never downloads while the old version is down. The pinned profile is what a run records
(profile.json: `engine.weights.revision` and the flag hold the commit), so a rollback loads the weights it ran
with. Pure: the target is talked to by deployer/box/weights.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deployer.events import Download
from deployer.logtext import size_text as size_text  # where it lives: on-call output shows sizes without this module

if TYPE_CHECKING:  # the model's import is slow
    from deployer.profile.model import Profile

PHASE = "fetching weights"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}


@dataclass(frozen=True)
class WeightsPlan:
    """One profile's fetch: the repo and revision, the hub cache (None: the target's HF_HUB_CACHE / HF_HOME /
    default), the endpoint (None: the target's HF_ENDPOINT or the hub) and the token (a value from the profile's
    env; None: the target's own HF_TOKEN). The token goes over the program's stdin only."""

    repo: str
    revision: str
    hub: str | None
    endpoint: str | None
    token: str | None
    connections: int = 8            # a large file comes in parts over this many connections at once
    part_bytes: int = 64 << 20      # ... of this size (a file of two parts or more)

    def request(self, progress_s: float = 1.0, dry: bool = False) -> bytes:
        """The one JSON line the target-side fetch reads on stdin (`dry`: list and measure, fetch nothing)."""
        return (json.dumps({"repo": self.repo, "revision": self.revision, "hub": self.hub, "endpoint": self.endpoint,
                            "token": self.token, "progress_s": progress_s, "dry": dry,
                            "connections": self.connections, "part_bytes": self.part_bytes}) + "\n").encode()

    def describe(self) -> str:
        return f"{self.repo}@{self.revision}"


def plan_for(profile: Profile) -> WeightsPlan | None:
    """What `up` fetches for this profile before launch; None when the engine finds its own weights."""
    engine = profile.engine
    if engine.weights is None or engine.weights.push:  # a pushed directory: deployer/prepare/pushed.py
        return None
    env = engine.env
    hub = env.get("HF_HUB_CACHE") or (env["HF_HOME"].rstrip("/") + "/hub" if env.get("HF_HOME") else None)
    if hub is not None and "$" in hub:
        hub = None  # a path the target's shell would expand: the target's own environment decides
    endpoint = engine.weights.endpoint or env.get("HF_ENDPOINT") or None
    return WeightsPlan(engine.model_path, engine.weights.revision, hub, endpoint, env.get("HF_TOKEN") or None,
                       connections=engine.weights.connections)


def pinned(profile: Profile, commit: str) -> Profile:
    """The profile as it launches after the fetch: offline, its revision flag and `weights.revision` the commit."""
    engine = profile.engine
    assert engine.weights is not None
    flag = engine.definition.launch.revision_flag
    patched = profile.patched(args={flag: commit}, env=dict(OFFLINE_ENV))
    weights = engine.weights.model_copy(update={"revision": commit})
    return patched.with_engine(patched.engine.model_copy(update={"weights": weights}))


@dataclass(frozen=True)
class Fetched:
    """What a fetch ended with on one host: the commit, the bytes that came over the network, the repo's size."""

    host: str
    commit: str
    fetched: int
    total: int
    files: int
    seconds: float
    snapshot: str

    def to_json(self) -> dict[str, object]:
        return {"commit": self.commit, "files": self.files, "total_bytes": self.total,
                "fetched_bytes": self.fetched, "seconds": round(self.seconds, 3), "snapshot": self.snapshot}

    def describe(self) -> str:
        got = moved_text(self.fetched, self.seconds, "fetched") if self.fetched else "already on disk"
        return f"weights {self.commit[:12]} on {self.host}: {self.files} files, {size_text(self.total)}, {got}"


@dataclass(frozen=True)
class Needed:
    """What a fetch would do on one host (`deploy plan`): the commit, the repo's size, what is missing, the free
    disk of the cache; `fits`: the missing bytes fit."""

    host: str
    commit: str
    total: int
    missing: int
    free: int

    @property
    def fits(self) -> bool:
        return self.missing <= self.free

    def to_json(self) -> dict[str, object]:
        return {"host": self.host, "commit": self.commit, "total_bytes": self.total, "missing_bytes": self.missing,
                "free_bytes": self.free, "fits": self.fits}

    def describe(self) -> str:
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (f"weights {self.commit[:12]} on {self.host}: {size_text(self.total)}, {size_text(self.missing)} to "
                f"fetch, {size_text(self.free)} free ({verdict})")


def progress(line: dict[str, object]) -> Download | None:
    """A progress line of the target-side fetch as a Download (bytes, total, rate); None for other lines."""
    total, done, rate = line.get("total"), line.get("bytes"), line.get("rate")
    if "file" not in line or not isinstance(total, int) or not isinstance(done, int):
        return None
    rate = rate if isinstance(rate, int) else 0
    percent = round(100.0 * done / total, 1) if total else 100.0
    name = str(line.get("file") or "")
    text = f"{name or 'weights'} {percent:.0f}% {size_text(done)}/{size_text(total)} {size_text(rate)}/s"
    return Download(file=name or "weights", percent=percent, text=text, bytes=done, total_bytes=total,
                    rate_bytes_s=rate, source="fetch")


def moved_text(moved: int, seconds: float, verb: str) -> str:
    """How many bytes a transfer moved (`verb`: fetched, sent), in how long, at what rate."""
    rate = moved / seconds if seconds > 0 else 0.0
    return f"{size_text(moved)} {verb} in {seconds:.1f}s ({size_text(rate)}/s)"
