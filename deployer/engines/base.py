"""What deployer needs to know about an inference engine, as one typed record (`EngineSpec`).

A second engine is a new module that builds one of these, plus its data files; nothing above changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
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
    model_flag: str = "model_path"          # the flag that names the model in the launch argv
    args_dump: re.Pattern[str] | None = None  # the startup line of the args dump; group 1 starts the dict
    args_dump_complete: bool = True         # every flag is in the dump (else only the non-default ones)
    # flags (profile keys) that take a credential: always masked (env file, records, drift, the args dump line)
    secret_flags: frozenset[str] = frozenset()
    log_prefix: re.Pattern[str] | None = None  # the logger's line prefix, group "tag" = process/rank
    memory_plan: bool = False               # preflight has a memory model for this engine (memory.py)
    false_prefix: str = ""                  # how `flag: false` is written ("--no-"); "" = the flag is left out

    def masked(self, line: str) -> str:
        """The line with the values of secret flags in the engine's args dump replaced by '***'.

        vLLM before its redaction printed `'api_key': ['sk-...']` in clear in `non-default args: {...}`."""
        if not self.secret_flags or self.args_dump is None or not self.args_dump.search(line):
            return line
        return _secret_values(self.secret_flags).sub(lambda m: m.group(1) + "'***'", line)

    def phase_of(self, line: str) -> str | None:
        for phase in self.phases:
            if phase.pattern.search(line):
                return phase.name
        return None


@lru_cache(maxsize=8)
def _secret_values(names: frozenset[str]) -> re.Pattern[str]:
    """`'name': value` (dict repr) or `name=value` (call repr): a quoted string, a list, or a bare word."""
    keys = "|".join(re.escape(n) for n in sorted(names))
    return re.compile(r"""((?:'|")?\b(?:""" + keys + r""")\b(?:'|")?\s*[:=]\s*)"""
                      r"""(\[[^\]]*\]|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^,})\s]+)""")
