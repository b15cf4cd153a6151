"""Rolling replacement: one replica at a time, out of the router first and back in once healthy.

Never below N-1 serving: a replica that serves is taken out only while every other replica serves. A replica that
will not come back stops the rollout; the single-host `up` has already brought its previous version back (unless
--no-rollback), and that version goes back into the router when it serves. Without a router the replicas are
still replaced one after another. Ctrl-C or SIGTERM after a replica was taken out asks the router to take it back before
deployer leaves (bounded: deployer/interrupts.py; smg lists it once its health check passes); after
kill -9 it stays out, `deploy status` exits 9 saying so, and the next `up` or `restart` of the fleet adds it back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deployer import interrupts
from deployer.errors import DeployError, Unhealthy
from deployer.runner.fanout import TaggedSink
from deployer.deployments.fleet.members import Fleet, ReplicaMember, RouterMember
from deployer.deployments.fleet.report import FleetReport, ReplicaResult, failed_result, replica_result
from deployer.deployments.fleet.router import (DRAIN_TIMEOUT_S, READY_TIMEOUT_S, add_worker, remove_worker,
                                               wait_workers, workers)
from deployer.host import probe_address
from deployer.remote.base import Remote
from deployer.box.process import arm_router_repair, disarm_repair
from deployer.box.push import Layout
from deployer.events import EventSink, Info

Replace = Callable[[ReplicaMember, EventSink], Any]   # -> the replica's UpReport; raises DeployError
Unchanged = Callable[[ReplicaMember], bool]            # whether the replica already runs what it should
# how a serving fleet's replicas are replaced: `roll` below, or a canary's (deployer/deployments/fleet/canary.py)
Roller = Callable[[Fleet, FleetReport, TaggedSink, Replace, Remote | None, Unchanged | None, Layout | None], None]
STILL_SERVING_S = 15.0                                 # after a failed replace: how long to look for the old one
IN_AGAIN_S = 20.0                                      # after an interrupt: for its drain, then its registration


def roll(fleet: Fleet, report: FleetReport, sink: TaggedSink, replace: Replace, router_remote: Remote | None,
         unchanged: Unchanged | None = None, router_layout: Layout | None = None) -> None:
    """Replace the replicas one at a time, those the router does not count as healthy first (replacing them
    costs no capacity); stops at the first that does not serve again (the rest stay untouched). The report lists
    the replicas in the profile's order."""
    report.mode = "rolling"
    order = _order(fleet, router_remote)
    results: dict[int, ReplicaResult] = {}
    for position, replica in enumerate(order):
        result = roll_one(fleet, replica, sink, replace, router_remote, unchanged, router_layout)
        results[replica.index] = result
        if result.error is not None:
            report.notes.append(f"rollout stopped at r{replica.index}@{replica.host}: {result.error}")
            results.update(_untouched(fleet, order[position + 1:], router_remote))
            break
    report.replicas.extend(results[r.index] for r in fleet.replicas)


def _order(fleet: Fleet, router_remote: Remote | None) -> list[ReplicaMember]:
    if fleet.router is None or router_remote is None:
        return list(fleet.replicas)
    have = workers(router_remote, fleet.router)
    return sorted(fleet.replicas, key=lambda r: r.url in have and have[r.url].healthy)


def _untouched(fleet: Fleet, rest: list[ReplicaMember], router_remote: Remote | None) -> dict[int, ReplicaResult]:
    """Replicas after a stopped rollout: left as they were; serving if the router says they are healthy."""
    have = workers(router_remote, fleet.router) if router_remote and fleet.router else {}
    out: dict[int, ReplicaResult] = {}
    for replica in rest:
        healthy = replica.url in have and have[replica.url].healthy
        out[replica.index] = ReplicaResult(replica.index, replica.host, replica.name, replica.url,
                                           "left-running" if healthy else "skipped",
                                           error=None if healthy else "not replaced: the rollout stopped before it")
    return out


def roll_one(fleet: Fleet, replica: ReplicaMember, sink: TaggedSink, replace: Replace, router_remote: Remote | None,
             unchanged: Unchanged | None = None, router_layout: Layout | None = None) -> ReplicaResult:
    emit = sink.tagged(replica.host, f"r{replica.index}")
    router = fleet.router
    if router is None or router_remote is None:
        return _replace(replica, emit, replace)
    have = workers(router_remote, router)
    mine = have.get(replica.url)
    serving = mine is not None and mine.healthy
    if serving and unchanged is not None and unchanged(replica):
        emit(Info(message=f"r{replica.index} already runs this version: left in the router"))
        return ReplicaResult(replica.index, replica.host, replica.name, replica.url, "unchanged")
    others = sum(1 for r in fleet.replicas if r is not replica and r.url in have and have[r.url].healthy)
    if serving and others < len(fleet.replicas) - 1:
        return ReplicaResult(replica.index, replica.host, replica.name, replica.url, "left-running", exit_code=6,
                             error=f"only {others} other replicas serve: taking r{replica.index} out would leave "
                                   f"fewer than {len(fleet.replicas) - 1} serving")
    out = Out()
    guarded = mine is not None and router_layout is not None
    if guarded:
        assert router_layout is not None
        arm_router_repair(router_remote, router_layout, replica.url, probe_address(router.bind), router.router.port,
                          router.api_key, router.control_key)
    try:
        return _out_replace_in(router_remote, router, replica, emit, replace, mine is not None, out)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: a drained replica is not left out of the router
        if out.taken:
            _in_again(router_remote, router, replica, emit)
        raise
    finally:  # back in (or deliberately out, or the lock lost: then the guard leaves by itself)
        if guarded:
            assert router_layout is not None
            try:
                disarm_repair(router_remote, router_layout, router=True)
            except DeployError:
                pass


@dataclass
class Out:
    """Whether the replica was taken out of the router and not yet added back (what an interrupt must undo)."""

    taken: bool = False


def _out_replace_in(router_remote: Remote, router: RouterMember, replica: ReplicaMember, emit: EventSink,
                    replace: Replace, registered: bool, out: Out) -> ReplicaResult:
    """Out of the router (when it is registered), replaced, and back in once it serves."""
    if registered:
        emit(Info(message=f"taking r{replica.index} ({replica.url}) out of the router; waiting for "
                                       "its requests to finish"))
        try:
            out.taken = True
            remove_worker(router_remote, router, replica.url)
            wait_workers(router_remote, router, healthy=set(), gone={replica.url}, deadline_s=DRAIN_TIMEOUT_S)
        except DeployError as exc:  # not out (a drain that never ends): untouched, and back in if it left
            result = ReplicaResult(replica.index, replica.host, replica.name, replica.url, "left-running",
                                   exit_code=exc.exit_code, error=f"could not take it out of the router: {exc.message}")
            out.taken = False
            _back_in(router_remote, router, replica, result, emit)
            return result
    result = _replace(replica, emit, replace)
    out.taken = False  # from here on it is added back (or, not serving, deliberately left out)
    if result.serving:
        _back_in(router_remote, router, replica, result, emit)
    elif registered:  # failed before changing anything (no other version, locked, ...): still serving?
        _back_if_serving(router_remote, router, replica, result, emit)
    return result


def _in_again(remote: Remote, router: RouterMember, replica: ReplicaMember, emit: EventSink) -> None:
    """After an interrupt: once its drain is over, register the replica again, and wait (bounded: IN_AGAIN_S) until
    the router lists it (smg registers a worker only once it answers its health check; its brought-back engine
    may still be loading). Within the interrupt's bound (deployer/interrupts.py)."""
    interrupts.allow(2 * IN_AGAIN_S + 10.0)
    try:
        try:  # a re-add while it drains is "already exists", and the drain's end then removes it
            wait_workers(remote, router, healthy=set(), gone={replica.url}, deadline_s=IN_AGAIN_S)
        except DeployError:
            pass  # still draining after IN_AGAIN_S (or the removal never reached the router): add it anyway
        listed = _register(remote, router, replica.url, time.monotonic() + IN_AGAIN_S)
    except DeployError as exc:
        emit(Info(message=f"interrupted: r{replica.index} could not be added back to the router: {exc.message}; "
                          "the next `deploy up` or `deploy restart` of the fleet adds it"))
        return
    if listed:
        emit(Info(message=f"interrupted: r{replica.index} added back to the router ({replica.url})"))
    else:
        emit(Info(message=f"interrupted: r{replica.index} was asked back into the router ({replica.url}), which "
                          f"had not listed it within {IN_AGAIN_S:g}s; if it stays out, `deploy status` exits 9 "
                          "and the next `deploy up` or `deploy restart` of the fleet adds it"))


def _register(remote: Remote, router: RouterMember, url: str, deadline: float) -> bool:
    """POST the worker (again every few seconds) until the router lists it or `deadline` passes."""
    while True:
        add_worker(remote, router, url, deadline_s=max(0.0, deadline - time.monotonic()))  # within the interrupt's
        again = min(deadline, time.monotonic() + 5.0)
        while time.monotonic() < again:
            if url in workers(remote, router):
                return True
            time.sleep(0.5)
        if time.monotonic() >= deadline:
            return False


def _replace(replica: ReplicaMember, emit: EventSink, replace: Replace) -> ReplicaResult:
    try:
        return replica_result(replica, replace(replica, emit))
    except DeployError as exc:
        return failed_result(replica, exc)


def _back_if_serving(remote: Remote, router: RouterMember, replica: ReplicaMember, result: ReplicaResult,
                     emit: EventSink) -> None:
    """After a failed replace: what still answers there goes back into the router (then it is left running)."""
    try:
        add_worker(remote, router, replica.url)
        wait_workers(remote, router, healthy={replica.url}, gone=set(), deadline_s=STILL_SERVING_S)
    except DeployError:
        remove_quietly(remote, router, replica.url)
        return
    result.status = "left-running"
    emit(Info(message=f"r{replica.index} was not replaced and still serves: back in the router"))


def remove_quietly(remote: Remote, router: RouterMember, url: str) -> None:
    try:
        remove_worker(remote, router, url)
    except DeployError:
        pass  # the next router reconcile removes what does not serve


def _back_in(remote: Remote, router: RouterMember, replica: ReplicaMember, result: ReplicaResult,
             emit: EventSink) -> None:
    """Add the replica back and wait until the router calls it healthy; a failure marks the result failed."""
    try:
        add_worker(remote, router, replica.url)
        wait_workers(remote, router, healthy={replica.url}, gone=set(), deadline_s=READY_TIMEOUT_S)
    except DeployError as exc:
        result.status, result.error, result.exit_code = "failed", f"not back in the router: {exc.message}", \
            Unhealthy.exit_code
        return
    emit(Info(message=f"r{replica.index} is back in the router ({replica.url})"))
