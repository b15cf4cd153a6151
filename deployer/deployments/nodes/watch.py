"""One multi-node attempt while it starts: the nodes as `up` holds them, and the group's watch (rank 0's log and
health through the single-host Watcher, polled one step at a time, and every follower's supervisor state)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from deployer.errors import DeployError
from deployer.deployments.nodes.net import NetFacts
from deployer.deployments.nodes.plan import NodePlan
from deployer.runner.fanout import at_once
from deployer.profile.model import Profile
from deployer.runner.shape import FollowerEnded, HeldHost
from deployer.box.process import status
from deployer.box.tokenprobe import TokenProbe
from deployer.watch.hubcache import hub_cache
from deployer.events import Event, EventSink, FollowerExited
from deployer.observe.timeline import Prediction
from deployer.watch.watcher import DEAD_STATES, Outcome, Ready, Watcher


@dataclass(kw_only=True)
class NodeSession(HeldHost):
    """One node while `up` holds it: a target of the run (connection, layout, this attempt's run), and its plan."""

    plan: NodePlan
    net: NetFacts | None = None

    @property
    def rank(self) -> int:
        return self.plan.rank


def for_node(emit: EventSink, plan: NodePlan) -> EventSink:
    def sink(event: Event) -> None:
        emit(dataclasses.replace(event, node=plan.rank, host=plan.node.host))
    return sink


def watch_group(sessions: list[NodeSession], profile: Profile, emit: EventSink, port: int | None = None,
                prediction: Prediction | None = None) -> Outcome | FollowerEnded:
    """Rank 0's log and health (the single-host watch, one poll at a time) and every follower's supervisor.
    `port`: rank 0's port when it is not the plan's (an earlier run brought back); `prediction`: rank 0's start
    is checked against it (far beyond: a warning)."""
    leader = sessions[0]
    assert leader.launch is not None
    watcher = Watcher(leader.remote, leader.launch, port or leader.plan.port, profile.health,
                      profile.engine.definition,
                      for_node(emit, leader.plan), cache=hub_cache(profile.engine.model_path, profile.engine.env),
                      prediction=prediction, probe=TokenProbe.of(profile, port or leader.plan.port))
    delay, next_look = 0.1, 0.0
    for _ in range(10_000_000):  # bounded by the watcher's startup and stall deadlines
        outcome = watcher.poll_once()
        if isinstance(outcome, Ready):
            ended = _followers_ended(sessions[1:])
            return ended or outcome
        if outcome is not None:
            return outcome
        if time.monotonic() >= next_look:
            ended = _followers_ended(sessions[1:])
            if ended is not None:
                emit(FollowerExited(message=ended.describe(), node=ended.rank))
                return ended
            next_look = time.monotonic() + profile.health.interval_s
        time.sleep(delay)
        delay = min(delay * 1.6, profile.health.interval_s)
    raise DeployError("watch loop ran out of polls")  # pragma: no cover


def _followers_ended(followers: list[NodeSession]) -> FollowerEnded | None:
    states = at_once(lambda s: status(s.remote, s.run) if s.run else {}, followers)
    for s, state in zip(followers, states):
        if state.get("status") in DEAD_STATES:
            return FollowerEnded(s.rank, state)
    return None
