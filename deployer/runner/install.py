"""The managed engine environment as a step of `up` and `prepare`: a profile with `engine.install` gets its
environment built (or reused) on the target, checked for compatibility first (deployer/prepare/environment.py), and
comes back as the profile to launch, whose `engine.python` is that environment's python (`install` dropped: the run
records name the environment by its python, which is what retention keeps and a rollback launches).
"""

from __future__ import annotations

from deployer.events import EventSink
from deployer.prepare.compat import Demand
from deployer.prepare.environment import EnvPrepared, Ran, Target, prepare_environment, warn_all
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.target.push import expand_workdir


def env_target(remote: Remote, workdir: str) -> Target:
    """The target as deployer/prepare/environment.py reaches it: this connection's shell and helper."""
    def shell(cmd: str, timeout: float, stdin: bytes | None) -> Ran:
        result = remote.run(cmd, timeout=timeout, check=False, stdin=stdin)
        return Ran(result.exit_code, result.stdout, result.stderr)

    return Target(shell=shell, call=remote.helper.call, workdir=expand_workdir(remote, workdir), label=remote.label)


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
    prepared = prepare_environment(env_target(remote, profile.target.workdir), install, demand_of(profile), emit,
                                   build=build)
    warn_all(prepared, emit)
    return prepared


def with_environment(remote: Remote, profile: Profile, emit: EventSink) -> Profile:
    """The profile to launch: unchanged without `engine.install`; else its environment ready and its python."""
    prepared = prepared_environment(remote, profile, emit)
    if prepared is None:
        return profile
    engine = profile.engine.model_copy(update={"python": prepared.python, "install": None})
    return profile.model_copy(update={"engine": engine})
