"""On-call operations read from the target: history of attempts (and of the lock), diagnosis of the latest failure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from deployer.diagnose.hangkinds import hung_summary
from deployer.errors import NotFound, TargetError
from deployer.local.history import History
from deployer.box.lock import DeploymentLock, describe_holder
from deployer.logtext import bounded_diagnosis
from deployer.operate.deployment import Ref, connected, diagnose_attempt, layout_of, make_ref, opened
from deployer.operate.rows import HistoryEntry
from deployer.operate.secret_restore import learn_env_text
from deployer.profile.model import Profile
from deployer.box.push import Layout
from deployer.remedy.propose import propose
from deployer.remote.base import Remote
from deployer.secrets import mask_data
from deployer.supervisor.base import CRASHED
from deployer.box import snapshot
from deployer.box.records import RunView, current_view, healthy, list_runs, record_address, record_engine
from deployer.box.retention import DEFAULT_KEEP, apply_plan, prune_pushed, retention_plan

__all__ = ["make_ref", "history", "local_history", "diagnose_deployment", "prune", "lock_events"]


def prune(ref: Ref, keep: int | None, dry_run: bool) -> dict[str, Any]:
    """Apply the retention now (under the deployment lock); `keep` defaults to the current run's profile's."""
    assert ref.name
    with opened(ref) as (remote, workdir):
        layout = layout_of(workdir, ref.name)
        if not list_runs(remote, layout):
            raise NotFound(f"no deployment {ref.name!r} under {workdir} on {remote.label}")
        if keep is None:
            view = current_view(remote, layout)
            recorded = ((view.record.get("profile") or {}).get("retention") or {}) if view else {}
            keep = int(recorded.get("keep_runs") or DEFAULT_KEEP)
        if dry_run:
            plan = retention_plan(remote, layout, keep)
            going = frozenset(f"{ref.name}/runs/{run_id}" for run_id in plan.delete)
            models = prune_pushed(remote, workdir, dry=True, going=going)
        else:
            with DeploymentLock(remote, layout, "prune"):
                plan = retention_plan(remote, layout, keep)
                apply_plan(remote, layout, plan)
                models = prune_pushed(remote, workdir)   # after the runs: what they loaded is free to go
        return {"name": ref.name, "host": remote.label, "dry_run": dry_run, **plan.to_json(),
                "models": models.to_json()}


def history(ref: Ref) -> list[HistoryEntry]:
    """Every attempt on the target, newest first, with the lock's takeovers and breaks among them
    (the target is the truth; local history is a cache)."""
    assert ref.name
    with connected(ref) as remote:
        snap = snapshot.take(remote, layout_of(ref.workdir, ref.name).root, runs=None)  # one exec channel
        if not snap.runs:
            raise NotFound(f"no deployment {ref.name!r} under {snap.workdir} on {remote.label}")
        views, current = [snap.view(r) for r in snap.runs], snap.current
        for view in views:
            if view.run.run_id == current:  # diagnoses quote engine text
                learn_env_text(snap.env.get(current), view.record, view.run.file("env"))
        rows = []
        for view in reversed(views):
            run_id = view.run.run_id
            outcome = view.outcome or {}
            rows.append({
                "kind": "attempt", "run_id": run_id, "current": run_id == current,
                "attempt": view.record.get("attempt"), "up_id": view.record.get("up_id"), "started_at": view.state.get("started_at")
                or view.record.get("pushed_at"), "content_hash": view.content_hash,
                **_outcome(view), "good": view.stayed_up,
                "diagnosis": outcome.get("diagnosis"), "change": outcome.get("change"),
                "drift": outcome.get("drift", []), "restarts": view.state.get("restarts", 0),
                "phases": outcome.get("phases", []), "timeline": outcome.get("timeline"),
                **_hung(view),
            })
        return _merge_newest_first([HistoryEntry.of_attempt(mask_data(row)) for row in rows],
                                   [HistoryEntry.of_lock(mask_data(row)) for row in lock_events(snap.lock_events)])


def _hung(view: RunView) -> dict[str, Any]:
    """{"hung": summary} when the hang rule ended this run's engine last (issue 37); else nothing (the row's shape
    stays the previous release's)."""
    hung = hung_summary(view.state.get("last_crash"))
    return {"hung": hung} if hung is not None else {}


def _outcome(view: RunView) -> dict[str, Any]:
    """The attempt's outcome: outcome.json's (written when `up` saw it ready or failed), unless it crash-looped
    after ready since (the supervisor's record): then that, as it is not a version to go back to."""
    outcome = view.outcome or {}
    if view.crashlooped:
        crash = view.state.get("last_crash") or {}
        how = f"signal {crash.get('signal_name')}" if crash.get("signal_name") else f"exit code {crash.get('exit_code')}"
        return {"outcome": "crashloop", "detail": f"crash-looped after ready: {view.state.get('restarts', 0)} "
                f"restarts, the last end {how} (was {outcome.get('outcome') or 'ready'})"}
    return {"outcome": outcome.get("outcome") or view.status, "detail": outcome.get("detail")}


def lock_events(text: str) -> list[dict[str, Any]]:
    """The lock's takeovers and breaks recorded on the target (supervise_lease.py; the snapshot carries the tail
    of that file), newest first."""
    rows = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # the first line of a window, cut in the middle
        if isinstance(event, dict) and isinstance(event.get("at"), (int, float)):
            rows.append({"kind": "lock", "started_at": event["at"], "outcome": event.get("event"),
                         "detail": lock_event_text(event), "by": event.get("by"), "from": event.get("from")})
    return rows[::-1]


def lock_event_text(event: dict[str, Any]) -> str:
    by, old = describe_holder(event.get("by") or {}), describe_holder(event.get("from") or {})
    if event.get("event") == "lock-broken":
        return f"{by} broke the lock held by {old} (--break-lock)"
    if event.get("what") == "replica watch":  # a fleet router's supervisor pulled or added back a replica
        return f"the router's watch of its replicas: {event.get('detail')}"
    if event.get("event") == "repaired":
        return f"the target repaired an interrupted {event.get('what') or 'replace'}: {event.get('detail')}"
    why = {"holder-gone": "its process was gone",
           "client-gone": "its client was gone during a replace"}.get(str(event.get("reason")), "its lease had expired")
    return f"{by} took over the lock from {old}: {why}"


def _merge_newest_first(runs: list[HistoryEntry], events: list[HistoryEntry]) -> list[HistoryEntry]:
    out: list[HistoryEntry] = []
    pending = list(events)
    for row in runs:
        while pending and row.started_at is not None and (pending[0].started_at or 0) >= row.started_at:
            out.append(pending.pop(0))
        out.append(row)
    return out + pending


def local_history(name: str | None, host: str | None) -> list[HistoryEntry]:
    """The attempts this machine ran of NAME (None: of every deployment), from the local SQLite cache, newest
    first; works with the target down."""
    store = History()
    try:
        rows = store.attempts(name, host)
    finally:
        store.close()
    if not rows:
        raise NotFound(f"no attempts of {name!r} in the local history" if name else
                       "no attempts in the local history (deploy up records them)")
    return [HistoryEntry.of_attempt({**row.to_json(), "current": False}) for row in rows]


def diagnose_deployment(ref: Ref, engine_version: str | None) -> dict[str, Any]:
    """Diagnose the latest failed attempt from its log on the target: one snapshot brings records and log."""
    assert ref.name
    with connected(ref) as remote:
        snap = snapshot.take(remote, layout_of(ref.workdir, ref.name).root, runs=None, attempt="failed")
        if not snap.runs:
            raise NotFound(f"no deployment {ref.name!r} under {snap.workdir} on {remote.label}")
        for run_id in reversed(snap.runs):
            view = snap.view(run_id)
            state = view.state
            crashed = state.get("status") in CRASHED or state.get("last_crash")
            if not crashed and (view.outcome or {}).get("outcome") in (None, "ready"):
                continue
            if snap.attempt is None or snap.attempt.run_id != run_id:
                raise TargetError(f"the target's snapshot of {snap.layout.root} has no log of run {run_id}")
            learn_env_text(snap.env.get(run_id), view.record, view.run.file("env"))
            version = engine_version or (view.record.get("profile") or {}).get("engine", {}).get("version")
            diag = diagnose_attempt(snap.attempt, state, version, engine=record_engine(view.record))

            data = {**bounded_diagnosis({**diag.to_json(), "hint": diag.hint}), "run_id": run_id,
                    "failed_at": failed_at(view.state), "now": _now(remote, snap)}
            prof = _profile_of(view.record)
            change = propose(diag, prof, []) if prof is not None else None
            data["would_change"] = change.to_json() if change else None
            return dict(mask_data(data))
        raise NotFound(f"{ref.name}: no failed attempt on {remote.label}")


def failed_at(state: Mapping[str, Any]) -> float | None:
    """When a failed run ended: its last crash, else the end of its engine, else its start (the supervisor's
    state; epoch seconds)."""
    crash = state.get("last_crash")
    for at in ((crash or {}).get("at") if isinstance(crash, dict) else None, state.get("ended_at"),
               state.get("updated_at"), state.get("started_at")):
        if isinstance(at, (int, float)):
            return float(at)
    return None


def _now(remote: Remote, snap: snapshot.Snapshot) -> dict[str, Any] | None:
    """The deployment as it is now (the failure diagnosed may be an old run's): its current run, its status and
    whether it answers its health path."""
    view = snap.current_view()
    if view is None:
        return None
    record = view.record
    port = int(record.get("port") or 0)
    alive = view.status in ("ready", "running")
    ok = alive and bool(port) and healthy(remote, port, str(record.get("health_path", "/health")),
                                          address=record_address(record))
    return {"run_id": view.run.run_id, "status": view.status, "healthy": ok}


def _profile_of(record: Mapping[str, Any]) -> Any:
    try:
        return Profile.model_validate(record.get("profile") or {})
    except ValidationError:
        return None
