"""The managed engine environment as a step of `up` and `prepare`: a profile with `engine.install` gets its
environment built (or reused) on the target, checked for compatibility first (deployer/prepare/environment.py), and
comes back as the profile to launch, whose `engine.python` is that environment's python (`install` dropped: the run
records name the environment by its python, which is what retention keeps and a rollback launches).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

from deployer.errors import DeployError, TargetError
from deployer.events import Event, EventSink
from deployer.prepare.compat import Demand
from deployer.prepare.environment import EnvPrepared, Ran, EnvHost, prepare_environment, prune_environments, \
    warn_all
from deployer.prepare.envspec import ENVS_DIR, envs_in_use
from deployer.prepare.pushed import PushNeeded, WeightsNeeded
from deployer.prepare.report import HostPrepared, PrepareReport
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.remote.connect import conversing, target_spec
from deployer.render.bundle import engine_env
from deployer.runner.fanout import TaggedSink, at_once, fan_out
from deployer.runner.weights import plan_weights, prepare_weights
from deployer.box.push import expand_workdir


def env_target(remote: Remote, profile: Profile) -> EnvHost:
    """The target as deployer/prepare/environment.py reaches it: this connection's shell and helper, the profile's
    workdir there, the engine's environment for the facts."""
    return replace(env_target_at(remote, profile.target.workdir), engine_env=tuple(sorted(engine_env(profile).items())))


def env_target_at(remote: Remote, workdir: str) -> EnvHost:
    def shell(cmd: str, timeout: float, stdin: bytes | None) -> Ran:
        result = remote.run(cmd, timeout=timeout, check=False, stdin=stdin)
        return Ran(result.exit_code, result.stdout, result.stderr)

    return EnvHost(shell=shell, call=remote.helper.call, workdir=expand_workdir(remote, workdir), label=remote.label)


# An environment used (built or reused) within this long is kept even when no run references it yet: a deployment
# between its environment step and its push.
ENV_UNUSED_S = 3600.0


def prune_unused(remote: Remote, workdir: str) -> list[str]:
    """Retention of the managed environments under `workdir`: those no kept run of any deployment there launches
    from (its profile.json's engine python), unused for ENV_UNUSED_S. The names removed."""
    target = env_target_at(remote, workdir)
    root = shlex.quote(target.workdir.rstrip("/"))
    found = remote.run(f"cat {root}/*/runs/*/profile.json 2>/dev/null | grep -oE "
                       f"'{ENVS_DIR}/[0-9a-f]{{16}}/bin/python' | sort -u", timeout=60, check=False)
    pythons = [f"{target.workdir.rstrip('/')}/{line.strip()}" for line in found.stdout.splitlines() if line.strip()]
    return prune_environments(target, envs_in_use(pythons, target.workdir), ENV_UNUSED_S)


def demand_of(profile: Profile) -> Demand:
    """What the profile asks of the host, for the compatibility rules."""
    engine = profile.engine
    gpus = len(engine.gpus) if engine.gpus else 1
    return Demand(engine_kind=engine.kind, args=dict(engine.args), env=dict(engine.env), gpus_used=gpus)


def prepared_environment(remote: Remote, profile: Profile, emit: EventSink, *, build: bool = True
                         ) -> EnvPrepared | None:
    """The profile's environment ready on this target (`build`) or only resolved and checked; None without
    `engine.install`."""
    install = profile.engine.install
    if install is None:
        return None
    prepared = prepare_environment(env_target(remote, profile), install, demand_of(profile), emit, build=build)
    warn_all(prepared, emit)
    return prepared


def with_environment(remote: Remote, profile: Profile, emit: EventSink) -> Profile:
    """The profile to launch: unchanged without `engine.install`; else its environment ready and its python."""
    prepared = prepared_environment(remote, profile, emit)
    return profile if prepared is None else launched_from(profile, prepared.python)


def launched_from(profile: Profile, python: str) -> Profile:
    """The profile whose engine runs from `python` (a managed environment's): `install` done, so dropped."""
    return profile.with_engine(profile.engine.model_copy(update={"python": python, "install": None}))


def shared_environment(places: Sequence[tuple[Remote, Profile, EventSink]]) -> str | None:
    """A node group's environment ready on every node at once (each node's profile on its connection): the one
    python they all launch from, None without `engine.install`. TargetError when the nodes' workdirs put it at
    different paths (the group is launched from one profile)."""
    done = at_once(lambda place: prepared_environment(*place), list(places))
    pythons = sorted({p.python for p in done if p is not None})
    if not pythons:
        return None
    if len(pythons) > 1:
        raise TargetError(f"the nodes' environments are at different paths ({', '.join(pythons)}): give "
                          "target.workdir as an absolute path that is the same on every node")
    return pythons[0]


# --- `deploy prepare` and `deploy plan` ---------------------------------------------------------------------------


def prepare_host(profile: Profile, label: str, trust_new_host: bool, emit: EventSink) -> HostPrepared:
    """Everything a launch of `profile` needs on its host, without launching: the compatibility checks and the
    managed environment (built or reused), the weights (`engine.weights`: fetched, or found whole on disk). A
    failure is the host's `error`, one line."""
    try:
        with conversing(target_spec(profile, trust_new_host)) as remote:
            prepared = prepared_environment(remote, profile, emit)
            fetched = prepare_weights(remote, profile, emit)
        return HostPrepared(label, prepared, weights=fetched)
    except DeployError as exc:
        return HostPrepared(label, error=exc)


@dataclass(frozen=True)
class PrepareJob:
    """One row of `deploy prepare`: the host it runs on (a host's jobs run one after another), its label, and the
    work (an engine's host: prepare_host; a fleet's router: its own environment)."""

    host: str
    label: str
    work: Callable[[EventSink], HostPrepared]


def prepare_all(name: str, members: Sequence[tuple[str, str, Profile]], trust_new_host: bool,
                emit: EventSink, more: Sequence[PrepareJob] = ()) -> PrepareReport:
    """`prepare_host` for each (host, label, profile), then `more`: hosts at once, a host's jobs one after another
    (two on one host share the environment: the second finds it built)."""
    jobs = [PrepareJob(host, label, partial(prepare_host, profile, label, trust_new_host))
            for host, label, profile in members] + list(more)
    done = fan_out(jobs, lambda j: j.host, lambda j: j.label, lambda j, tagged: j.work(tagged), TaggedSink(emit))
    return PrepareReport(name, [d.value if d.value is not None else HostPrepared(d.member.label, error=d.error)
                                for d in done])


def plan_environment(remote: Remote, profile: Profile) -> tuple[Profile, EnvPrepared | None]:
    """For `deploy plan`: the environment resolved and checked (nothing built), and the profile preflight should
    check: launched from the environment's python when it is built already."""
    prepared = prepared_environment(remote, profile, _quiet, build=False)
    return (profile, None) if prepared is None else (launched_from(profile, prepared.python), prepared)


def engine_download_note(profile: Profile) -> list[str]:
    """For `deploy plan`: a hub repo the engine downloads itself (no engine.weights) is downloaded while it starts,
    inside the outage of a replace; said once, with the setting that moves it before anything stops."""
    if not profile.engine.downloads_at_start:
        return []
    return [f"weights: the engine downloads {profile.engine.model_path} itself as it starts (on a replace, while "
            "nothing serves); `engine.weights: {}` fetches it first, before anything is stopped"]


def planned_weights(remote: Remote, profile: Profile) -> tuple[list[WeightsNeeded], list[str]]:
    """For `deploy plan`: what fetching `engine.weights` would take on this host (nothing fetched; empty without
    `engine.weights`), and the problems it finds: the missing bytes do not fit the free disk, or the hub cannot say
    what the revision holds."""
    try:
        needed = plan_weights(remote, profile)
    except DeployError as exc:
        return [], [f"weights: {exc}"]
    if needed is not None and not needed.fits:
        where = "under target.workdir" if isinstance(needed, PushNeeded) else "under the hub cache"
        larger = "target.workdir" if isinstance(needed, PushNeeded) else "HF_HOME on the box"
        return [needed], [f"weights: {needed.describe()}: free space {where} on {needed.host}, or set {larger} to "
                          "a larger disk"]
    return ([needed] if needed is not None else []), []


def merged_weights(each: Sequence[tuple[list[WeightsNeeded], list[str]]]) -> tuple[list[WeightsNeeded], list[str]]:
    """Several hosts' `planned_weights` as one: every host's line, every problem, in the hosts' order."""
    return [n for needs, _ in each for n in needs], [p for _, problems in each for p in problems]


def unbuilt_problem(problem: str, profile: Profile, prepared: EnvPrepared | None) -> bool:
    """A preflight problem that only says the environment `up` would build is not there yet."""
    if prepared is None or prepared.reused:
        return False
    engine = profile.engine
    return problem.startswith((f"engine python {engine.python!r} not found",
                               f"{engine.kind} is not installed for {engine.python}",
                               f"no {engine.kind} found by {engine.python} "))   # a node group's comparison


def _quiet(_event: Event) -> None:
    pass
