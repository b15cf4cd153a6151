"""The managed engine environment on a target, end to end: probe the build tools, resolve the spec (a dry run:
nothing installed), check the host against what it would install (compat), then have the helper build it under
its lock once per host (supervisor/install.py's `env_build`) or reuse the one already there.

The target is reached through two callables the caller makes from its connection (`EnvHost`: a shell command and a
helper request), so this module stays below the remote layer. A failure is one line (TargetError, exit 4): the
compatibility problems, or the build's output as diagnose_install says it; never a traceback.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import PreflightFailed, TargetError
from deployer.events import EventSink, PhaseEntered, Warn
from deployer.prepare.compat import FACT_COMMANDS, Demand, HostFacts, Problem, check, estimate_env_bytes, \
    parse_caps, parse_df_available, parse_smi
from deployer.prepare.diagnose_install import diagnose_install
from deployer.prepare.envspec import ENVS_DIR, EnvPaths, EnvRecord, EnvSpec, ResolvedDist, canonical_name
from deployer.prepare.install_plan import SIZES_PY, InstallPlan, PipConfig, Step, TargetTools, parse_pip_config, \
    parse_pip_report, parse_tool_version, parse_uv_compile, plan_install, probe_commands, profile_flags, with_sizes
from deployer.profile.model import EngineInstall

PROBE_TIMEOUT_S = 60.0
RESOLVE_TIMEOUT_S = 600.0
BUILD_TIMEOUT_S = 3600.0
UNPACK_FACTOR = 2.5          # compat.yaml's disk rule uses its own; this is only for what `plan` shows


@dataclass(frozen=True)
class Ran:
    """What one command on the target left behind."""

    exit_code: int
    stdout: str
    stderr: str


Shell = Callable[[str, float, "bytes | None"], Ran]
Call = Callable[[str, "dict[str, Any]", float, str], "dict[str, Any]"]


@dataclass(frozen=True)
class EnvHost:
    """The target as this module needs it: `shell(cmd, timeout, stdin)` and `call(op, fields, wait_s, what)` (the
    helper's request), `workdir` absolute on the target, `label` its name in messages."""

    shell: Shell
    call: Call
    workdir: str
    label: str = "the target"
    engine_env: tuple[tuple[str, str], ...] = ()   # the facts are read as the engine sees the host
    section: str = "engine.install"                # the profile's section the spec comes from, in messages

    def says(self, line: str) -> str:
        """A message written for engine.install, naming this target's section instead (router.install)."""
        return line.replace("engine.install", self.section)

    @property
    def env_name(self) -> str:
        """How messages name the environment: `the environment` (an engine's), `the router.install environment`."""
        return "the environment" if self.section == "engine.install" else f"the {self.section} environment"

    def facts_shell(self, argv: list[str]) -> Ran:
        """`argv` with the engine's environment (CUDA_VISIBLE_DEVICES and the like change what nvidia-smi says)."""
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in self.engine_env)
        return self.shell(exports + " ".join(shlex.quote(a) for a in argv), PROBE_TIMEOUT_S, None)


@dataclass(frozen=True)
class EnvPrepared:
    """What preparing the environment found or did: where it is, whether it was already there, what it holds or
    would hold, the disk it needs (estimate), the compatibility problems (warnings only: errors raise)."""

    spec: EnvSpec
    paths: EnvPaths
    built: bool
    reused: bool
    tool: str
    resolved: tuple[ResolvedDist, ...] = ()
    env_bytes: int = 0
    unknown_sizes: int = 0
    warnings: tuple[str, ...] = ()
    record: EnvRecord | None = None

    @property
    def python(self) -> str:
        return self.paths.python

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.spec.digest, "dir": self.paths.dir, "python": self.python, "built": self.built,
                "reused": self.reused, "tool": self.tool, "env_bytes": self.env_bytes,
                "unknown_sizes": self.unknown_sizes, "warnings": list(self.warnings),
                "packages": [{"name": d.name, "version": d.version, "size": d.size} for d in self.resolved]}

    def lines(self) -> list[str]:
        """What `deploy plan` / `deploy prepare` say of it, one line each."""
        state = "reused" if self.reused else ("built" if self.built else "would be built")
        head = (f"environment {self.spec.digest} ({self.paths.dir}): {state} with {self.tool}; "
                f"{len(self.resolved)} packages, ~{human_bytes(self.env_bytes)} on disk")
        if self.unknown_sizes:
            head += f" (+{self.unknown_sizes} of unknown size)"
        shown = ", ".join(f"{d.name}=={d.version}" for d in self.resolved[:8])
        more = f" and {len(self.resolved) - 8} more" if len(self.resolved) > 8 else ""
        return [head] + ([f"  packages: {shown}{more}"] if shown else []) + [f"  warning: {w}" for w in self.warnings]


def human_bytes(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} B"


def prepare_environment(target: EnvHost, install: EngineInstall, demand: Demand, emit: EventSink, *,
                        build: bool = True) -> EnvPrepared:
    """The environment `install` names, ready on the target (`build`), or only checked and resolved (plan).
    PreflightFailed when the host cannot run what it would install; TargetError when the build fails."""
    spec = EnvSpec.from_install(install)
    paths = EnvPaths.of(target.workdir, spec)
    record = _published(target, paths)
    if record is not None:  # reused: its record says what it holds; the host is still checked against it
        warnings = _checked(target, record.resolved, demand, record.python_version)
        env_bytes, unknown = estimate_env_bytes(record.resolved, UNPACK_FACTOR)
        return EnvPrepared(spec, paths, built=False, reused=True, tool=record.tool, resolved=record.resolved,
                           env_bytes=env_bytes, unknown_sizes=unknown, warnings=warnings, record=record)
    started = time.monotonic()
    emit(PhaseEntered(phase="installing", elapsed=0.0, line=f"resolving {' '.join(spec.packages)}"))
    tools, config = probe(target, spec)
    plan = _plan(spec, target, tools, config)
    resolved = resolve(target, spec, tools, plan)
    warnings = _checked(target, resolved, demand, tools.python_version)
    env_bytes, unknown = estimate_env_bytes(resolved, UNPACK_FACTOR)
    prepared = EnvPrepared(spec, paths, built=False, reused=False, tool=plan.choice.tool, resolved=resolved,
                           env_bytes=env_bytes, unknown_sizes=unknown, warnings=warnings)
    if not build:
        return prepared
    emit(PhaseEntered(phase="installing", elapsed=round(time.monotonic() - started, 3),
                      line=f"building {paths.dir} with {plan.choice.tool} ({len(resolved)} packages)"))
    built = _build(target, plan, tools, config, resolved)
    return EnvPrepared(spec, paths, built=not built.reused, reused=built.reused, tool=built.record.tool,
                       resolved=built.record.resolved or resolved, env_bytes=env_bytes, unknown_sizes=unknown,
                       warnings=warnings, record=built.record)


# --- the target's facts ---------------------------------------------------------------------------------------


def _sh(target: EnvHost, argv: list[str], timeout: float = PROBE_TIMEOUT_S, stdin: bytes | None = None) -> Ran:
    return target.shell(" ".join(shlex.quote(a) for a in argv), timeout, stdin)


def probe(target: EnvHost, spec: EnvSpec) -> tuple[TargetTools, PipConfig]:
    """The build python's version, its pip, uv on PATH, and the target's pip configuration. TargetError when the
    build python does not run."""
    cmds = probe_commands(spec)
    py = _sh(target, cmds["python"])
    if py.exit_code != 0 or not py.stdout.strip():
        raise TargetError(f"{target.section}.python {spec.python} does not run on {target.label}: "
                          f"{_last_line(py.stderr or py.stdout) or 'not found'}",
                          hint=f"set {target.section}.python to a python3 on the target (>= 3.9)")
    pip = _sh(target, cmds["pip"])
    uv = target.shell("command -v uv && uv --version", PROBE_TIMEOUT_S, None)
    uv_lines = uv.stdout.split("\n") if uv.exit_code == 0 else []
    config = _sh(target, cmds["pip_config"] if pip.exit_code == 0 else cmds["pip_config_any"])
    tools = TargetTools(python_version=py.stdout.strip(), uv=uv_lines[0].strip() if uv_lines else None,
                        uv_version=parse_tool_version(uv_lines[1]) if len(uv_lines) > 1 else None,
                        pip_version=parse_tool_version(pip.stdout) if pip.exit_code == 0 else None)
    return tools, parse_pip_config(config.stdout if config.exit_code == 0 else "")


def _plan(spec: EnvSpec, target: EnvHost, tools: TargetTools, config: PipConfig) -> InstallPlan:
    try:
        return plan_install(spec, target.workdir, tools, config, uuid.uuid4().hex[:12])
    except ValueError as exc:
        raise TargetError(target.says(f"{target.label}: {exc}")) from None


def resolve(target: EnvHost, spec: EnvSpec, tools: TargetTools, plan: InstallPlan) -> tuple[ResolvedDist, ...]:
    """What the spec would install, nothing installed, nothing created: by the build python's own pip
    (`--dry-run --report`, pip >= 22.2: with each archive's URL and size), else, when uv builds, by uv
    (`uv pip compile`: names and versions) so that a python with an old pip or none is resolved all the same.
    () only when neither can (pip builds, and its pip is older than 22.2: the preflight then checks only the
    host). A spec that cannot resolve fails here, in one line."""
    if tools.pip_has_report:
        resolved = _resolved_by_pip(target, spec)
    elif plan.choice.tool == "uv" and plan.resolve is not None:
        resolved = _resolved_by_uv(target, spec, plan.resolve)
    else:
        return ()
    # what `remove` uninstalls after the install is not in the environment: not checked, not counted
    return tuple(d for d in resolved if canonical_name(d.name) not in spec.remove)


def _resolved_by_pip(target: EnvHost, spec: EnvSpec) -> tuple[ResolvedDist, ...]:
    # pip's own flags, never uv's (--index-strategy, --allow-insecure-host): pip reads the target's configuration
    # itself, which is where uv's flags were taken from
    argv = [spec.python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
            "--no-input", "--disable-pip-version-check", *profile_flags(spec), *spec.packages]
    ran = _sh(target, argv, RESOLVE_TIMEOUT_S)
    if ran.exit_code != 0:
        raise TargetError(_failure_line(target, ran.stdout + "\n" + ran.stderr, "pip"))
    try:
        dists = parse_pip_report(ran.stdout)
    except ValueError:
        return ()
    sizes = _sh(target, [spec.python, "-c", SIZES_PY], PROBE_TIMEOUT_S,
                json.dumps([d.url or "" for d in dists]).encode())
    try:
        return with_sizes(dists, json.loads(sizes.stdout)) if sizes.exit_code == 0 else dists
    except ValueError:
        return dists


def _resolved_by_uv(target: EnvHost, spec: EnvSpec, step: Step) -> tuple[ResolvedDist, ...]:
    env = ["env", *(f"{k}={v}" for k, v in step.env)] if step.env else []
    ran = _sh(target, [*env, *step.argv], RESOLVE_TIMEOUT_S, "".join(p + "\n" for p in spec.packages).encode())
    if ran.exit_code != 0:
        raise TargetError(_failure_line(target, ran.stdout + "\n" + ran.stderr, "uv"))
    return parse_uv_compile(ran.stdout)


def host_facts(target: EnvHost, python_version: str | None) -> HostFacts:
    """nvidia-smi (driver, CUDA, GPUs), /dev/shm, free bytes under the workdir: None/() where not answered."""
    smi = target.facts_shell(FACT_COMMANDS["smi"])
    driver, cuda = parse_smi(smi.stdout) if smi.exit_code == 0 else (None, None)
    caps = target.facts_shell(FACT_COMMANDS["caps"]) if smi.exit_code == 0 else Ran(1, "", "")
    shm = target.facts_shell(FACT_COMMANDS["shm"])
    disk = target.shell(f"d={shlex.quote(target.workdir)}; while [ ! -d \"$d\" ]; do d=$(dirname \"$d\"); done; "
                        "df -PB1 \"$d\"", PROBE_TIMEOUT_S, None)
    return HostFacts(driver_version=driver, driver_cuda=cuda,
                     gpus=parse_caps(caps.stdout) if caps.exit_code == 0 else (), python_version=python_version,
                     shm_bytes=parse_df_available(shm.stdout) if shm.exit_code == 0 else None,
                     env_free_bytes=parse_df_available(disk.stdout) if disk.exit_code == 0 else None)


def _checked(target: EnvHost, resolved: tuple[ResolvedDist, ...], demand: Demand, python_version: str | None
             ) -> tuple[str, ...]:
    """The compatibility rules against this host: PreflightFailed with every error (one line each); the
    warnings returned."""
    problems: list[Problem] = check(host_facts(target, python_version), resolved, demand)
    errors = [target.says(p.line) for p in problems if p.severity == "error"]
    if errors:
        raise PreflightFailed(errors)
    return tuple(target.says(p.line) for p in problems)


# --- the build -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Built:
    record: EnvRecord
    reused: bool
    steps: tuple[dict[str, Any], ...] = field(default=())


def _published(target: EnvHost, paths: EnvPaths) -> EnvRecord | None:
    """The record of the environment already published for this digest (None: not built, or not intact), asked
    under its lock (a build of it in progress is waited for, then reused) and marked as used just now."""
    fields = {"root": paths.root, "owned_from": target.workdir, "digest": paths.digest, "build_id": "reuse",
              "steps": [], "record": {}, "reuse_only": True, "timeout": BUILD_TIMEOUT_S}
    reply = target.call("env_build", fields, BUILD_TIMEOUT_S + 60, f"looking for the environment {paths.dir}")
    if not reply.get("record"):
        return None
    try:
        record = EnvRecord.from_json(str(reply["record"]))
    except ValueError:
        return None
    return record if record.intact and record.digest == paths.digest else None


def prune_environments(target: EnvHost, in_use: set[str], min_age_s: float) -> list[str]:
    """Retention: the environments under the workdir no kept run uses and not used for `min_age_s` removed (with
    dead builds); the names removed."""
    fields = {"root": f"{target.workdir.rstrip('/')}/{ENVS_DIR}", "owned_from": target.workdir,
              "keep": sorted(in_use), "min_age_s": min_age_s}
    reply = target.call("env_prune", fields, PROBE_TIMEOUT_S * 5, "retention of the managed environments")
    return [str(n) for n in reply.get("removed") or ()]


def _build(target: EnvHost, plan: InstallPlan, tools: TargetTools, config: PipConfig,
           resolved: tuple[ResolvedDist, ...]) -> _Built:
    steps = [{"name": s.name, "argv": list(s.argv), "env": dict(s.env)}
             for s in plan.build_steps]
    tool_version = tools.uv_version if plan.choice.tool == "uv" else tools.pip_version
    record = {"digest": plan.spec.digest, "spec": plan.spec.as_dict(),
              "tool": f"{plan.choice.tool} {tool_version}" if tool_version else plan.choice.tool,
              "python_version": tools.python_version, "pip_config": [list(kv) for kv in config.items()],
              "resolved_hint": [{"name": d.name, "version": d.version, "url": d.url, "size": d.size}
                                for d in resolved]}
    fields = {"root": plan.paths.root, "owned_from": target.workdir, "digest": plan.spec.digest, "build_id": plan.build_id, "steps": steps, "record": record,
              "timeout": BUILD_TIMEOUT_S}
    reply = target.call("env_build", fields, BUILD_TIMEOUT_S + 60, f"building the environment {plan.paths.dir}")
    if reply.get("failed"):
        what = f"{reply['failed']} step" if reply["failed"] != "install" else "install"
        raise TargetError(_failure_line(target, str(reply.get("output") or ""), plan.choice.tool,
                                        prefix=f"the environment's {what} failed"))
    try:
        built = EnvRecord.from_json(str(reply.get("record") or ""))
    except ValueError as exc:
        raise TargetError(f"the environment built on {target.label} has no readable record: {exc}") from None
    return _Built(built, bool(reply.get("reused")), tuple(reply.get("steps") or ()))


def _failure_line(target: EnvHost, output: str, tool: str, prefix: str = "the environment cannot be resolved") -> str:
    prefix = prefix.replace("the environment", target.env_name, 1)
    return f"{prefix} on {target.label}: {target.says(diagnose_install(output, tool).line)}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def warn_all(prepared: EnvPrepared, emit: EventSink) -> None:
    for line in prepared.warnings:
        emit(Warn(message=line))
