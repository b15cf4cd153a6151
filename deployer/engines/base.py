"""What deployer needs to know about an inference engine, as one typed record (`EngineSpec`).

A second engine is a new module that builds one of these, plus its data files; nothing above changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Phase:
    """A startup phase, entered when a log line matches `pattern`."""

    name: str
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class MultiNode:
    """The engine's own flags for one engine spread over several hosts (as `--flag`)."""

    nnodes: str
    node_rank: str
    dist_init_addr: str


@dataclass(frozen=True)
class EngineSpec:
    kind: str
    launch_module: str                      # run as `<python> -m <launch_module> <argv>`
    template: str                           # launch script template shipped in deployer/render/templates
    ready_line: str                         # printed once the server serves requests
    phases: tuple[Phase, ...]               # progress lines, in startup order
    distribution: str                       # the installed package whose version the target reports
    health_path: str = "/health"
    env_prefixes: tuple[str, ...] = ()      # environment variables the engine reads start with one of these
    data_dir: Path = field(default_factory=lambda: Path(__file__).parent)
    signatures_file: str = ""               # failure signatures (YAML) in data_dir
    renames_file: str = ""                  # flag/env renames by version (YAML) in data_dir
    followons_file: str = ""                # startup checks a remedy must also satisfy (YAML) in data_dir
    value_aliases: dict[str, dict[str, str]] = field(default_factory=dict)  # flag -> {given: engine's name}
    multinode: MultiNode | None = None      # None: no multi-node launch known
    secret_flags: frozenset[str] = frozenset()  # flags (profile keys) that take a credential: always masked

    def phase_of(self, line: str) -> str | None:
        for phase in self.phases:
            if phase.pattern.search(line):
                return phase.name
        return None
