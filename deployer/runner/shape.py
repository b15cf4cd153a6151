"""What differs between running one host and a group of hosts: the targets of a run and the steps a shape owns.

A `HeldHost` is one host while `up` holds it (its lock-guarded connection and layout, the version it served, this
attempt's run dir and launch). A `Shape` carries out the per-shape steps on its targets: how each target's profile
and supervise.json are made, how the attempt is watched and diagnosed, how the previous version is watched when it
is brought back. `SingleHostShape` is a group of one; the node group (deployments/nodes/up.py) is the other shape.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from deployer.diagnose.diagnosis import Diagnosis
from deployer.engines import Engine
from deployer.engines import engine_for
from deployer.events import EventSink
from deployer.observe.timeline import PastStart, Prediction
from deployer.profile.model import Profile
from deployer.box.push import Layout, RunDir, supervisor_config
from deployer.remote.base import Remote
from deployer.runner.logs import diagnose_attempt
from deployer.runner.startup import read_past_starts
from deployer.runner.report import AttemptOutcome, FailedNode, UpReport, describe, outcome_name
from deployer.runner.timing import stop_grace
from deployer.box.process import Launch, stop
from deployer.box.records import RunView, record_address, record_engine
from deployer.box.tokenprobe import TokenProbe
from deployer.watch.hubcache import hub_cache
from deployer.watch.watcher import Hung, Outcome, ProbeRefused, Stuck, TimedOut, Unsupervised, Watcher

T = TypeVar("T")
R = TypeVar("R")


@dataclass(kw_only=True)
class HeldHost:
    """One host of the run while `up` holds it."""

    remote: Remote
    layout: Layout
    serving: RunView | None = None      # the version it served (alive) when `up` began
    run: RunDir | None = None           # this attempt's run dir
    launch: Launch | None = None        # this attempt's start


@dataclass(frozen=True)
class FollowerEnded:
    """A node group's follower ended while rank 0 was still starting."""

    rank: int
    state: dict[str, Any]

    def describe(self) -> str:
        return f"node {self.rank} ended ({self.state.get('status')})"


Result = Union[Outcome, FollowerEnded]   # what watching an attempt ends with


def result_name(result: Result) -> AttemptOutcome:
    return "crashed" if isinstance(result, FollowerEnded) else outcome_name(result)


def result_text(result: Result) -> str:
    return result.describe() if isinstance(result, FollowerEnded) else describe(result)


@dataclass(frozen=True)
class Found:
    """A failed attempt's diagnosis and the target it comes from (node: in a group, that target's node)."""

    diagnosis: Diagnosis
    index: int = 0
    node: FailedNode | None = None


class Shape(ABC):
    """The per-shape steps of a run over `targets` (the first is the one that serves: rank 0)."""

    hosts: str | None = None     # what an attempt event names as its host (a group: all of them)
    everywhere: str = ""         # how the restore's messages say where (" on every node")
    failure_hint: bool = False   # a failed launch's error carries the diagnosis' hint

    def __init__(self, targets: Sequence[HeldHost]) -> None:
        self.targets = list(targets)

    @property
    def leader(self) -> HeldHost:
        return self.targets[0]

    def each(self, work: Callable[[T], R], items: list[T]) -> list[R]:
        """`work` for every item (a group: at once), results in order."""
        return [work(item) for item in items]

    def profiles(self, base: Profile) -> list[Profile]:
        """Each target's profile for this attempt."""
        return [base]

    def sink(self, emit: EventSink, index: int) -> EventSink:
        """Where events from one target go (a node's carry its rank and host)."""
        return emit

    def supervisor_config(self, index: int, profile: Profile) -> Mapping[str, Any]:
        """One target's supervise.json."""
        return supervisor_config(profile)

    def serving_grace_s(self, profile: Profile) -> float:
        """How long stopping the version that served may take."""
        return profile.restart.grace_s

    @abstractmethod
    def stopping(self, serving: list[HeldHost]) -> str:
        """The line that says the version that served is being stopped."""

    def earlier_starts(self) -> list[PastStart]:
        """The starts the serving target's records keep (runner/startup.py), to predict this one from."""
        return read_past_starts(self.leader.remote, self.leader.layout)

    @abstractmethod
    def watch(self, profile: Profile, emit: EventSink, prediction: Prediction | None = None) -> Result:
        """This attempt, started on every target, until ready or failed (warning when it runs far beyond
        `prediction`, where the shape's watch can tell)."""

    @abstractmethod
    def stop_failed(self, result: Result, profile: Profile) -> None:
        """After a failed attempt: stop what may still run of it."""

    @abstractmethod
    def diagnose(self, result: Result, version: str | None, engine: Engine) -> Found:
        """Why the attempt failed."""

    @abstractmethod
    def watch_previous(self, profile: Profile, emit: EventSink) -> Result:
        """The version that served, started again on every target, until ready or failed."""

    def after_ready(self, emit: EventSink, report: UpReport) -> None:
        """What a shape adds to a ready run's report."""

    def after_failure(self, report: UpReport) -> None:
        """What a shape adds to a failed run's report."""


class SingleHostShape(Shape):
    """One host: the single-host Watcher, the attempt's own log."""

    def stopping(self, serving: list[HeldHost]) -> str:
        view = serving[0].serving
        assert view is not None
        return f"stopping the running version {view.content_hash[:12]} ({view.run.run_id}) to replace it"

    def watch(self, profile: Profile, emit: EventSink, prediction: Prediction | None = None) -> Result:
        target = self.leader
        assert target.launch is not None
        return Watcher(target.remote, target.launch, profile.engine.port, profile.health,
                       profile.engine.definition, emit,
                       cache=hub_cache(profile.engine.model_path, profile.engine.env),
                       address=profile.engine.probe_address, prediction=prediction,
                       probe=TokenProbe.of(profile)).run()

    def stop_failed(self, result: Result, profile: Profile) -> None:
        if isinstance(result, (Hung, Stuck, TimedOut, Unsupervised, ProbeRefused)):  # unsupervised: no restart policy
            # covers it; refused: it runs, but not as the profile asks
            assert self.leader.run is not None
            stop(self.leader.remote, self.leader.run, stop_grace(profile.restart.grace_s), why="failed")

    def diagnose(self, result: Result, version: str | None, engine: Engine) -> Found:
        assert self.leader.launch is not None and not isinstance(result, FollowerEnded)
        return Found(diagnose_attempt(self.leader.remote, self.leader.launch, result, version, engine=engine))

    def watch_previous(self, profile: Profile, emit: EventSink) -> Result:
        target = self.leader
        view = target.serving
        assert view is not None and target.launch is not None
        port = int(view.record.get("port") or profile.engine.port)
        health = profile.health.model_copy(update={"path": str(view.record.get("health_path") or profile.health.path)})
        return Watcher(target.remote, target.launch, port, health,
                       record_engine(view.record), emit,
                       address=record_address(view.record), probe=TokenProbe.of_record(view.record, profile)).run()
