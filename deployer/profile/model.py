"""Deployment profiles: the Pydantic model (strict, `extra="forbid"`) and loading from YAML.

Loading layers `extends:` files, expands `${VAR}` from the local environment, applies CLI overrides
(`--set a.b=c`, `--host`) and validates. Every failure is a `ProfileError` naming file, line and field.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, SerializerFunctionWrapHandler,
                      ValidationInfo, field_validator, model_serializer, model_validator)

from deployer.host import NAME_RE, probe_address
from deployer import engines
from deployer.engines import engine_for
from deployer.engines import kinds
from deployer.flag_names import option_key
from deployer.observe.timeline import TimeoutRule
from deployer.secrets import MASK, hidden_values, is_secret_env_name, mask_leaves

ArgScalar = Union[bool, int, float, str]
ArgValue = Union[ArgScalar, list[ArgScalar], dict[str, Any], None]

FLAG_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Policies of the model gateway `smg` (PyPI smg 1.13.0, smg/router_args.py COMMON_POLICY_CHOICES).
ROUTER_POLICIES = ("random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load",
                   "manual", "consistent_hashing", "prefix_hash")
# Flags the profile sets through dedicated fields; giving them in `args` too would be ambiguous.
RESERVED_ARGS = {"model_path": "engine.model_path", "port": "engine.port", "host": "engine.host"}


@dataclass(frozen=True)
class UnsetVar:
    """A `${VAR}` that the local environment does not set (allowed by validate and render, not by up)."""

    name: str
    field: str
    file: str | None
    line: int | None

    def warning(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file and self.line else f"{self.file}: " if self.file else ""
        return (f"{where}{self.field}: ${{{self.name}}} is not set here; `up` takes it from the local "
                "environment and writes it only to the target's 0600 env file")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=False)


class Target(Strict):
    """The box a deployment runs on, reached over SSH (`~/.ssh/config` is read: HostName, User, Port, IdentityFile,
    ProxyJump, ProxyCommand), and the directory that holds its deployments."""

    host: str = Field(min_length=1, description='hostname, ~/.ssh/config alias, or "local"')
    user: str | None = Field(default=None, description="the SSH user (default: ~/.ssh/config's, else yours)")
    port: int | None = Field(default=None, ge=1, le=65535, description="the SSH port (default: ~/.ssh/config's, "
                             "else 22)")
    identity_file: str | None = Field(default=None, description="the private key (default: ~/.ssh/config's, "
                                      "else the ssh-agent's keys)")
    known_hosts: str | None = Field(default=None, description="the known_hosts file host keys are checked against "
                                    "(default: ~/.ssh/config's UserKnownHostsFile, else ~/.ssh/known_hosts)")
    workdir: str = Field(default="/workspace/deployer", min_length=1,
                         description="absolute directory on the target holding <workdir>/<name>/; only the "
                                     "deploying user may write it")

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not (v.startswith("/") or v.startswith("~")):
            raise ValueError("must be an absolute path (or start with ~)")
        if "\x00" in v or "\n" in v:
            raise ValueError("must not contain NUL or newline")
        return v.rstrip("/") or "/"


class Replica(Target):
    """One engine of a `replicas:` fleet: a full target plus what may differ per replica."""

    gpus: list[int] | None = Field(default=None, description="this replica's GPUs (default engine.gpus)")
    engine_port: int | None = Field(default=None, ge=1, le=65535,
                                    description="this replica's engine port (default engine.port; two replicas on "
                                                "one host need distinct ones)")
    listen: str | None = Field(default=None, min_length=1,
                               description="address the engine binds, where the router reaches it "
                                           "(default: the replica's host address; never 0.0.0.0 unless asked)")


class Node(Target):
    """One host of a multi-node engine (`nodes:`); node_rank is its position in the list."""

    gpus: list[int] | None = Field(default=None, description="this node's GPUs (default engine.gpus)")
    engine_port: int | None = Field(default=None, ge=1, le=65535,
                                    description="this node's engine port (rank 0: the API; others: the dummy "
                                                "health); default engine.port")


class RouterTarget(Strict):
    """Where the router runs: target fields, host optional (default: the first replica's host)."""

    host: str | None = Field(default=None, min_length=1, description="default: the first replica's host")
    user: str | None = Field(default=None, description="as target.user (default: that replica's)")
    port: int | None = Field(default=None, ge=1, le=65535, description="as target.port")
    identity_file: str | None = Field(default=None, description="as target.identity_file")
    known_hosts: str | None = Field(default=None, description="as target.known_hosts")
    workdir: str | None = Field(default=None, description="as target.workdir (default: that replica's)")


# PEP 508 requirement specifiers, for when `packaging` is not installed: a name, extras, either version clauses or
# `@ URL`, then an optional `; marker` (checked for being non-empty only).
_REQ_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REQ_CLAUSE = r"(?:~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9_.*+!-]+"
_REQ_CLAUSES = rf"{_REQ_CLAUSE}(?:\s*,\s*{_REQ_CLAUSE})*"
REQUIREMENT_RE = re.compile(
    rf"^\s*(?P<name>{_REQ_NAME})\s*(?P<extras>\[\s*(?:{_REQ_NAME}(?:\s*,\s*{_REQ_NAME})*)?\s*\])?\s*"
    rf"(?:(?P<spec>{_REQ_CLAUSES}|\(\s*{_REQ_CLAUSES}\s*\))|@\s*(?P<url>[^\s;]+))?\s*"
    r"(?:;\s*(?P<marker>\S.*?))?\s*$")

try:  # the same parser pip uses, where it is installed
    from packaging.requirements import InvalidRequirement as _InvalidRequirement
    from packaging.requirements import Requirement as _Requirement
except ImportError:  # pragma: no cover - exercised through check_requirement_text
    _Requirement = None  # type: ignore[assignment,misc]


def check_requirement_text(text: str) -> str:
    """Refuses what is not one pip requirement specifier (`vllm==0.11.0`, `sglang[all]>=0.5`, `pkg @ file:///w.whl`);
    `packaging` decides where it is installed, REQUIREMENT_RE otherwise. Options (`-r`, `--pre`) are not packages."""
    stripped = text.strip()
    if not stripped or stripped.startswith("-") or "\n" in stripped or "\x00" in stripped:
        raise ValueError(f"{text!r} is not a requirement specifier (like vllm==0.11.0)")
    if _Requirement is not None:
        try:
            _Requirement(stripped)
        except _InvalidRequirement as exc:
            raise ValueError(f"{text!r} is not a requirement specifier: {exc}") from None
        return stripped
    if not REQUIREMENT_RE.match(stripped):
        raise ValueError(f"{text!r} is not a requirement specifier (like vllm==0.11.0)")
    return stripped


RequirementText = Annotated[str, AfterValidator(check_requirement_text)]


DIST_NAME_RE = re.compile(r"\A[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\Z")


def _dist_key(name: str) -> str:
    """A distribution name as PEP 503 compares them (case, runs of - _ . alike)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class EngineInstall(Strict):
    """`engine.install`: the managed engine environment deployer builds on the target (deployer.prepare), keyed by
    a hash of these fields, under `<workdir>/.deployer/envs/<hash>/`; the engine runs from its python."""

    packages: list[RequirementText] = Field(min_length=1,
                                            description="pip requirement specifiers, e.g. vllm==0.11.0")
    index_url: str | None = Field(default=None, min_length=1,
                                  description="the package index (pip --index-url); default: the target's own")
    extra_index_urls: list[str] = Field(default_factory=list, description="more indexes (pip --extra-index-url)")
    find_links: list[str] = Field(default_factory=list,
                                  description="wheel directories or pages on the target (pip --find-links)")
    python: str = Field(default="python3", min_length=1,
                        description="the interpreter on the target the environment is built with")
    remove: list[str] = Field(default_factory=list,
                              description="distributions uninstalled after the install: a dependency the packages "
                                          "drag in that breaks the environment (e.g. PyPI's CUDA torchvision beside "
                                          "a CPU torch)")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """Unknown keys refused with a did-you-mean here: the loader suggests only for sections that are always
        present, and `install` is optional."""
        if isinstance(data, dict):
            known = list(cls.model_fields)
            for key in data:
                if key not in known:
                    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"unknown key {key!r}{suggestion}; known keys: {', '.join(sorted(known))}")
        return data

    @field_validator("packages")
    @classmethod
    def _packages(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a package is listed twice")
        return v

    @field_validator("remove")
    @classmethod
    def _remove(cls, v: list[str]) -> list[str]:
        for name in v:
            if not DIST_NAME_RE.match(name):
                raise ValueError(f"{name!r}: a distribution name (letters, digits, . _ -), no version")
        if len({_dist_key(n) for n in v}) != len(v):
            raise ValueError("a distribution is listed twice")
        return v

    @model_validator(mode="after")
    def _remove_not_asked_for(self) -> EngineInstall:
        asked = {_dist_key(re.split(r"[\[<>=!~;@ ]", p, maxsplit=1)[0]) for p in self.packages}
        both = sorted(n for n in self.remove if _dist_key(n) in asked)
        if both:
            raise ValueError(f"remove lists {', '.join(both)}, which packages asks for: remove it from one of them")
        return self

    @field_validator("index_url", "python")
    @classmethod
    def _one_line(cls, v: str | None) -> str | None:
        if v is not None and (v != v.strip() or any(c in v for c in "\n\x00")):
            raise ValueError("must be one word without spaces, newline or NUL")
        return v

    @field_validator("extra_index_urls", "find_links")
    @classmethod
    def _locations(cls, v: list[str]) -> list[str]:
        for item in v:
            if not item or item != item.strip() or any(c in item for c in " \t\n\x00"):
                raise ValueError(f"{item!r}: a path or URL without spaces, newline or NUL")
        return v


class Router(Strict):
    """The model gateway `smg` (PyPI) in front of the replicas: run by `python`, or from the environment deployer
    builds on the router's host (`install`, as engine.install)."""

    target: RouterTarget = Field(default_factory=RouterTarget, description="where the router runs")
    install: EngineInstall | None = Field(default=None,
                                          description="build the router's environment (smg) on its host, as "
                                                      "engine.install (excludes python)")
    python: str = Field(default="python3", min_length=1, description="the python that has `smg` installed")
    port: int = Field(default=8000, ge=1, le=65535, description="the port clients send requests to")
    policy: str = Field(default="cache_aware", min_length=1, description="any policy smg accepts")
    args: dict[str, ArgValue] = Field(default_factory=dict, description="extra smg flags, as engine.args")

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> Any:
        return _flag_mapping(v, reserved={"port": "router.port", "policy": "router.policy"})

    @field_validator("python")
    @classmethod
    def _python_or_install(cls, v: str, info: ValidationInfo) -> str:
        """As engine.python: a python written beside `install` is two ways to say where smg comes from."""
        if info.data.get("install") is not None:
            raise ValueError("router.python and router.install exclude each other: `python` names an environment "
                             "that has smg, `install` has deployer build one (remove one of them)")
        return v


REVISION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*$"  # no `..` part: refs/<rev>
HUB_REPO_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class EngineWeights(Strict):
    """`engine.weights`: deployer fetches the hub repo engine.model_path names onto the target before anything is
    stopped (deployer.prepare.weights), and the engine loads that commit from the cache, offline. With `push`,
    engine.model_path is a directory on the controller instead (relative to the profile file), pushed to the
    target under the workdir, keyed by its content (deployer.prepare.pushed); a run records that key (`pushed`)."""

    revision: str = Field(default="main", min_length=1, max_length=200, pattern=REVISION_PATTERN,
                          description="the branch, tag or commit to fetch; the commit it named is recorded per run")
    endpoint: str | None = Field(default=None, pattern=r"^https?://\S+$",
                                 description="the hub (default: HF_ENDPOINT in engine.env or on the target, "
                                             "else https://huggingface.co)")
    connections: int = Field(default=8, ge=1, le=32,
                             description="a large file is fetched in parts over this many connections at once "
                                         "(1: one stream per file)")
    push: bool = Field(default=False, description="model_path is a directory on the controller: push it to the "
                                                  "target (resumable, sha256 per file) instead of fetching a repo")
    pushed: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                               description="set by deployer in a run's record: the content hash of the directory "
                                           "pushed (model_path is then its place on the target)")

    @model_validator(mode="after")
    def _one_source(self) -> EngineWeights:
        hub = [name for name, default in (("endpoint", None), ("revision", "main"), ("connections", 8))
               if getattr(self, name) != default]
        if self.push and hub:  # (a run's record writes the defaults out)
            raise ValueError(f"weights.push sends a directory from here; weights.{hub[0]} is for a hub repo "
                             "(remove one of them)")
        if self.pushed is not None and not self.push:
            raise ValueError("weights.pushed is the record of a push: it needs weights.push")
        return self


# A profile without engine.kind is SGLang's (the first engine: profiles and records written before a second engine
# existed name none). The one default engine in the code (README, "Profiles"); nothing below the profile defaults.
DEFAULT_ENGINE_KIND = "sglang"


class Engine(Strict):
    """The inference engine: which one, where its environment comes from, the model, and its flags and
    environment as the engine takes them."""

    kind: str = Field(default=DEFAULT_ENGINE_KIND,
                      description="the inference engine: a kind registered in deployer.engines",
                      json_schema_extra={"enum": list(kinds())})
    install: EngineInstall | None = Field(default=None,
                                    description="build the engine's environment on the target (excludes python)")
    python: str = Field(default="python3", min_length=1, description="interpreter that has the engine installed")
    model_path: str = Field(min_length=1, description="a hub repo (ORG/NAME) or a directory on the target (with "
                            "weights.push: on this machine)", examples=["Qwen/Qwen3-8B"])
    host: str = Field(default="127.0.0.1", description="the address the engine's HTTP server binds on the target "
                      "(0.0.0.0 serves other machines: set an api_key too)")
    port: int = Field(default=30000, ge=1, le=65535, description="the engine's HTTP port")
    gpus: list[int] | None = Field(default=None, description="GPU indices the engine may use (CUDA_VISIBLE_DEVICES); "
                                   "default: all", examples=[[0, 1]])
    version: str | None = Field(default=None, description="expected engine version (checked by preflight)")
    args: dict[str, ArgValue] = Field(default_factory=dict, description="the engine's flags, as flag: value "
                                      "(true: a bare flag; false or null: left out; a list: several values)",
                                      examples=[{"tp_size": 2, "enable_metrics": True}])
    env: dict[str, str] = Field(default_factory=dict, description="the engine's environment; ${VAR} values come "
                                "from the local environment and stay secret", examples=[{"HF_TOKEN": "${HF_TOKEN}"}])
    dist_init_port: int = Field(default=20000, ge=1, le=65535,
                                description="multi-node (`nodes:`): the rendezvous port on node 0")
    nic: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,15}$",
                            description="multi-node: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME")
    weights: EngineWeights | None = Field(default=None,
                                          description="fetch the hub repo model_path names before the launch")

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (any(g < 0 for g in v) or len(set(v)) != len(v)):
            raise ValueError("GPU indices must be distinct and >= 0")
        return v

    @field_validator("python")
    @classmethod
    def _python_or_install(cls, v: str, info: ValidationInfo) -> str:
        """Only a python written in the profile is validated (defaults are not), so this is `install` and an explicit
        `python` together: two ways to say where the engine comes from."""
        if info.data.get("install") is not None:
            raise ValueError("engine.python and engine.install exclude each other: `python` names an environment "
                             "you built, `install` has deployer build one (remove one of them)")
        return v

    @property
    def definition(self) -> engines.Engine:
        """The registered engine `kind` names: everything deployer knows about it (deployer.engines.Engine)."""
        return engine_for(self.kind)

    @property
    def served_model(self) -> str:
        """The model name the engine serves (its --served-model-name, the first of several; else model_path)."""
        model = self.args.get("served_model_name") or self.model_path
        if isinstance(model, list):  # several names: any one is asked for
            model = model[0] if model else self.model_path
        return str(model)

    @property
    def downloads_at_start(self) -> bool:
        """Whether the engine itself may download its weights while it starts: model_path names a hub repo and
        deployer does not fetch it first (engine.weights). A local path, or weights fetched before the launch,
        leave no download inside the startup."""
        return self.weights is None and bool(HUB_REPO_RE.match(self.model_path))

    @property
    def probe_address(self) -> str:
        """Where deployer reaches the engine from the target: its bind address, or loopback when it binds all."""
        return probe_address(self.host)

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> Any:
        return _flag_mapping(v, reserved=RESERVED_ARGS)

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in kinds():
            close = difflib.get_close_matches(v, list(kinds()), n=1, cutoff=0.6)
            did = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown engine kind {v!r} (known: {', '.join(kinds())}){did}")
        return v

    @model_validator(mode="after")
    def _model_flag(self) -> Engine:
        """The engine's own model flag (Launch.model_flag) is what engine.model_path becomes: never an arg too."""
        flag = self.definition.launch.model_flag
        if flag in self.args:
            raise ValueError(f"set engine.model_path instead of args.{flag} (the {self.kind} flag it becomes)")
        return self

    @model_validator(mode="after")
    def _weights(self) -> Engine:
        """`weights` fetches a hub repo: model_path must name one, and the revision is said in one place (a run's
        record has both, the flag pinned to the weights' commit)."""
        if self.weights is None:
            return self
        if self.weights.push:
            return self._pushed_name()
        if not HUB_REPO_RE.match(self.model_path):
            raise ValueError(f"engine.weights fetches a hub repo, and model_path {self.model_path!r} is not one "
                             "(org/name); remove engine.weights to load a local path")
        flag = self.definition.launch.revision_flag
        if flag in self.args and self.args[flag] != self.weights.revision:
            raise ValueError(f"set engine.weights.revision instead of args.{flag}")
        return self

    def _pushed_name(self) -> Engine:
        """A pushed directory lands at a path named by its content; the name the engine serves stays the directory's
        own (args.served_model_name, else its last part), so clients keep it across pushes."""
        flag = self.definition.launch.revision_flag
        if flag in self.args:
            raise ValueError(f"args.{flag} names a hub commit; engine.weights.push loads a directory")
        if "served_model_name" not in self.args:
            name = self.model_path.rstrip("/").rsplit("/", 1)[-1] if self.weights and self.weights.pushed is None \
                else None
            if name:
                self.args = {**self.args, "served_model_name": name}
        return self

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError("must be a mapping of NAME to value")
        out: dict[str, str] = {}
        for key, value in v.items():
            if not isinstance(key, str) or not ENV_KEY_RE.match(key):
                raise ValueError(f"bad environment variable name {key!r}")
            if isinstance(value, bool):
                value = "1" if value else "0"
            if isinstance(value, (int, float)):
                value = str(value)
            if not isinstance(value, str):
                raise ValueError(f"{key}: value must be a string")
            _check_text(value, f"env.{key}")
            out[key] = value
        return out


def _flag_mapping(v: Any, *, reserved: dict[str, str]) -> dict[str, Any]:
    """`flag: value` as written in a profile -> snake_case keys; reserved keys point at their own field."""
    if not isinstance(v, dict):
        raise ValueError("must be a mapping of flag name to value")
    out: dict[str, Any] = {}
    for key, value in v.items():
        key = str(key)
        if key.startswith("--"):
            key = key[2:]
        if not FLAG_KEY_RE.match(key):
            raise ValueError(f"bad flag name {key!r} (use snake_case like tp_size)")
        snake = option_key(key)
        if snake in out:
            raise ValueError(f"flag {snake!r} is given twice (as {snake} and {key})")
        if snake in reserved:
            raise ValueError(f"set {reserved[snake]} instead of args.{snake}")
        _check_text(value, f"args.{snake}")
        out[snake] = value
    return out


def _check_text(value: Any, where: str) -> None:
    """Values end up in argv or the environment, where NUL cannot exist."""
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(f"{where}: NUL character is not allowed")
    if isinstance(value, list):
        for item in value:
            _check_text(item, where)


class Health(Strict):
    """When the engine counts as ready, and how long a start may take: /health, then a one-token completion."""

    path: str = Field(default="/health", pattern=r"^/[\x21-\x7e]*$", description="the engine's health endpoint")
    interval_s: float = Field(default=2.0, gt=0, le=300, description="seconds between health checks while it starts")
    startup_timeout_s: Union[float, Literal["auto"]] = Field(
        default=1800.0, description="seconds, or auto: derived from this start's history on the target "
        "(observe/timeline.py auto_startup_timeout; without 3 earlier starts: 1800)")
    stall_timeout_s: float = Field(default=600.0, gt=0, description="no progress at all (log output, a download) "
                                   "for this long while starting: a hang")
    request_timeout_s: float = Field(default=5.0, gt=0, le=120, description="how long one health check waits")
    probe_interval_s: float = Field(default=30.0, ge=0, le=86400,
                                    description="after ready, a one-token completion this often (0: off)")
    probe_failures: int = Field(default=3, ge=1, le=100, description="failed probes in a row, while no request is "
                                "running or waiting, that count as a crash (under load: unhealthy, never a restart)")
    probe_timeout_s: float = Field(default=30.0, gt=0, le=600, description="how long one probe waits for its token")
    probe_exit_grace_s: float = Field(
        default=60.0, ge=0, le=3600, description="while /health fails along with the probes, how long the engine "
        "gets to exit on its own (its exit is then the crash, with its diagnosis) before the probes count as one "
        "(an engine that never exits: SGLang's frozen scheduler)")
    hang_s: Union[float, Literal["auto", "off"]] = Field(
        default="auto", description="after ready, requests running or waiting and no engine step (the engine's "
        "progress counters, its metrics.yaml) for this long: hung, its stacks taken, restarted like a crash; auto: "
        "10x the longest step seen, within 20..300 s (60 s before a step was seen); off: the supervisor never "
        "reads /metrics for it")

    @field_validator("hang_s", mode="before")
    @classmethod
    def _hang_seconds_or_auto(cls, value: Any) -> Any:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value in ("auto", "off") or (number and 0 < value <= 86400):
            return value
        raise ValueError(f"{value!r}: a number of seconds (0 < s <= 86400), auto or off")

    @field_validator("startup_timeout_s", mode="before")
    @classmethod
    def _seconds_or_auto(cls, value: Any) -> Any:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value == "auto" or (number and value > 0):
            return value
        raise ValueError(f"{value!r}: a number of seconds greater than 0, or auto")

    @property
    def startup_deadline_s(self) -> float:
        """The startup deadline in seconds: the fixed one, or for `auto` the rule's fallback (`up` replaces `auto`
        with the number derived from the history before it watches)."""
        if self.startup_timeout_s == "auto":
            return TimeoutRule().no_history_s
        return float(self.startup_timeout_s)


class Retry(Strict):
    """The attempts of one `up`: how many, and whether a known failure's change is applied between them."""

    max_attempts: int = Field(default=3, ge=1, le=20, description="attempts of one up, the first included")
    heal: bool = Field(default=True, description="apply a known failure's change before the next attempt "
                       "(--no-heal: diagnose only)")
    backoff_s: float = Field(default=2.0, ge=0, le=600, description="wait before retrying a transient failure")


class Restart(Strict):
    """What the supervisor on the target does when the engine ends after ready without being asked to."""

    policy: Literal["no", "on-failure", "always"] = Field(
        default="on-failure", description="a crash after ready (any end deployer did not ask for) is restarted on "
        "the target with backoff, up to `max` in `window_s` (then crashloop); `no` leaves it down")
    max: int = Field(default=5, ge=0, le=1000, description="restarts within window_s before it is a crashloop "
                     "(and left down)")
    backoff_s: tuple[float, float] = Field(default=(10.0, 300.0), description="[min, max] seconds before a restart, "
                                           "doubling from min")
    window_s: float = Field(default=600.0, gt=0, description="the window max counts restarts in")
    stable_s: float = Field(default=60.0, gt=0, le=86400,
                            description="ready this long without a crash: the version counts as good (rollback)")
    on_boot: bool = Field(default=True, description="start the deployment again when the box reboots "
                          "(an @reboot entry in the user's crontab; removed by `down`)")
    grace_s: float = Field(default=30.0, ge=0, le=3600, description="SIGTERM to SIGKILL on stop")
    drain_s: float = Field(default=0.0, ge=0, le=3600, description="on stop (down, restart, a replace): seconds "
                           "the engine may finish the requests in flight after SIGTERM before the grace starts (vLLM "
                           "gets --shutdown-timeout; SGLang drains on SIGTERM by itself); 0: as before")

    @field_validator("backoff_s")
    @classmethod
    def _backoff(cls, v: tuple[float, float]) -> tuple[float, float]:
        if v[0] < 0 or v[1] < v[0]:
            raise ValueError("backoff_s must be [min, max] with 0 <= min <= max")
        return v


class Logs(Strict):
    """The rotation of the engine's log on the target (engine.log)."""

    max_bytes: int = Field(default=256 << 20, ge=64 << 10, description="engine.log is rotated past this size")
    head_bytes: int = Field(default=1 << 20, ge=0, description="the start of engine.log (the engine's startup "
                            "lines) kept in place at every rotation")
    keep: int = Field(default=2, ge=1, le=20, description="rotated tails kept (engine.log.1 is the newest)")

    @model_validator(mode="after")
    def _head_below_max(self) -> "Logs":
        if self.head_bytes >= self.max_bytes:
            raise ValueError("logs.head_bytes must be below logs.max_bytes")
        return self


class Retention(Strict):
    """How much of a deployment's past stays on the target."""

    keep_runs: int = Field(default=10, ge=1, le=10000,
                           description="run dirs kept per deployment (the current and last good run always stay)")


class Canary(Strict):
    """The gates of a fleet's canary (`deploy up --canary`, deployer/deployments/fleet/canary.py): the first replica replaced is
    compared with the replicas still on the old version over `window_s` of live traffic, then promoted or rolled
    back."""

    window_s: float = Field(default=60.0, gt=0, le=3600, description="how long the canary's live metrics are "
                            "compared with the other replicas' (the traffic the router sends them)")
    min_requests: int = Field(default=20, ge=1, description="requests the canary (and the others together) must "
                              "serve in the window; fewer: it cannot be judged and is rolled back")
    max_error_rate_delta: float = Field(default=0.01, ge=0, le=1, description="the canary's share of 5xx answers "
                                        "may exceed the others' by at most this (0.01: one point)")
    max_p99_ratio: float = Field(default=1.5, ge=1, description="the canary's TTFT p99 and ITL p99 may be at most "
                                 "this many times the others'")
    min_tokens_per_s_ratio: float = Field(default=0.8, gt=0, le=1, description="the canary's generated tokens/s "
                                          "must be at least this share of the others' mean")


class Rollout(Strict):
    """How a serving fleet is moved to a changed profile: the canary's gates, then the rest in batches."""

    max_unavailable: int = Field(default=1, ge=1, description="replicas replaced at once after the canary (each "
                                 "batch out of the router, replaced, back in; the others serve meanwhile)")
    canary: Canary = Field(default_factory=Canary)


class UpgradeGates(Strict):
    """`deploy upgrade --apply`'s load check: the new release against the old one measured just before the switch;
    a latency gate fails when the new value is over `ratio` times the old AND over it by more than `slack_ms` (tiny
    latencies are noisy), the throughput gate alike on the time per request. A failed gate switches back."""

    ttft_ratio_max: float = Field(default=1.25, gt=0, description="time to first token (median), new/old")
    itl_ratio_max: float = Field(default=1.25, gt=0, description="inter-token latency (median), new/old")
    throughput_ratio_min: float = Field(default=0.8, gt=0, le=1, description="output tokens/s, new/old")
    slack_ms: float = Field(default=20.0, ge=0, description="a latency gate fails only by more than this")
    requests: int = Field(default=5, ge=1, le=100, description="sequential requests of the load check")
    max_tokens: int = Field(default=32, ge=2, le=4096, description="tokens each request asks for")


class Upgrade(Strict):
    """`deploy upgrade`: how a switch to a new engine release is judged."""

    gates: UpgradeGates = Field(default_factory=UpgradeGates)


class Profile(Strict):
    """A deployment profile: one engine on one host (`target`), a fleet (`replicas`, `router`) or one engine across
    nodes (`nodes`). Unknown keys are errors."""

    name: str = Field(pattern=NAME_RE, max_length=63, description="names the deployment on the target "
                      "(<workdir>/<name>/): lowercase letters, digits and -")
    extends: str | None = Field(default=None, description="profile file layered under this one (relative path)")
    template: str | None = Field(default=None, description="launch script template (relative to the profile)")
    target: Target = Field(description="the host (single-host profiles); with replicas/nodes: the first one's")
    engine: Engine
    health: Health = Field(default_factory=Health)
    retry: Retry = Field(default_factory=Retry)
    restart: Restart = Field(default_factory=Restart)
    replicas: list[Replica] | int | None = Field(
        default=None, description="one engine per entry (each a full target), or a count (Kubernetes export)")
    nodes: list[Node] | None = Field(default=None, min_length=2,
                                     description="ONE engine spread over these hosts, node_rank in this order")
    router: Router | None = Field(default=None, description="the model gateway in front of a fleet's replicas")
    rollout: Rollout | None = Field(default=None, description="a fleet's canary and batches (deploy up --canary); "
                                    "the defaults of each key when not given")
    retention: Retention = Field(default_factory=Retention)
    logs: Logs = Field(default_factory=Logs)
    upgrade: Upgrade | None = Field(default=None, description="deploy upgrade --apply: the load check's gates "
                                    "(absent: the defaults)")

    # Not part of the schema: where the profile came from and which values are secret. `_templates` maps the
    # dotted path of every value that came from `${VAR}` (engine.env.HF_TOKEN, engine.args.lora_paths.1) to its
    # text as written: that path's value is secret, and the text says where it comes from.
    _source: Path | None = PrivateAttr(default=None)
    _secret_env: frozenset[str] = PrivateAttr(default=frozenset())
    _secret_args: frozenset[str] = PrivateAttr(default=frozenset())
    _templates: dict[str, str] = PrivateAttr(default_factory=dict)
    _unset: list[UnsetVar] = PrivateAttr(default_factory=list)  # `${VAR}`s not set here (validate, render)
    _files: list[Path] = PrivateAttr(default_factory=list)  # the files it was read from (extends chain)
    _lines: dict[str, tuple[str, int]] = PrivateAttr(default_factory=dict)  # dotted path -> (file, line)

    @model_validator(mode="before")
    @classmethod
    def _primary_target(cls, data: Any) -> Any:
        """`replicas:` (hosts) and `nodes:` exclude `target:` and each other; the first host becomes `target`."""
        if not isinstance(data, dict):
            return data
        replicas, nodes = data.get("replicas"), data.get("nodes")
        hosts = replicas if isinstance(replicas, list) else None
        if hosts is not None and nodes is not None:
            raise ValueError("replicas and nodes exclude each other (a multi-node replica is not supported yet)")
        group = hosts if hosts is not None else nodes
        if group is None:
            if data.get("router") is not None and replicas is None:
                raise ValueError("router needs replicas to route to")
            return data
        if "target" in data:
            raise ValueError(f"target: not allowed with {'replicas' if hosts is not None else 'nodes'} "
                             "(each entry is its own target)")
        if not group or not isinstance(group[0], dict):
            return data  # the field validators say what is wrong
        data = dict(data)
        data["target"] = {k: v for k, v in group[0].items() if k in Target.model_fields}
        return data

    @model_serializer(mode="wrap")
    def _no_rollout_key(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A profile without `rollout:` or `upgrade:` is dumped without the key: the records an earlier release
        reads back (strictly) stay as it wrote them."""
        data = handler(self)
        for key in ("rollout", "upgrade"):
            if isinstance(data, dict) and data.get(key) is None:
                data.pop(key, None)
        return data

    @model_validator(mode="after")
    def _router_policy(self) -> Profile:
        if self.router is not None and self.router.policy not in ROUTER_POLICIES:
            raise ValueError(f"router.policy {self.router.policy!r}: not one of {', '.join(ROUTER_POLICIES)}")
        return self

    @property
    def is_fleet(self) -> bool:
        """More than one engine or host: replicas, nodes or a router."""
        return self.replicas is not None or self.nodes is not None or self.router is not None

    @model_validator(mode="after")
    def _stall_vs_startup(self) -> Profile:
        if self.health.startup_timeout_s != "auto" and self.health.stall_timeout_s > self.health.startup_timeout_s:
            self.health.stall_timeout_s = self.health.startup_timeout_s
        return self

    @property
    def source(self) -> Path | None:
        return self._source

    @property
    def files(self) -> list[Path]:
        """Every file this profile was read from, resolved: its `extends:` chain, base first, itself last."""
        return list(self._files)

    def where(self, path: str) -> tuple[str | None, int | None]:
        """(file, line) a dotted path (`engine.args.tp_size`) was written at, else its nearest written parent's;
        (the profile's file, None) when nothing of it was written in a file (a default, a `--set`)."""
        parts = path.split(".")
        for end in range(len(parts), 0, -1):
            hit = self._lines.get(".".join(parts[:end]))
            if hit:
                return hit[0], hit[1] or None
        return (str(self._source) if self._source else None), None

    def written(self, path: str) -> tuple[str | None, int | None]:
        """(file, line) exactly this dotted path's value came from: a file, "--set", "--host" or "env VAR" (line
        None), or (None, None) for a default of the model."""
        hit = self._lines.get(path)
        return (hit[0], hit[1] or None) if hit else (None, None)

    @property
    def unset(self) -> list[UnsetVar]:
        """The `${VAR}`s the local environment does not set (only when loaded with allow_unset)."""
        return list(self._unset)

    @property
    def templates(self) -> dict[str, str]:
        """Dotted path -> `${VAR}` text as written, for every value that came from the local environment."""
        return dict(self._templates)

    def secret_env_keys(self) -> frozenset[str]:
        """Env keys whose values must never be shown: secret words in the name, or a `${VAR}`-sourced value."""
        looks_secret = {k for k in self.engine.env if is_secret_env_name(k)}
        sourced = {k for k in self.engine.env if f"engine.env.{k}" in self._templates}
        return frozenset(looks_secret | sourced) | self._secret_env

    def secret_arg_keys(self) -> frozenset[str]:
        """Flags with a secret value (or item): the engine's secret flags and `${VAR}`-sourced ones."""
        listed = self.engine.definition.launch.secret_flags
        sourced = {k for k in self.engine.args if _under(self._templates, f"engine.args.{k}")}
        return frozenset({k for k in self.engine.args if k in listed} | sourced) | self._secret_args

    def secret_arg_paths(self, name: str) -> tuple[bool, frozenset[str]]:
        """(whole value secret, dotted sub-paths of the secret items) for one flag of engine.args."""
        whole = name in self.engine.definition.launch.secret_flags or name in self._secret_args or \
            f"engine.args.{name}" in self._templates
        prefix = f"engine.args.{name}."
        return whole, frozenset(p[len(prefix):] for p in self._templates if p.startswith(prefix))

    def masked_arg(self, name: str, value: Any) -> Any:
        """One flag's value as it may be shown: secret scalars, items and leaves replaced by ***."""
        if value is None or isinstance(value, bool):
            return value
        whole, items = self.secret_arg_paths(name)
        if whole:
            return [MASK for _ in value] if isinstance(value, list) else MASK
        return mask_leaves(value, items, "") if items else value

    def written_arg(self, name: str, value: Any) -> Any:
        """One flag's value as the user wrote it: `${VAR}` text where the value came from the environment."""
        def walk(item: Any, path: str) -> Any:
            if path in self._templates:
                return self._templates[path]
            if isinstance(item, dict):
                return {k: walk(v, f"{path}.{k}") for k, v in item.items()}
            if isinstance(item, list):
                return [walk(v, f"{path}.{i}") for i, v in enumerate(item)]
            return item

        return walk(value, f"engine.args.{name}")

    def secret_values(self) -> list[str]:
        """Every literal secret value of this profile (to hunt for in text deployer shows or stores)."""
        out = [v for k, v in self.engine.env.items() if k in self.secret_env_keys()]
        for name, value in self.engine.args.items():
            hidden_values(value, self.masked_arg(name, value), out)
        return out

    def patched(self, *, args: dict[str, Any] | None = None, env: dict[str, str | None] | None = None) -> Profile:
        """A copy with engine args/env changed; a value of None removes the key."""
        new_args = dict(self.engine.args)
        for key, value in (args or {}).items():
            if value is None:
                new_args.pop(key, None)
            else:
                new_args[key] = value
        new_env = dict(self.engine.env)
        for key, text in (env or {}).items():
            if text is None:
                new_env.pop(key, None)
            else:
                new_env[key] = text
        engine = self.engine.model_copy(update={"args": new_args, "env": new_env})
        return self.with_engine(engine)

    def with_engine(self, engine: Engine, renamed: dict[str, str] | None = None) -> Profile:
        """A copy with another engine section that keeps what the profile knows about its secrets, following
        flags `renamed` (old key -> new key)."""
        moves = {f"engine.args.{old}": f"engine.args.{new}" for old, new in (renamed or {}).items()}

        def moved(path: str) -> str:
            for old, new in moves.items():
                if path == old or path.startswith(old + "."):
                    return new + path[len(old):]
            return path

        copy = self.model_copy(update={"engine": engine})
        copy._source = self._source
        copy._secret_env = self._secret_env
        copy._secret_args = frozenset((renamed or {}).get(k, k) for k in self._secret_args)
        copy._templates = {moved(p): text for p, text in self._templates.items()}
        copy._unset = list(self._unset)
        copy._files = list(self._files)
        copy._lines = {moved(p): at for p, at in self._lines.items()}
        return copy

    def public_dict(self) -> dict[str, Any]:
        """The profile as plain data with secret env values masked (safe to print or store)."""
        data = self.model_dump(mode="json")
        secret = self.secret_env_keys()
        data["engine"]["env"] = {k: (MASK if k in secret else v) for k, v in self.engine.env.items()}
        data["engine"]["args"] = {k: self.masked_arg(k, v) for k, v in data["engine"]["args"].items()}
        return data


def _under(templates: dict[str, str], path: str) -> bool:
    return path in templates or any(p.startswith(path + ".") for p in templates)

