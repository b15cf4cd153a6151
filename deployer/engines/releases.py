"""The releases of an engine deployer's knowledge covers (`releases.yaml` in its package, `Knowledge.releases`):
the supported range, and the releases in it whose wheels the per-release knowledge test checks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import yaml

from deployer.engines.base import Knowledge
from deployer.versions import version_in, version_key


@dataclass(frozen=True)
class Releases:
    """`supported`: a version range (`>=0.5.10,<=0.5.23`); `releases`: each release in it, oldest first."""

    supported: str
    releases: tuple[str, ...]

    def supports(self, version: str) -> bool:
        """Whether `version` is in the supported range (an unparsable version is not)."""
        return version_key(version) is not None and version_in(version, self.supported)


@lru_cache(maxsize=4)
def load_releases(knowledge: Knowledge) -> Releases | None:
    """The engine's supported releases; None when its package declares none."""
    if knowledge.releases is None:
        return None
    data = yaml.safe_load(knowledge.releases.read_text(encoding="utf-8")) or {}
    listed = tuple(str(v) for v in data.get("releases", []))
    return Releases(str(data["supported"]), tuple(sorted(listed, key=lambda v: version_key(v) or ((), (), 0, ()))))
