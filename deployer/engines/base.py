"""What deployer knows about an inference engine, as one `Engine` made of small frozen parts, one per concern:
`Launch` (how it is started), `LogFormat` (what its log says), `Knowledge` (its failure and flag tables),
`Install` (which installed package it is), `Probe` (the script run on the target), `Docs`, and its memory model
(`MemoryInput` -> `MemoryPlan`).

A second engine is a new package that builds one `Engine`, plus its data files; nothing above changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from deployer.versions import at_least, version_key


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
    # the network interface the collectives use, set per node in these environment variables
    nic_env: tuple[str, ...] = ()
    # what a rank >= 1 prints once it serves its stand-in health endpoint (it never prints ready_line)
    follower_ready_line: str | None = None
    # signature ids of failures a rank shows because ANOTHER rank failed: never the group's diagnosis when a
    # rank that failed on its own is there too
    peer_failures: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ModelInfo:
    """What a memory plan needs from the model folder: config.json and the weights' total size."""

    config: dict[str, Any]
    weight_bytes: int | None
    source: str = ""

    @property
    def text(self) -> dict[str, Any]:
        """The language model's config (multimodal configs nest it under text_config)."""
        inner = self.config.get("text_config")
        return {**self.config, **inner} if isinstance(inner, dict) else self.config

    @property
    def multimodal(self) -> bool:
        arch = " ".join(self.config.get("architectures") or [])
        return "vision_config" in self.config or "ForConditionalGeneration" in arch


class UnsupportedModel(ValueError):
    """config.json describes an architecture the engine's memory model does not cover (e.g. MLA)."""


@dataclass(frozen=True)
class MemoryInput:
    """What preflight knows when it asks an engine for a memory plan (plain values, no Profile)."""

    model: ModelInfo
    args: dict[str, Any]                    # the profile's engine args (profile keys)
    resolved: dict[str, Any] | None         # the engine's dry resolution of them; None when it did not run
    gpu_free_mib: list[int]                 # the GPUs the engine will use, in order
    gpu_total_mib: list[int]
    version: str | None                     # the installed engine version, when known

    def effective_args(self) -> dict[str, Any]:
        """The profile's args under the engine's own resolution (it knows the defaults)."""
        return {**self.args, **(self.resolved or {})}


MIB = 1 << 20


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory as a plan divides it, in MiB: weights, KV cache, Mamba state, activations and graphs
    (everything the engine keeps outside its pools: activations, CUDA graphs, the CUDA context), and the headroom
    left (negative: it does not fit)."""

    total_mib: float
    weights_mib: float
    kv_cache_mib: float
    mamba_state_mib: float = 0.0
    activations_graphs_mib: float = 0.0

    PARTS = ("weights_mib", "kv_cache_mib", "mamba_state_mib", "activations_graphs_mib")

    @property
    def used_mib(self) -> float:
        return sum(float(getattr(self, part)) for part in self.PARTS)

    @property
    def headroom_mib(self) -> float:
        return self.total_mib - self.used_mib

    def to_json(self) -> dict[str, float]:
        return {"total_mib": round(self.total_mib, 1), **{p: round(float(getattr(self, p)), 1) for p in self.PARTS},
                "headroom_mib": round(self.headroom_mib, 1)}


@dataclass(frozen=True)
class GpuBudget:
    """One GPU of the engine (its index and name on the box) with the plan's budget on its total."""

    gpu: int
    name: str | None
    budget: MemoryBudget

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "name": self.name, **self.budget.to_json()}


@dataclass(frozen=True)
class KvAllocated:
    """What the engine's log says it allocated for its KV cache: tokens, and MiB where a line says (the K and V
    sizes, or the KV cache memory); `line` is the line(s) it came from."""

    tokens: int | None
    mib: float | None
    line: str

    def to_json(self) -> dict[str, Any]:
        return {"kv_tokens": self.tokens, "kv_cache_mib": None if self.mib is None else round(self.mib, 1),
                "line": self.line}


GIB_GROUPS = ("k_gb", "v_gb", "gib")   # named groups of a kv_allocated pattern that add up to the KV cache (GB)


def kv_allocated_in(patterns: tuple[re.Pattern[str], ...], text: str) -> KvAllocated | None:
    """The engine's KV allocation from its log text by its `LogFormat.kv_allocated` patterns (named groups
    `tokens`, and `k_gb` + `v_gb` or `gib`); the numbers of every pattern that matches are put together, the first
    match of each pattern counting (a restart's second allocation is the same)."""
    tokens: int | None = None
    mib: float | None = None
    lines = []
    for pattern in patterns:
        found = pattern.search(text)
        if found is None:
            continue
        groups = found.groupdict()
        if groups.get("tokens") and tokens is None:
            tokens = int(groups["tokens"].replace(",", ""))
        sizes = [float(groups[g]) for g in GIB_GROUPS if groups.get(g)]
        if sizes and mib is None:
            mib = sum(sizes) * 1024
        lines.append(found.group(0).strip())
    if tokens is None and mib is None:
        return None
    return KvAllocated(tokens, mib, " | ".join(lines))


class MemoryPlan(Protocol):
    """One GPU's memory budget as the engine would lay it out; `fits` False comes with `problems`."""

    @property
    def fits(self) -> bool: ...
    @property
    def problems(self) -> list[str]: ...
    @property
    def warnings(self) -> list[str]: ...
    @property
    def suggestions(self) -> list[str]: ...
    def rows(self) -> list[tuple[str, str]]: ...
    def to_json(self) -> dict[str, Any]: ...
    def budget(self) -> MemoryBudget: ...
    def kv_estimate(self) -> KvAllocated: ...


# UnsupportedModel, KeyError, ValueError: the model's config is not one the engine's model covers.
MemoryModel = Callable[[MemoryInput], MemoryPlan]


@dataclass(frozen=True)
class Launch:
    """How the engine is started and what its argv means: the module run as `<python> -m <module> <argv>`, the
    launch script template, how flags are spelt, which flags count GPUs, take credentials or span several hosts,
    the environment the engine reads, the health endpoint it serves."""

    module: str                             # run as `<python> -m <module> <argv>`
    template: Path                          # the launch script template (Jinja), in the engine's package
    model_flag: str = "model_path"          # the flag that names the model in the launch argv
    false_prefix: str = ""                  # how `flag: false` is written ("--no-"); "" = the flag is left out
    # The parallelism flags whose values multiply to the GPUs one engine uses, each with every profile key the
    # engine's parser accepts for it (aliases); unset counts 1.
    gpu_flags: tuple[tuple[str, ...], ...] = ()
    multinode: MultiNode | None = None      # None: no multi-node launch known
    env_prefixes: tuple[str, ...] = ()      # environment variables the engine reads start with one of these
    # flags (profile keys) that take a credential: always masked (env file, records, drift, the args dump line)
    secret_flags: frozenset[str] = frozenset()
    # credential flags the engine also reads from an environment variable, (flag, variable): render puts a string
    # value in that variable of the 0600 env file and leaves the flag out of argv, which every local user can read
    # (/proc/PID/cmdline); a credential flag not listed stays an argv word (its value from the env file)
    secret_env: tuple[tuple[str, str], ...] = ()
    # the engine takes its other credential flags only from argv: launch.sh starts it through render's argv shim
    # (`python -c SHIM module ...`), which appends them to the module's sys.argv in memory from the env file's
    # variables; /proc/PID/cmdline (what every local user reads) keeps the shim's words, never a secret
    secret_argv_shim: bool = False
    health_path: str = "/health"
    revision_flag: str = "revision"         # the flag that pins the model's hub commit (engine.weights, issue 25)
    completion_path: str = "/v1/completions"  # where a one-token completion is asked (the readiness probe)
    # the flag (profile key) that makes the engine finish the requests in flight for N seconds after SIGTERM: render
    # sets it from restart.drain_s unless the profile sets it; None: the engine drains (or not) by itself
    drain_flag: str | None = None
    drain_since: str | None = None          # the first release that has drain_flag (None: every release covered)

    def drain_flag_for(self, version: str | None) -> str | None:
        """The drain flag an engine of `version` takes; None when that release predates it. An unknown (or
        unparsable) version is assumed to have it: preflight, which reads the target's version, says otherwise."""
        if self.drain_flag is None or self.drain_since is None or version is None or version_key(version) is None:
            return self.drain_flag
        return self.drain_flag if at_least(version, self.drain_since) else None

    def secret_env_var(self, flag: str) -> str | None:
        """The environment variable the engine reads `flag`'s credential from; None when only its argv has it."""
        return next((var for name, var in self.secret_env if name == flag), None)

    def gpus_per_engine(self, args: dict[str, Any]) -> int:
        """The GPUs one engine uses according to its parallelism flags in `args` (1 when none is set)."""
        count = 1
        for names in self.gpu_flags:
            count *= next((v for v in (args.get(n) for n in names)
                           if isinstance(v, int) and not isinstance(v, bool) and v > 0), 1)
        return count


@dataclass(frozen=True)
class LogFormat:
    """What the engine's own log says and how: its logger's line prefix, the startup phases, the ready line, the
    args dump it prints at startup, its argparse prog, and the marks that tell its log from another engine's."""

    ready_line: str                         # printed once the server serves requests
    phases: tuple[Phase, ...]               # progress lines, in startup order
    args_dump: re.Pattern[str] | None = None  # the startup line of the args dump; group 1 starts the dict
    args_dump_complete: bool = True         # every flag is in the dump (else only the non-default ones)
    prefix: re.Pattern[str] | None = None   # the logger's line prefix, group "tag" = process/rank
    # Marks only this engine's log carries (its own logger prefix, args dump, argparse prog, install paths),
    # MULTILINE: `deployer.engines.detect` names the engine of a log from them.
    markers: tuple[re.Pattern[str], ...] = ()
    cli_prog: str = ""                      # the engine CLI's name in its argparse usage ("<kind> serve")
    # the lines that say what it allocated for the KV cache (named groups: tokens, k_gb + v_gb, or gib)
    kv_allocated: tuple[re.Pattern[str], ...] = ()

    def phase_of(self, line: str) -> str | None:
        for phase in self.phases:
            if phase.pattern.search(line):
                return phase.name
        return None

    def phases_in(self, log: str) -> list[str]:
        """The phases a log enters, in order, as the watcher sees them (a phase counts when it differs from the
        one before; a progress bar's \\r redraws are lines of their own)."""
        seen: list[str] = []
        for line in log.replace("\r", "\n").split("\n"):
            phase = self.phase_of(line)
            if phase and (not seen or seen[-1] != phase):
                seen.append(phase)
        return seen


@dataclass(frozen=True, eq=False)
class Knowledge:
    """What deployer knows of the engine's failures and flag history, as data files in the engine's package
    (each with the sources of its texts): failure signatures, flag/env renames by version, the follow-on startup
    checks a remedy must also satisfy, the names of its serving metrics; and the values the engine rewrites to an
    equivalent name. None: no such table. Compared by identity (one per engine), so the table readers can cache by it."""

    signatures: Path | None = None          # failure signatures (YAML)
    renames: Path | None = None             # flag/env renames by version (YAML)
    followons: Path | None = None           # startup checks a remedy must also satisfy (YAML)
    metrics: Path | None = None             # the names of its /metrics quantities (YAML; deployer.observe.names)
    releases: Path | None = None            # the releases this knowledge covers (YAML; deployer.engines.releases)
    value_aliases: dict[str, dict[str, str]] = field(default_factory=dict)  # flag -> {given: engine's name}


@dataclass(frozen=True)
class Install:
    """Which installed package is the engine: the import package whose version the target reports, and the
    distributions (package metadata names) that may install it, tried in order."""

    package: str
    distributions: tuple[str, ...] = ()     # () = the package's own name

    @property
    def names(self) -> tuple[str, ...]:
        return self.distributions or (self.package,)


@dataclass(frozen=True)
class Probe:
    """The script the target's engine python runs (stdlib and the engine only) to report the flags the installed
    engine accepts and how it resolves a profile's args, on one `DEPLOYER_PROBE_JSON {...}` line."""

    script: Path                            # the probe module's file, in the engine's package

    def source(self) -> str:
        """The probe's text, to be run as `<python> -c <text> ...` by the target's engine python."""
        return self.script.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Docs:
    """What help texts and messages show of the engine."""

    image_example: str = ""                 # a container image of the engine


@dataclass(frozen=True, eq=False)
class Engine:
    """Everything deployer knows about one inference engine, one part per concern; found by the registry
    (deployer.engines.engine_for, detect). Compared by identity: the registry holds one per kind."""

    kind: str
    launch: Launch
    log: LogFormat
    knowledge: Knowledge
    install: Install
    probe: Probe
    memory: MemoryModel | None = None       # the engine's GPU memory model for preflight; None: none known
    docs: Docs = Docs()

    def masked(self, line: str) -> str:
        """The line with the values of secret flags in the engine's args dump replaced by '***'.

        Some releases print `'api_key': ['sk-...']` in clear in their args dump (see the engine's spec)."""
        secret = self.launch.secret_flags
        if not secret or self.log.args_dump is None or not self.log.args_dump.search(line):
            return line
        return _secret_values(secret).sub(lambda m: m.group(1) + "'***'", line)


@lru_cache(maxsize=8)
def _secret_values(names: frozenset[str]) -> re.Pattern[str]:
    """`'name': value` (dict repr) or `name=value` (call repr): a quoted string, a list, or a bare word."""
    keys = "|".join(re.escape(n) for n in sorted(names))
    return re.compile(r"""((?:'|")?\b(?:""" + keys + r""")\b(?:'|")?\s*[:=]\s*)"""
                      r"""(\[[^\]]*\]|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^,})\s]+)""")
