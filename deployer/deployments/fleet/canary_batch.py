"""A batch of a canary's promotion (rollout.max_unavailable > 1): several replicas out of the router together,
replaced at once (a host's replicas one after another), and each back in once it serves.

The batch is taken out only while every other replica of the fleet serves (never fewer than N - max_unavailable
serving). A replica whose replace failed goes back into the router when its previous version still answers
(rolling.py's rule). Unlike a batch of one (rolling.roll_one), no guard on the router's host adds a batch back if
this client is killed with -9 meanwhile: then they stay out, `deploy status` exits 9 saying so, and the next `up` or
`restart` of the fleet adds them back.
"""

from __future__ import annotations

from deployer.errors import DeployError, Unhealthy
from deployer.events import Info
from deployer.deployments.fleet.members import Fleet, ReplicaMember
from deployer.deployments.fleet.report import ReplicaResult, failed_result, replica_result
from deployer.deployments.fleet.rolling import STILL_SERVING_S, Replace, Unchanged, remove_quietly
from deployer.deployments.fleet.router import (DRAIN_TIMEOUT_S, READY_TIMEOUT_S, add_worker, remove_worker,
                                               wait_workers, workers)
from deployer.remote.base import Remote
from deployer.runner.fanout import TaggedSink, fan_out


def roll_batch(fleet: Fleet, batch: list[ReplicaMember], sink: TaggedSink, replace: Replace, remote: Remote,
               unchanged: Unchanged | None) -> dict[int, ReplicaResult]:
    """Replace `batch` together behind the fleet's router; the result of each by replica index."""
    router = fleet.router
    assert router is not None
    out: dict[int, ReplicaResult] = {}
    todo = []
    for replica in batch:
        if unchanged is not None and unchanged(replica):
            out[replica.index] = ReplicaResult(replica.index, replica.host, replica.name, replica.url, "unchanged")
        else:
            todo.append(replica)
    if not todo:
        return out
    have = workers(remote, router)
    urls = {r.url for r in todo}
    others = [r for r in fleet.replicas if r.url not in urls and r.url in have and have[r.url].healthy]
    if len(others) < len(fleet.replicas) - len(todo):
        for r in todo:
            out[r.index] = ReplicaResult(r.index, r.host, r.name, r.url, "left-running", exit_code=6,
                                         error=f"only {len(others)} other replicas serve: taking {len(todo)} out "
                                               f"would leave fewer than {len(fleet.replicas) - len(todo)} serving")
        return out
    sink.tagged(router.host, "router")(Info(message="taking " + ", ".join(f"r{r.index}" for r in todo) +
                                        " out of the router together; waiting for their requests to finish"))
    try:
        for r in todo:
            remove_worker(remote, router, r.url)
        wait_workers(remote, router, healthy=set(), gone=urls, deadline_s=DRAIN_TIMEOUT_S)
    except DeployError as exc:
        for r in todo:
            out[r.index] = ReplicaResult(r.index, r.host, r.name, r.url, "left-running", exit_code=exc.exit_code,
                                         error=f"could not take it out of the router: {exc.message}")
            _back(fleet, remote, r, out[r.index], sink)
        return out
    done = fan_out(todo, lambda m: m.host, lambda m: f"r{m.index}", replace, sink)
    for d in done:
        result = replica_result(d.member, d.value) if d.error is None else failed_result(d.member, d.error)
        out[d.member.index] = result
        _back(fleet, remote, d.member, result, sink)
    return out


def _back(fleet: Fleet, remote: Remote, replica: ReplicaMember, result: ReplicaResult, sink: TaggedSink) -> None:
    """Back into the router when it serves (its new version, or its previous one after a failed replace)."""
    router = fleet.router
    assert router is not None
    serving = result.serving
    try:
        add_worker(remote, router, replica.url)
        wait_workers(remote, router, healthy={replica.url}, gone=set(),
                     deadline_s=READY_TIMEOUT_S if serving else STILL_SERVING_S)
    except DeployError as exc:
        remove_quietly(remote, router, replica.url)
        if serving:
            result.status, result.error, result.exit_code = "failed", f"not back in the router: {exc.message}", \
                Unhealthy.exit_code
        return
    if not serving:  # failed before changing anything, and still serves
        result.status = "left-running"
    sink.tagged(replica.host, f"r{replica.index}")(Info(message=f"r{replica.index} is back in the router "
                                                                f"({replica.url})"))
