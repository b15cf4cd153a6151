"""`up` and `restart` of a fleet: the replicas, then the router in front of the ready ones.

A fleet that is not serving yet (no router running; without a router: no replica serving) is started by
fan-out: every host at once, each replica with the single-host `up`. A fleet that serves is updated by a rolling
replacement (`rolling`), so clients keep being served. `restart` and `rollback` are always rolling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from deployer.errors import DeployError, NotFound
from deployer.runner.fanout import TaggedSink, fan_out
from deployer.deployments.fleet.links import Links
from deployer.deployments.fleet.members import AddressOf, Fleet, ReplicaMember, fleet_of
from deployer.remote.connect import spec_of, ssh_address
from deployer.runner.report import restart_summary
from deployer.deployments.fleet.report import FleetReport, failed_result, replica_result
from deployer.deployments.fleet.rolling import Replace, Roller, roll
from deployer.deployments.fleet.weights import fetch_first
from deployer.deployments.fleet.router import RouterReport, ensure_router, router_session, workers
from deployer.deployments.fleet.router_key import key_of, keyed_fleet, with_key
from deployer.deployments.fleet.router_env import prune_router_environments, with_router_environment
from deployer.operate.deployment import Ref
from deployer.operate.deployment import status as deployment_status
from deployer.operate.rollback import restart as restart_replica
from deployer.operate.rollback import rollback as rollback_replica
from deployer.runner.up import UpOptions, up
from deployer.profile.model import Profile
from deployer.box.push import Layout, expand_workdir
from deployer.remote.base import Remote
from deployer.render.bundle import render
from deployer.box.records import current_view
from deployer.events import EventSink, Warn


RollerFor = Callable[[Links, UpOptions], Roller]   # how a serving fleet is updated (canary.py)


def fleet_up(profile: Profile, opts: UpOptions, emit: EventSink, address_of: AddressOf = ssh_address,
             roller_for: RollerFor | None = None) -> FleetReport:
    fleet = fleet_of(profile, address_of)
    sink = TaggedSink(emit)
    report = FleetReport(fleet.name, restart=restart_summary(profile.restart))
    with Links(opts.trust_new_host) as links, _front(fleet, links) as front:
        fleet = _router_ready(fleet, links, front, sink)  # router.install: before anything is stopped

        def replace(member: ReplicaMember, e: EventSink) -> object:
            return up(member.profile, opts, e, links.to(member.profile.target))

        serving = _router_serves(fleet, front) if front is not None else \
            fleet.router is None and _replicas_serve(fleet, links)
        if serving:
            fetch_first(fleet, links, sink)  # engine.weights: every host at once, while every replica serves
            _rolling(fleet, report, sink, opts, replace, None if opts.force else _unchanged(links), front,
                     roller_for(links, opts) if roller_for is not None else roll)
            return report.settle()
        done = fan_out(fleet.replicas, lambda m: m.host, lambda m: f"r{m.index}", replace, sink)
        report.replicas = [replica_result(d.member, d.value) if d.error is None else
                           failed_result(d.member, d.error) for d in done]
        if fleet.router is not None:
            report.router = _start_router(fleet, report, sink, opts, front)
    return report.settle()


def _router_ready(fleet: Fleet, links: Links, front: Remote | None, sink: TaggedSink) -> Fleet:
    """The fleet with its router's environment (router.install) built or reused on the router's host and the
    router launched from it; the fleet unchanged without one. A failure (one line) ends the command here, before
    any replica or router is stopped."""
    member = fleet.router
    if member is None or member.router.install is None:
        return fleet
    remote = front if front is not None else links.to(member.target)
    return with_router_environment(fleet, remote, sink.tagged(member.host, "router"))


def _router_started(remote: Remote, layout: Layout, fleet: Fleet, urls: list[str], emit: EventSink, *,
                    force: bool = False) -> RouterReport:
    """ensure_router, then (router.install) retention of the router's environments no kept run uses."""
    member = fleet.router
    assert member is not None
    report = ensure_router(remote, layout, member, fleet.profile, urls, emit, force=force)
    if fleet.profile.router is not None and fleet.profile.router.install is not None:
        warning = prune_router_environments(remote, member)
        if warning:
            emit(Warn(message=warning))
    return report


@contextmanager
def _front(fleet: Fleet, links: Links) -> Iterator[Remote | None]:
    """The router host's connection (shared with its replicas' steps); None without a router or when unreachable
    (the fan-out then reports that host with the others)."""
    if fleet.router is None:
        yield None
        return
    try:
        remote = links.to(fleet.router.target)
    except DeployError:
        yield None
        return
    yield remote


def fleet_restart(profile: Profile, opts: UpOptions, emit: EventSink,
                  address_of: AddressOf = ssh_address) -> FleetReport:
    """Every replica's last good version again, one at a time through the router (rolling)."""
    return _on_call(profile, opts, emit, address_of, restart_replica)


def fleet_rollback(profile: Profile, opts: UpOptions, emit: EventSink,
                   address_of: AddressOf = ssh_address) -> FleetReport:
    """Every replica back to its newest other version that reached ready, one at a time (rolling)."""
    return _on_call(profile, opts, emit, address_of, rollback_replica)


def _on_call(profile: Profile, opts: UpOptions, emit: EventSink, address_of: AddressOf,
             action: Callable[[Ref, EventSink, UpOptions], object]) -> FleetReport:
    fleet = fleet_of(profile, address_of)
    report = FleetReport(fleet.name)

    def again(member: ReplicaMember, e: EventSink) -> object:
        t = member.profile.target
        ref = Ref(member.name, spec_of(t, opts.trust_new_host), t.workdir, member.profile)
        return action(ref, e, opts)

    with Links(opts.trust_new_host) as links, _front(fleet, links) as front:
        sink = TaggedSink(emit)
        _rolling(_router_ready(fleet, links, front, sink), report, sink, opts, again, None, front)
    return report.settle()


def _rolling(fleet: Fleet, report: FleetReport, sink: TaggedSink, opts: UpOptions, replace: Replace,
             unchanged: Callable[[ReplicaMember], bool] | None, front: Remote | None, roller: Roller = roll) -> None:
    if fleet.router is None:
        roller(fleet, report, sink, replace, None, unchanged, None)
        return
    member = fleet.router
    emit = sink.tagged(member.host, "router")
    try:
        with router_session(member, opts.what, emit, trust_new_host=opts.trust_new_host,
                            break_lock=opts.break_lock, remote=front) as (remote, layout):
            fleet = keyed_fleet(fleet, remote)  # the running router's control key (router_key.py)
            roller(fleet, report, sink, replace, remote, unchanged, layout)
            report.router = _router_started(remote, layout, fleet, report.serving_urls(), emit)
    except DeployError as exc:
        report.router = RouterReport(member.name, member.host, "failed", detail=exc.message)
        if not report.replicas:
            raise


def _unchanged(links: Links) -> Callable[[ReplicaMember], bool]:
    """Whether a replica already runs what its profile renders to (its current run's content hash)."""
    def check(member: ReplicaMember) -> bool:
        t = member.profile.target
        try:
            rows = deployment_status(Ref(member.name, spec_of(t, links.trust_new_host), t.workdir, member.profile),
                                     links.to(t))
        except DeployError:
            return False
        return bool(rows) and rows[0].serving and rows[0].content_hash == render(member.profile).content_hash
    return check


def _replicas_serve(fleet: Fleet, links: Links) -> bool:
    """A fleet without a router (behind a balancer of your own): whether any replica serves now, asked of every
    host at once (then `up` replaces them one at a time, so they never all stop together)."""
    def one(member: ReplicaMember, _emit: EventSink) -> bool:
        t = member.profile.target
        try:
            rows = deployment_status(Ref(member.name, spec_of(t, links.trust_new_host), t.workdir, member.profile),
                                     links.to(t))
        except NotFound:
            return False
        return bool(rows) and rows[0].serving

    done = fan_out(fleet.replicas, lambda m: m.host, lambda m: f"r{m.index}", one, TaggedSink(lambda _e: None))
    return any(d.value for d in done)


def _router_serves(fleet: Fleet, remote: Remote) -> bool:
    """Whether the fleet's router runs and answers (then an `up` replaces replicas one at a time)."""
    member = fleet.router
    assert member is not None
    layout = Layout(f"{expand_workdir(remote, member.target.workdir).rstrip('/')}/{member.name}")
    view = current_view(remote, layout)
    if view is None or not view.alive:
        return False
    try:
        return any(w.healthy for w in workers(remote, with_key(member, key_of(remote, view))).values())
    except DeployError:
        return False


def _start_router(fleet: Fleet, report: FleetReport, sink: TaggedSink, opts: UpOptions,
                  front: Remote | None) -> RouterReport:
    member = fleet.router
    assert member is not None
    urls = report.serving_urls()
    if not urls:
        return RouterReport(member.name, member.host, "failed", detail="not started: no replica is ready")
    emit = sink.tagged(member.host, "router")
    try:
        with router_session(member, opts.what, emit, trust_new_host=opts.trust_new_host,
                            break_lock=opts.break_lock, remote=front) as (remote, layout):
            return _router_started(remote, layout, fleet, urls, emit, force=opts.force)
    except DeployError as exc:
        return RouterReport(member.name, member.host, "failed", detail=exc.message)
