"""After a failed replace of a multi-node engine: the group that served before is started again, whole.

Only when every node had a run that reached ready and `up` stopped it (push first, stop last, as single-host
`up`). The attempt's own runs are stopped first, then every node's earlier run dir is made current and started
again in place (its own files and ports), and the group is watched like any attempt. `--no-rollback` and a lost
lock leave it as it failed; the error says so either way.
"""

from __future__ import annotations

from deployer.errors import DeployError, LockLost
from deployer.fleet.fanout import at_once
from deployer.fleet.nodes_watch import NodeSession, watch_group
from deployer.pipeline.up import UpReport
from deployer.profile.model import Profile
from deployer.push import set_current
from deployer.start import check_port, start, stop
from deployer.events import EventSink, Restored, RollingBack
from deployer.watch.watcher import Ready

PORT_WAIT_S = 15.0
STOP_GRACE_CAP_S = 10.0


def bring_back(sessions: list[NodeSession], profile: Profile, *, rollback: bool, stopped: bool, report: UpReport,
               emit: EventSink, exc: DeployError) -> None:
    """Start the group that served before again (the runs `up` stopped), and amend `exc` with what happened."""
    if not stopped or not all(s.serving is not None and s.serving.reached_ready for s in sessions):
        return
    first = sessions[0].serving
    assert first is not None
    name = f"{first.content_hash[:12]} ({first.run.run_id})"
    if not rollback:
        _amend(exc, f"the previous version {name} was not brought back (--no-rollback)")
        return
    if isinstance(exc, LockLost):
        _amend(exc, f"the previous version {name} was not brought back (the lock is no longer ours)")
        return
    emit(RollingBack(message=f"bringing back the previous version {name} on every node",
                     run_id=first.run.run_id, content_hash=first.content_hash, reason=exc.message))
    report.restored = {"run_id": first.run.run_id, "content_hash": first.content_hash, "run_dir": first.run.path}
    try:
        ready = _restart(sessions, profile, emit)
    except DeployError as err:
        report.restored.update(status="failed", detail=err.message)
        _amend(exc, f"bringing back the previous version {name} failed too: {err.message}")
        return
    report.restored.update(status="ready" if ready else "failed")
    if ready:
        emit(Restored(message=f"the previous version {name} is serving again on every node",
                          run_id=first.run.run_id, content_hash=first.content_hash))
        _amend(exc, f"brought back the previous version {name}: it is serving again")
    else:
        _amend(exc, f"brought back the previous version {name}, but it did not become ready")


def _restart(sessions: list[NodeSession], profile: Profile, emit: EventSink) -> bool:
    grace = min(profile.restart.grace_s, STOP_GRACE_CAP_S)
    at_once(lambda s: stop(s.remote, s.run, grace) if s.run is not None else None, sessions)

    def again(s: NodeSession) -> None:
        view = s.serving
        assert view is not None
        set_current(s.remote, s.layout, view.run)
        check_port(s.remote, s.layout, int(view.record.get("port") or s.plan.port), wait_s=PORT_WAIT_S)
        s.run, s.launch = view.run, start(s.remote, view.run)

    at_once(again, sessions)
    leader = sessions[0].serving
    assert leader is not None
    health = profile.health.model_copy(update={"path": str(leader.record.get("health_path") or profile.health.path)})
    outcome = watch_group(sessions, profile.model_copy(update={"health": health}), emit,
                          port=int(leader.record.get("port") or sessions[0].plan.port))
    return isinstance(outcome, Ready)


def _amend(exc: DeployError, note: str) -> None:
    exc.message = f"{exc.message}; {note}"
    exc.args = (exc.message,)
