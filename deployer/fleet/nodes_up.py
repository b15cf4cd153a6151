"""`deploy up` of one engine across nodes (`nodes:`): every node locked, checked, pushed and started as a group.

One SSH connection per node, opened and used concurrently (a small thread pool); every node's deployment lock
is held before anything changes on any node. Preflight: node 0 runs the single-host preflight (and its healing,
which then applies to every node), every node is checked for the same engine version, GPU count and model, the
engine ports and node 0's dist-init port free, and the dist-init port reachable from every follower. Each
attempt pushes every node's run dir (the single-host push/start/watch steps, as functions), stops what served
before (every rank at once: the followers end on rank 0's shutdown), starts all ranks, and watches rank 0's log and
health (the followers serve only a dummy health) and every follower's supervisor. When any rank dies, the whole
group is stopped and the diagnosis comes from the rank that failed first (nodes_diagnose.py); a known change
applies to every node and the group starts again. After `up`, the supervisors keep the group's fate (deployer/
supervisor/supervise_group.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from deployer.diagnose.diagnosis import Diagnosis
from deployer.errors import DeployError, LaunchFailed, PreflightFailed, RetriesExhausted
from deployer.fleet.nodes_checks import compare, dist_init_problems, network
from deployer.fleet.nodes_diagnose import RankEnd, first_failure
from deployer.fleet.fanout import at_once
from deployer.fleet.nodes_rollback import bring_back
from deployer.fleet.nodes_watch import FollowerEnded, NodeSession, for_node, watch_group
from deployer.fleet.nodes_plan import NodeNet, NodePlan, multinode_of, node_keys, plan_nodes, supervisor_overrides
from deployer.local_history import History
from deployer.logtext import bounded_diagnosis
from deployer.pipeline.before_launch import checked_profile
from deployer.pipeline.up import AttemptReport, UpOptions, UpReport, attempt_log, diagnose_attempt, locked_session
from deployer.preflight.facts import gather_facts
from deployer.profile.fixed import save_fixed
from deployer.profile.model import Profile
from deployer.push import Layout, RunDir, new_run_id, profile_record, push, set_current, supervisor_config
from deployer.push import write_outcome
from deployer.remedy import Change, propose
from deployer.remote.base import Remote
from deployer.render.bundle import Bundle, render
from deployer.secrets import masking_sink
from deployer.start import check_port, start, status, stop
from deployer.target.records import current_view, healthy
from deployer.watch.watcher import Crashed, Event, EventSink, Outcome, Ready

PORT_WAIT_S = 15.0
STOP_GRACE_CAP_S = 10.0
GROUP_WATCH_WAIT_S = 10.0


@dataclass
class NodesReport(UpReport):
    """The single-host report, plus one row per node (host, port, run dir, state)."""

    nodes: list[dict[str, Any]] = field(default_factory=list)


def _serialized(emit: EventSink) -> EventSink:
    """Events come from several threads: one at a time reaches the console."""
    lock = threading.Lock()

    def sink(event: Event) -> None:
        with lock:
            emit(event)
    return sink


@contextlib.contextmanager
def _sessions(plans: list[NodePlan], opts: UpOptions, emit: EventSink) -> Iterator[list[NodeSession]]:
    """Connect to every node and take every node's lock (concurrently); all released on exit."""
    managers = [locked_session(p.profile, opts, for_node(emit, p)) for p in plans]
    entered: list[contextlib.AbstractContextManager[tuple[Remote, Layout]]] = []
    guard = threading.Lock()

    def enter(index: int) -> tuple[Remote, Layout]:
        value = managers[index].__enter__()
        with guard:
            entered.append(managers[index])
        return value

    try:
        held = at_once(enter, list(range(len(plans))))
        yield [NodeSession(plan=p, remote=r, layout=layout) for p, (r, layout) in zip(plans, held)]
    finally:
        for manager in reversed(entered):
            with contextlib.suppress(DeployError):
                manager.__exit__(None, None, None)


def up_nodes(profile: Profile, opts: UpOptions, emit: EventSink) -> NodesReport:
    emit = _serialized(masking_sink(emit))
    plans = plan_nodes(profile)  # bad input is refused before any connection
    with _sessions(plans, opts, emit) as sessions:
        report = NodesReport(name=profile.name, host=_hosts(plans), status="failed")
        for s, view in zip(sessions, at_once(lambda s: current_view(s.remote, s.layout), sessions)):
            s.serving = view if view is not None and view.alive else None
        nets = network(sessions, profile)
        tried: list[Change] = []
        base, version = _preflight(sessions, profile, nets, opts, tried, report, emit)
        plans = plan_nodes(base, nets)
        if _already_running(sessions, plans, opts, report, emit):
            return report
        return _attempts(sessions, base, nets, opts, tried, version, report, emit, profile)


def _hosts(plans: list[NodePlan]) -> str:
    return ", ".join(p.node.host for p in plans)


# --- preflight --------------------------------------------------------------------------------------------------

def _preflight(sessions: list[NodeSession], profile: Profile, nets: list[NodeNet], opts: UpOptions,
               tried: list[Change], report: UpReport, emit: EventSink) -> tuple[Profile, str | None]:
    """The profile every node runs (node 0's preflight healing applied) and the engine version; PreflightFailed
    naming the node when the nodes differ or cannot form the group."""
    version = profile.engine.version
    base = profile
    if not opts.skip_preflight:
        leader = sessions[0]
        own_port = leader.serving is not None and leader.serving.record.get("port") == leader.plan.port
        checked, version, _dry = checked_profile(
            leader.remote, plan_nodes(profile, nets)[0].profile, heal=opts.heal, model_config=opts.model_config,
            own_port=own_port, tried=tried, emit=for_node(emit, leader.plan), notes=report.before_launch,
            warnings=report.warnings)
        base = _rebased(profile, checked)
    plans = plan_nodes(base, nets)
    facts = at_once(lambda pair: gather_facts(pair[0].remote, pair[1].profile), list(zip(sessions, plans)))
    problems = compare(sessions, plans, facts, opts.skip_preflight)
    problems += dist_init_problems(sessions, plans)
    if problems:
        for problem in problems:
            emit(Event("problem", {"message": problem}))
        raise PreflightFailed(problems)
    return base, version or facts[0].engine_version


def _rebased(profile: Profile, checked: Profile) -> Profile:
    """The profile with what node 0's preflight changed (args and env), minus what `nodes:` sets per node."""
    multinode = multinode_of(profile)
    per_node = set(node_keys(multinode))
    args: dict[str, Any] = {k: v for k, v in checked.engine.args.items() if k not in per_node}
    args.update({k: None for k in profile.engine.args if k not in checked.engine.args})
    env: dict[str, str | None] = {k: v for k, v in checked.engine.env.items()
                                  if k not in multinode.nic_env or k in profile.engine.env}
    env.update({k: None for k in profile.engine.env if k not in checked.engine.env})
    return profile.patched(args=args, env=env)


def _already_running(sessions: list[NodeSession], plans: list[NodePlan], opts: UpOptions, report: NodesReport,
                     emit: EventSink) -> bool:
    bundles = [render(p.profile) for p in plans]
    same = all(s.serving is not None and s.serving.content_hash == b.content_hash
               for s, b in zip(sessions, bundles))
    if opts.force or not same or not healthy(sessions[0].remote, plans[0].port, plans[0].profile.health.path):
        return False
    emit(Event("info", {"message": f"{plans[0].profile.name} {bundles[0].short_hash} is already running on every "
                                   "node and rank 0 is healthy"}))
    report.status, report.content_hash = "already-running", bundles[0].content_hash
    report.run_dir = sessions[0].serving.run.path if sessions[0].serving else None
    report.nodes = [_row(s, "running") for s in sessions]
    return True


# --- attempts ---------------------------------------------------------------------------------------------------

def _attempts(sessions: list[NodeSession], base: Profile, nets: list[NodeNet], opts: UpOptions,
              tried: list[Change], version: str | None, report: NodesReport, emit: EventSink,
              original: Profile) -> NodesReport:
    """Bounded attempts; a failure after the group that served was stopped brings that group back."""
    replaced: list[bool] = [False]
    rows = Rows(History.kept(opts.local_history))
    try:
        return _attempt_loop(sessions, base, nets, opts, tried, version, report, emit, original, replaced, rows)
    except DeployError as exc:
        rows.end_open("not-started")
        bring_back(sessions, base, rollback=opts.rollback, stopped=replaced[0], report=report, emit=emit, exc=exc)
        raise
    finally:
        rows.history.close()


@dataclass
class Rows:
    """This `up`'s attempt rows in the local history (`deploy history`): one per node and attempt."""

    history: History
    open: list[int] = field(default_factory=list)

    def begin(self, sessions: list[NodeSession], up_id: str, attempt: int, content_hash: str) -> None:
        self.open = [self.history.begin_attempt(deployment=s.plan.profile.name, host=s.remote.label, up_id=up_id,
                                                attempt=attempt, run_id=s.run.run_id if s.run else "",
                                                content_hash=content_hash, profile=s.plan.profile.public_dict())
                     for s in sessions]

    def end(self, item: AttemptReport) -> None:
        for row in self.open:
            self.history.end_attempt(row, outcome=item.outcome, diagnosis=item.diagnosis, change=item.change)
        self.open = []

    def end_open(self, outcome: str) -> None:
        for row in self.open:
            self.history.end_attempt(row, outcome=outcome, diagnosis=None, change=None)
        self.open = []


def _attempt_loop(sessions: list[NodeSession], base: Profile, nets: list[NodeNet], opts: UpOptions,
                  tried: list[Change], version: str | None, report: NodesReport, emit: EventSink,
                  original: Profile, replaced: list[bool], rows: Rows) -> NodesReport:
    up_id = uuid.uuid4().hex[:12]
    for attempt in range(1, base.retry.max_attempts + 1):
        plans = plan_nodes(base, nets)
        for s, plan in zip(sessions, plans):
            s.plan = plan
        bundles = [render(p.profile) for p in plans]
        emit(Event("attempt", {"attempt": attempt, "content_hash": bundles[0].content_hash,
                               "host": _hosts(plans)}))
        for s, run in zip(sessions, at_once(lambda pair: _push(pair[0], pair[1], plans, attempt, up_id),
                                        list(zip(sessions, bundles)))):
            s.run = run
        rows.begin(sessions, up_id, attempt, bundles[0].content_hash)
        wait = 5.0
        if attempt == 1:
            wait, replaced[0] = _stop_serving(sessions, base, report, emit), any(s.serving for s in sessions)
        at_once(lambda s: _start(s, wait), sessions)
        outcome = watch_group(sessions, base, emit)
        item = AttemptReport(attempt, sessions[0].run.run_id if sessions[0].run else "", bundles[0].content_hash,
                             _outcome_name(outcome), outcome.describe() if not isinstance(outcome, Ready) else "ready")
        report.attempts.append(item)
        if isinstance(outcome, Ready):
            if opts.save_fixed is not None and original.source is not None:
                save_fixed(original.source, original, base, [c.reason for c in tried if c.reason and not c.is_empty()],
                           opts.save_fixed)
                report.saved_fixed = str(opts.save_fixed)
            rows.end(item)
            _await_group_watch(sessions, base, report, emit)
            return _finish(sessions, bundles, item, report, emit)
        _stop_group(sessions, base)
        diag, rank = _diagnose(sessions, outcome, version, base.engine.kind)
        item.diagnosis = bounded_diagnosis({**diag.to_json(), "hint": diag.hint, "node": rank,
                                            "host": sessions[rank].plan.node.host})
        item.detail = f"{item.detail}; node {rank} failed first"
        emit(Event("diagnosis", {"attempt": attempt, **item.diagnosis}))
        at_once(lambda s: _try_outcome(s, item), sessions)
        change = _next_change(diag, base, opts, tried, item, emit)
        rows.end(item)
        if change is None:
            why = "healing disabled (--no-heal)" if not opts.heal else "no known change fixes it"
            report.nodes = [_row(s, "stopped") for s in sessions]
            raise LaunchFailed(f"{base.name}: {item.detail}: {diag.summary} ({why})", outcome=report,
                               hint=diag.hint)
        if not change.is_empty():
            base = base.patched(args=change.args, env=change.env)
    report.nodes = [_row(s, "stopped") for s in sessions]
    exhausted = RetriesExhausted(f"{base.name}: not ready after {base.retry.max_attempts} attempts; last: "
                                 f"{report.attempts[-1].detail}", attempts=report.attempts)
    exhausted.outcome = report
    raise exhausted


def _push(s: NodeSession, bundle: Bundle, plans: list[NodePlan], attempt: int, up_id: str) -> RunDir:
    """One node's run dir: the single-host push, with the group's part of supervise.json."""
    every = s.plan.profile.health.interval_s
    config = {**supervisor_config(s.plan.profile), **supervisor_overrides(plans, s.rank, every)}
    return push(s.remote, s.layout, bundle, profile_record(s.plan.profile, bundle, attempt=attempt, up_id=up_id),
                config, new_run_id(bundle, attempt))


def _await_group_watch(sessions: list[NodeSession], profile: Profile, report: UpReport, emit: EventSink) -> None:
    """Ready means the supervisors keep the group's fate too: wait (bounded) until node 0's supervisor has seen
    every follower's health and every follower's its connection to node 0; a peer it cannot see is a warning."""
    deadline = time.monotonic() + GROUP_WATCH_WAIT_S + 4 * profile.health.interval_s
    want = {s.rank: (len(sessions) - 1 if s.rank == 0 else 1) for s in sessions}
    blind: list[NodeSession] = list(sessions)
    for _ in range(10_000):  # bounded by the deadline
        states = at_once(lambda s: status(s.remote, s.run) if s.run else {}, blind)
        blind = [s for s, st in zip(blind, states) if len(st.get("group_seen") or []) < want[s.rank]]
        if not blind or time.monotonic() >= deadline:
            break
        time.sleep(min(profile.health.interval_s, 1.0))
    for s in blind:
        peers = "every follower's dummy health" if s.rank == 0 else "its connection to node 0's rendezvous port"
        message = (f"{s.plan.label}: its supervisor cannot see {peers} yet, so after `up` a dead peer may not take "
                   "this rank down with it (check that node 0 reaches the followers' engine ports)")
        report.warnings.append(message)
        emit(Event("warning", {"message": message, "node": s.rank, "host": s.plan.node.host}))


def _stop_serving(sessions: list[NodeSession], profile: Profile, report: UpReport, emit: EventSink) -> float:
    """Stop the group that served before (its run dirs stay), every rank's supervisor asked at once: rank 0's
    graceful shutdown ends the followers (which ignore SIGTERM) within the grace."""
    serving = [s for s in sessions if s.serving is not None]
    if not serving:
        return 0.0
    emit(Event("info", {"message": f"stopping the running version on {len(serving)} node(s) to replace it"}))
    report.replaced = serving[0].serving.run.run_id if serving[0].serving else None
    grace = min(profile.restart.grace_s, STOP_GRACE_CAP_S)
    at_once(lambda s: stop(s.remote, s.serving.run, grace) if s.serving else None, serving)
    return PORT_WAIT_S


def _start(s: NodeSession, port_wait: float) -> None:
    assert s.run is not None
    if port_wait > 0:
        check_port(s.remote, s.layout, s.plan.port, wait_s=port_wait)
    set_current(s.remote, s.layout, s.run)
    s.launch = start(s.remote, s.run)


def _stop_group(sessions: list[NodeSession], profile: Profile) -> None:
    """Every rank of this attempt stopped, all at once (as in _stop_serving)."""
    grace = min(profile.restart.grace_s, STOP_GRACE_CAP_S)
    at_once(lambda s: stop(s.remote, s.run, grace) if s.run else None, sessions)


def _diagnose(sessions: list[NodeSession], outcome: Outcome | FollowerEnded, version: str | None,
              kind: str) -> tuple[Diagnosis, int]:
    """The first rank that failed, and its diagnosis; rank 0's own (a hang, a timeout) when no rank ended."""
    def end(s: NodeSession) -> RankEnd:
        assert s.run is not None and s.launch is not None
        state = status(s.remote, s.run)
        raw = state.get("last_crash")
        crash: dict[str, Any] = raw if isinstance(raw, dict) else {}
        tb = crash.get("traceback_offset", state.get("traceback_offset"))
        log = attempt_log(s.remote, s.run, s.launch.log_offset, tb if isinstance(tb, int) else None)
        return RankEnd(rank=s.rank, log=log, state=state, utc_offset_s=s.net.utc_offset_s if s.net else 0)

    first = first_failure(at_once(end, sessions), version=version, kind=kind)
    if first is not None:
        return first.diagnosis, first.rank
    leader = sessions[0]
    assert leader.launch is not None
    if isinstance(outcome, FollowerEnded):
        outcome = Crashed(0.0, outcome.state.get("exit_code"), outcome.state.get("signal"),
                          outcome.state.get("signal_name"), [])
    return diagnose_attempt(leader.remote, leader.launch, outcome, version, kind=kind), 0


def _next_change(diag: Diagnosis, profile: Profile, opts: UpOptions, tried: list[Change], item: AttemptReport,
                 emit: EventSink) -> Change | None:
    """The change for the next attempt (the empty one: retry a transient failure once), None to stop."""
    if not opts.heal:
        return None
    if diag.transient:
        unchanged = Change(reason=f"retry unchanged after transient {diag.signature}")
        if any(c.is_empty() and c.reason == unchanged.reason for c in tried):
            return None
        tried.append(unchanged)
        time.sleep(profile.retry.backoff_s)
        return unchanged
    change = propose(diag, profile, tried, None)
    if change is None:
        return None
    tried.append(change)
    item.change = change.to_json()
    emit(Event("change", {"attempt": item.attempt, **item.change}))
    return change


def _try_outcome(s: NodeSession, item: AttemptReport) -> None:
    if s.run is None:
        return
    try:
        write_outcome(s.remote, s.run, item.to_json())
    except DeployError:
        pass  # the failure being reported matters more than its record


def _finish(sessions: list[NodeSession], bundles: list[Bundle], item: AttemptReport, report: NodesReport,
            emit: EventSink) -> NodesReport:
    at_once(lambda s: _try_outcome(s, item), sessions)
    report.status, report.content_hash = "ready", bundles[0].content_hash
    report.run_dir = sessions[0].run.path if sessions[0].run else None
    report.nodes = [_row(s, "ready" if s.rank == 0 else "serving its dummy health") for s in sessions]
    for row in report.nodes:
        emit(Event("info", {"message": f"node {row['node']} {row['host']}: {row['state']} on port {row['port']} "
                                       f"({row['run_dir']})", "node": row["node"], "host": row["host"]}))
    return report


def _row(s: NodeSession, state: str) -> dict[str, Any]:
    run = s.run.path if s.run else (s.serving.run.path if s.serving else None)
    names = multinode_of(s.plan.profile).nic_env
    return {"node": s.rank, "host": s.plan.node.host, "addr": s.plan.addr, "port": s.plan.port,
            "nic": s.plan.profile.engine.env.get(names[0]) if names else None, "run_dir": run, "state": state}


def _outcome_name(outcome: Outcome | FollowerEnded) -> str:
    if isinstance(outcome, FollowerEnded):
        return "crashed"
    return {"Ready": "ready", "Crashed": "crashed", "Hung": "hung", "Stuck": "crashed", "TimedOut": "timeout",
            "PortTaken": "port-taken", "Unsupervised": "supervisor-lost"}.get(type(outcome).__name__, "failed")
