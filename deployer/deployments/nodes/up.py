"""`deploy up` of one engine across nodes (`nodes:`): every node locked, checked, pushed and started as a group.

One SSH connection per node, opened and used concurrently (a small thread pool); every node's deployment lock
is held before anything changes on any node. Preflight: node 0 runs the single-host preflight (and its healing,
which then applies to every node), every node is checked for the same engine version, GPU count and model, the
engine ports and node 0's dist-init port free, and the dist-init port reachable from every follower. The
attempts are the one attempt runner's (deployer/runner), with `NodeGroupShape` as its shape: each attempt pushes
every node's run dir, stops what served before (every rank at once: the followers end on rank 0's shutdown),
starts all ranks, and watches rank 0's log and health (the followers serve only a dummy health) and every
follower's supervisor. When any rank dies, the whole
group is stopped and the diagnosis comes from the rank that failed first (deployments/nodes/diagnose.py); a known change
applies to every node and the group starts again; after a failed replace the group that served is brought back
(runner/restore.py). After `up`, the supervisors keep the group's fate (deployer/supervisor/group.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from deployer.remedy.effective import DryResolution
from deployer.engines import Engine
from deployer.errors import DeployError, PreflightFailed
from deployer.events import Event, EventSink, Info, Problem, Warn
from deployer.observe.timeline import Prediction
from deployer.runner.fanout import at_once
from deployer.deployments.nodes.checks import compare, dist_init_problems, held_by, network
from deployer.deployments.nodes.diagnose import RankEnd, first_failure
from deployer.deployments.nodes.plan import NodeNet, NodePlan, multinode_of, node_keys, plan_nodes, supervisor_overrides
from deployer.deployments.nodes.watch import NodeSession, for_node, watch_group
from deployer.runner.before_launch import BeforeLaunch
from deployer.runner.install import launched_from, shared_environment
from deployer.runner.up import UpOptions, UpReport, attempt_log, diagnose_attempt, locked_session
from deployer.preflight.facts import gather_facts
from deployer.profile.model import Profile
from deployer.box.push import Layout, supervisor_config
from deployer.remedy.propose import Change
from deployer.remote.base import Remote
from deployer.render.bundle import render
from deployer.runner.attempts import AttemptRunner
from deployer.runner.weights import fetch_weights
from deployer.runner.report import FailedNode, restart_summary
from deployer.runner.shape import FollowerEnded, Found, Result, Shape, HeldHost
from deployer.runner.timing import stop_grace
from deployer.secrets import masking_sink
from deployer.box.process import status, stop
from deployer.box.records import current_view, healthy
from deployer.watch.watcher import Crashed

GROUP_WATCH_WAIT_S = 10.0
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class NodesReport(UpReport):
    """The single-host report, plus one row per node (host, port, run dir, state)."""

    nodes: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "nodes": [dict(row) for row in self.nodes]}


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
        python = shared_environment([(s.remote, s.plan.profile, for_node(emit, s.plan)) for s in sessions])
        if python is not None:  # engine.install: every node launches from its environment
            profile = launched_from(profile, python)
            for s, plan in zip(sessions, plan_nodes(profile)):
                s.plan = plan
        report = NodesReport(name=profile.name, host=_hosts(plans), status="failed",
                             restart=restart_summary(profile.restart))
        for s, view in zip(sessions, at_once(lambda s: current_view(s.remote, s.layout), sessions)):
            s.serving = view if view is not None and view.alive else None
        group = NodeGroupShape(sessions, network(sessions, profile))
        tried: list[Change] = []
        base, version, dry = _preflight(group, profile, opts, tried, report, emit)
        base, _ = fetch_weights([s.remote for s in sessions], base, emit, group.each, group.sink,  # before a stop
                                [s.plan.profile.target.workdir for s in sessions])
        if _already_running(sessions, plan_nodes(base, group.nets), opts, report, emit):
            return report
        runner = AttemptRunner(group, base, opts, emit, report, uuid.uuid4().hex[:12], profile, version=version,
                               dry=dry, tried=tried)
        return cast(NodesReport, runner.run())


def _hosts(plans: list[NodePlan]) -> str:
    return ", ".join(p.node.host for p in plans)


# --- preflight --------------------------------------------------------------------------------------------------

def _preflight(group: NodeGroupShape, profile: Profile, opts: UpOptions, tried: list[Change], report: UpReport,
               emit: EventSink) -> tuple[Profile, str | None, DryResolution | None]:
    """The profile every node runs (node 0's preflight healing applied) and the engine version; PreflightFailed
    naming the node when the nodes differ or cannot form the group."""
    sessions, nets = group.sessions, group.nets
    version = profile.engine.version
    base, dry = profile, None
    if not opts.skip_preflight:
        leader = sessions[0]
        own_port = leader.serving is not None and leader.serving.record.get("port") == leader.plan.port
        checked, version, dry = BeforeLaunch(opts, report, for_node(emit, leader.plan), tried).checked(
            leader.remote, plan_nodes(profile, nets)[0].profile, own_port=own_port)
        base = _rebased(profile, checked)
    plans = plan_nodes(base, nets)
    facts = at_once(lambda pair: gather_facts(pair[0].remote, pair[1].profile), list(zip(sessions, plans)))
    problems = compare(sessions, plans, facts, opts.skip_preflight, lambda p: held_by(sessions[p.rank], p.port))
    problems += dist_init_problems(sessions, plans)
    if problems:
        for problem in problems:
            emit(Problem(message=problem))
        raise PreflightFailed(problems)
    return base, version or facts[0].engine_version, dry


def _rebased(profile: Profile, checked: Profile) -> Profile:
    """The profile with what node 0's preflight changed (args and env), minus what `nodes:` sets per node."""
    multinode = multinode_of(profile)
    per_node = set(node_keys(multinode))
    args: dict[str, Any] = {k: v for k, v in checked.engine.args.items() if k not in per_node}
    args.update({k: None for k in profile.engine.args if k not in checked.engine.args})
    env: dict[str, str | None] = {k: v for k, v in checked.engine.env.items()
                                  if k not in multinode.nic_env or k in profile.engine.env}
    env.update({k: None for k in profile.engine.env if k not in checked.engine.env})
    rebased = profile.patched(args=args, env=env)  # and the version preflight pinned (a release without a drain flag)
    return rebased.model_copy(update={"engine": rebased.engine.model_copy(update={"version": checked.engine.version})})


def _already_running(sessions: list[NodeSession], plans: list[NodePlan], opts: UpOptions, report: NodesReport,
                     emit: EventSink) -> bool:
    bundles = [render(p.profile) for p in plans]
    same = all(s.serving is not None and s.serving.content_hash == b.content_hash
               for s, b in zip(sessions, bundles))
    if opts.force or not same or not healthy(sessions[0].remote, plans[0].port, plans[0].profile.health.path):
        return False
    emit(Info(message=f"{plans[0].profile.name} {bundles[0].short_hash} is already running on every "
                                   "node and rank 0 is healthy"))
    report.status, report.content_hash = "already-running", bundles[0].content_hash
    report.run_dir = sessions[0].serving.run.path if sessions[0].serving else None
    report.nodes = [_row(s, "running") for s in sessions]
    return True


# --- the node group as the attempt runner's shape ----------------------------------------------------------------

class NodeGroupShape(Shape):
    """Every node pushed and started at once; rank 0's log and health watched with every follower's supervisor;
    a failure stops the whole group and is diagnosed from the rank that failed first."""

    everywhere = " on every node"
    failure_hint = True

    def __init__(self, sessions: list[NodeSession], nets: list[NodeNet]) -> None:
        super().__init__(sessions)
        self.sessions, self.nets = sessions, nets
        self.hosts = _hosts([s.plan for s in sessions])

    def each(self, work: Callable[[T], R], items: list[T]) -> list[R]:
        return at_once(work, items)

    def profiles(self, base: Profile) -> list[Profile]:
        plans = plan_nodes(base, self.nets)
        for s, plan in zip(self.sessions, plans):
            s.plan = plan
        return [p.profile for p in plans]

    def sink(self, emit: EventSink, index: int) -> EventSink:
        return for_node(emit, self.sessions[index].plan)

    def supervisor_config(self, index: int, profile: Profile) -> Mapping[str, Any]:
        """The single-host supervise.json, with the group's part."""
        plans = [s.plan for s in self.sessions]
        return {**supervisor_config(profile), **supervisor_overrides(plans, index, profile.health.interval_s)}

    def serving_grace_s(self, profile: Profile) -> float:
        """Every rank's supervisor asked at once: rank 0's graceful shutdown ends the followers (which ignore
        SIGTERM) within the grace."""
        return stop_grace(profile.restart.grace_s)

    def stopping(self, serving: list[HeldHost]) -> str:
        return f"stopping the running version on {len(serving)} node(s) to replace it"

    def watch(self, profile: Profile, emit: EventSink, prediction: Prediction | None = None) -> Result:
        return watch_group(self.sessions, profile, emit, prediction=prediction)

    def stop_failed(self, result: Result, profile: Profile) -> None:
        """Every rank of this attempt stopped, all at once."""
        grace = stop_grace(profile.restart.grace_s)
        at_once(lambda s: stop(s.remote, s.run, grace, why="failed") if s.run else None, self.sessions)

    def diagnose(self, result: Result, version: str | None, engine: Engine) -> Found:
        """The first rank that failed, and its diagnosis; rank 0's own (a hang, a timeout) when no rank ended."""
        first = first_failure(at_once(_rank_end, self.sessions), version=version, engine=engine)
        rank = first.rank if first is not None else 0
        node = FailedNode(rank, self.sessions[rank].plan.node.host)
        if first is not None:
            return Found(first.diagnosis, rank, node)
        leader = self.sessions[0]
        assert leader.launch is not None
        if isinstance(result, FollowerEnded):
            result = Crashed(0.0, result.state.get("exit_code"), result.state.get("signal"),
                             result.state.get("signal_name"), [])
        return Found(diagnose_attempt(leader.remote, leader.launch, result, version, engine=engine), 0, node)

    def watch_previous(self, profile: Profile, emit: EventSink) -> Result:
        leader = self.sessions[0].serving
        assert leader is not None
        health = profile.health.model_copy(update={"path": str(leader.record.get("health_path") or profile.health.path)})
        return watch_group(self.sessions, profile.model_copy(update={"health": health}), emit,
                           port=int(leader.record.get("port") or self.sessions[0].plan.port))

    def after_ready(self, emit: EventSink, report: UpReport) -> None:
        assert isinstance(report, NodesReport)
        _await_group_watch(self.sessions, report, emit)
        report.nodes = [_row(s, "ready" if s.rank == 0 else "serving its dummy health") for s in self.sessions]
        for row in report.nodes:
            emit(Info(message=f"node {row['node']} {row['host']}: {row['state']} on port {row['port']} "
                              f"({row['run_dir']})", node=row["node"], host=row["host"]))

    def after_failure(self, report: UpReport) -> None:
        assert isinstance(report, NodesReport)
        report.nodes = [_row(s, "stopped") for s in self.sessions]


def _rank_end(s: NodeSession) -> RankEnd:
    """What one rank's attempt left: its log window and its supervisor's state."""
    assert s.run is not None and s.launch is not None
    state = status(s.remote, s.run)
    raw = state.get("last_crash")
    crash: dict[str, Any] = raw if isinstance(raw, dict) else {}
    tb = crash.get("traceback_offset", state.get("traceback_offset"))
    log = attempt_log(s.remote, s.run, s.launch.log_offset, tb if isinstance(tb, int) else None)
    return RankEnd(rank=s.rank, log=log, state=state, utc_offset_s=s.net.utc_offset_s if s.net else 0)


def _await_group_watch(sessions: list[NodeSession], report: UpReport, emit: EventSink) -> None:
    """Ready means the supervisors keep the group's fate too: wait (bounded) until node 0's supervisor has seen
    every follower's health and every follower's its connection to node 0; a peer it cannot see is a warning."""
    interval = sessions[0].plan.profile.health.interval_s
    deadline = time.monotonic() + GROUP_WATCH_WAIT_S + 4 * interval
    want = {s.rank: (len(sessions) - 1 if s.rank == 0 else 1) for s in sessions}
    blind: list[NodeSession] = list(sessions)
    for _ in range(10_000):  # bounded by the deadline
        states = at_once(lambda s: status(s.remote, s.run) if s.run else {}, blind)
        blind = [s for s, st in zip(blind, states) if len(st.get("group_seen") or []) < want[s.rank]]
        if not blind or time.monotonic() >= deadline:
            break
        time.sleep(min(interval, 1.0))
    for s in blind:
        peers = "every follower's dummy health" if s.rank == 0 else "its connection to node 0's rendezvous port"
        message = (f"{s.plan.label}: its supervisor cannot see {peers} yet, so after `up` a dead peer may not take "
                   "this rank down with it (check that node 0 reaches the followers' engine ports)")
        report.warnings.append(message)
        emit(Warn(message=message, node=s.rank, host=s.plan.node.host))


def _row(s: NodeSession, state: str) -> dict[str, Any]:
    run = s.run.path if s.run else (s.serving.run.path if s.serving else None)
    names = multinode_of(s.plan.profile).nic_env
    return {"node": s.rank, "host": s.plan.node.host, "addr": s.plan.addr, "port": s.plan.port,
            "nic": s.plan.profile.engine.env.get(names[0]) if names else None, "run_dir": run, "state": state}
