"""The router's managed environment (`router.install`): smg built on the router's host the way engine.install builds
an engine's (deployer/prepare/environment.py: resolved and checked first, built by the helper's `env_build` under its
lock, keyed by its hash, reused while unchanged, pruned by retention once no kept router run launches from it).

`up`, `restart` and `rollback` get it ready before any replica or router is stopped, and launch the router from its
python (`install` dropped, as for an engine: the router's run record names the environment by its python, which is
what retention keeps). `deploy prepare` builds it; `deploy plan` resolves it.
"""

from __future__ import annotations

from dataclasses import replace

from deployer.errors import DeployError
from deployer.events import EventSink
from deployer.deployments.fleet.members import Fleet, RouterMember
from deployer.remote.connect import spec_of
from deployer.prepare.compat import Demand
from deployer.prepare.environment import EnvPrepared, prepare_environment, warn_all
from deployer.prepare.report import HostPrepared
from deployer.remote.base import Remote
from deployer.remote.connect import conversing
from deployer.runner.install import PrepareJob, env_target_at, prune_unused

# smg is a CPU process: the GPU rules have nothing to check, the Python and disk rules do.
ROUTER_DEMAND = Demand(engine_kind="smg", gpus_used=0)
SECTION = "router.install"


def router_environment(remote: Remote, member: RouterMember, emit: EventSink, *, build: bool = True
                       ) -> EnvPrepared | None:
    """The router's environment ready on its host (`build`), or only resolved and checked (plan); None without
    `router.install`. TargetError / PreflightFailed in one line when it cannot be built."""
    install = member.router.install
    if install is None:
        return None
    target = replace(env_target_at(remote, member.target.workdir), section=SECTION)
    prepared = prepare_environment(target, install, ROUTER_DEMAND, emit, build=build)
    warn_all(prepared, emit)
    return prepared


def launched_router(member: RouterMember, python: str) -> RouterMember:
    """The router member whose smg runs from `python` (its managed environment's): `install` done, so dropped."""
    return replace(member, router=member.router.model_copy(update={"python": python, "install": None}))


def with_router_environment(fleet: Fleet, remote: Remote, emit: EventSink) -> Fleet:
    """The fleet to deploy: unchanged without `router.install`; else the router's environment ready on `remote`
    (the router's host) and the router launched from it."""
    member = fleet.router
    if member is None or member.router.install is None:
        return fleet
    prepared = router_environment(remote, member, emit)
    assert prepared is not None
    return replace(fleet, router=launched_router(member, prepared.python))


def prune_router_environments(remote: Remote, member: RouterMember) -> str | None:
    """Retention after the router started from a managed environment: those no kept run under its workdir launches
    from; a failure is a warning's text (it never fails the deployment)."""
    try:
        prune_unused(remote, member.target.workdir)
    except DeployError as exc:
        return f"retention of the router's environments skipped: {exc}"
    return None


def prepare_router(member: RouterMember, trust_new_host: bool) -> PrepareJob:
    """`deploy prepare`'s row for the router: its environment built (or reused) on its host, nothing launched."""
    label = f"router ({member.host})"

    def work(emit: EventSink) -> HostPrepared:
        try:
            with conversing(spec_of(member.target, trust_new_host)) as remote:
                return HostPrepared(label, router_environment(remote, member, emit))
        except DeployError as exc:
            return HostPrepared(label, error=exc)

    return PrepareJob(member.host, label, work)


def plan_router(member: RouterMember, trust_new_host: bool, emit: EventSink) -> EnvPrepared | None:
    """`deploy plan`'s view of the router's environment: resolved and checked on its host, nothing built."""
    if member.router.install is None:
        return None
    with conversing(spec_of(member.target, trust_new_host)) as remote:
        return router_environment(remote, member, emit, build=False)
