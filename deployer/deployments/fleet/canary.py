"""A fleet's canary rollout (`deploy up FLEET --canary`, and `run_canary` for other commands such as an engine
upgrade): one replica replaced first behind the router, judged against the others on live traffic, then the rest
promoted in batches, or the canary rolled back.

1. The canary: the first replica (in the profile's order) that does not already run the new profile, replaced the
   way a rolling update replaces one (out of the router, `up`, back in once it serves:
   rolling.py).
   One that does not start stops the rollout as a rolling update does (its previous version back, the rest
   untouched).
2. The window (rollout.canary.window_s): every serving replica's /metrics read at its start and end
   (canary_metrics.py); the canary's error rate, TTFT p99, ITL p99 and generated tokens/s against the others'
   (canary_judge.py, gates in the profile's `rollout.canary`).
3. Promote: the other replicas in batches of rollout.max_unavailable (one: the rolling update's own step, guarded
   against a client that dies; more: canary_batch.py), stopping at the first that does not serve again.
   Roll back: the canary goes back to its previous version (the single-host rollback: the newest other version
   that stayed up) through the router the same way; the others were never touched and served throughout.

Every decision is written with its numbers (canary_record.py) and is in the fleet's report (`canary`, notes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from deployer.errors import DeployError, ProfileError
from deployer.events import EventSink, Info, Warn
from deployer.deployments.fleet.canary_batch import roll_batch
from deployer.deployments.fleet.canary_judge import Verdict, judge
from deployer.deployments.fleet.canary_metrics import Connect, measure
from deployer.deployments.fleet.canary_record import end_entry, record, verdict_entry
from deployer.deployments.fleet.links import Links
from deployer.deployments.fleet.members import AddressOf, Fleet, ReplicaMember, fleet_of
from deployer.remote.connect import spec_of, ssh_address
from deployer.deployments.fleet.report import FleetReport, ReplicaResult
from deployer.deployments.fleet.rolling import Replace, Roller, Unchanged, roll_one
from deployer.deployments.fleet.router import workers
from deployer.deployments.fleet.up import fleet_up
from deployer.operate.deployment import Ref
from deployer.operate.rollback import rollback as rollback_replica
from deployer.profile.model import Profile, Rollout
from deployer.remote.base import Remote
from deployer.runner.fanout import TaggedSink
from deployer.runner.report import UpOptions
from deployer.box.push import Layout

Outcome = Literal["promoted", "rolled-back", "stopped", "unchanged"]
OUTCOMES: tuple[Outcome, ...] = ("promoted", "rolled-back", "stopped", "unchanged")


@dataclass(frozen=True)
class CanaryResult:
    """What `run_canary` did: promoted (every replica runs the new profile), rolled-back (the canary failed its
    gates and serves its previous version again), stopped (a replica did not start), or unchanged; with the
    verdict and its numbers (None when the canary never served) and the fleet's report."""

    outcome: Outcome
    verdict: Verdict | None
    report: FleetReport
    error: str | None = None


@dataclass(frozen=True)
class CanaryPlan:
    """What the canary roller needs beyond a rolling update's arguments."""

    rollout: Rollout
    back: Replace                      # a replica back to its previous version (the single-host rollback)
    connect: Connect                   # a replica's host's connection (its /metrics is read through it)
    local_history: bool = True


def check_canary(fleet: Fleet) -> None:
    """A canary needs a router and at least two replicas; ProfileError (one line) before anything is touched."""
    if fleet.router is None:
        raise ProfileError(f"{fleet.name}: --canary needs a router (router:): the canary is judged on the traffic "
                           "the router sends it")
    if len(fleet.replicas) < 2:
        raise ProfileError(f"{fleet.name}: --canary needs at least two replicas (one to judge, one to compare with)")


def canary_roller(plan: CanaryPlan) -> Roller:
    """A roller (rolling.Roller) that judges its first replica before it replaces the others."""
    def roller(fleet: Fleet, report: FleetReport, sink: TaggedSink, replace: Replace, remote: Remote | None,
               unchanged: Unchanged | None = None, layout: Layout | None = None) -> None:
        check_canary(fleet)
        assert remote is not None and fleet.router is not None
        _Rollout(plan, fleet, report, sink, replace, remote, unchanged, layout).run()
    return roller


class _Rollout:
    """One canary rollout through one router session."""

    def __init__(self, plan: CanaryPlan, fleet: Fleet, report: FleetReport, sink: TaggedSink, replace: Replace,
                 remote: Remote, unchanged: Unchanged | None, layout: Layout | None) -> None:
        self.plan, self.fleet, self.report, self.sink, self.replace = plan, fleet, report, sink, replace
        self.remote, self.unchanged, self.layout = remote, unchanged, layout
        self.results: dict[int, ReplicaResult] = {}

    def run(self) -> None:
        self.report.mode = "canary"
        try:
            self._steps()
        finally:
            self.report.replicas = [self.results[r.index] for r in self.fleet.replicas if r.index in self.results]

    def _steps(self) -> None:
        canary = self._first_changed()
        if canary is None:
            self.report.notes.append("every replica already runs this profile: no canary to judge")
            self._end("unchanged")
            return
        result = roll_one(self.fleet, canary, self.sink, self.replace, self.remote, None, self.layout)
        self.results[canary.index] = result
        if result.error is not None:
            self._stopped(canary, result.error)
            return
        verdict = self._judge(canary)
        if verdict is not None and verdict.decision == "promote":
            self._promote(canary)
        else:
            self._roll_back(canary, verdict)

    def _first_changed(self) -> ReplicaMember | None:
        for replica in self.fleet.replicas:
            if self.unchanged is None or not self.unchanged(replica):
                return replica
            self.results[replica.index] = ReplicaResult(replica.index, replica.host, replica.name, replica.url,
                                                        "unchanged")
        return None

    def _judge(self, canary: ReplicaMember) -> Verdict | None:
        """The window, the verdict (None: the canary has no numbers), both said and written with the numbers."""
        gates = self.plan.rollout.canary
        have = workers(self.remote, self.fleet.router) if self.fleet.router else {}
        serving = [r for r in self.fleet.replicas if r is not canary and r.url in have and have[r.url].healthy]
        on_old = [r for r in serving if r.index not in self.results]   # not `unchanged`: still the old version
        others = on_old or serving
        if serving and not on_old:
            self.report.notes.append("no replica on the old version serves: the canary is compared with replicas "
                                     "already on the new one")
        emit = self.sink.tagged(canary.host, f"r{canary.index}")
        emit(Info(message=f"canary r{canary.index} serves the new version: comparing its live metrics with "
                          f"{', '.join(f'r{r.index}' for r in others) or 'no other replica'} for "
                          f"{gates.window_s:g}s"))
        reads = measure([canary, *others], self.plan.connect, gates.window_s)
        mine, rest = reads[0], reads[1:]
        for read in rest:
            if read.numbers is None:
                self.report.notes.append(f"r{read.member.index} left out of the canary's baseline: {read.problem}")
        verdict = None if mine.numbers is None else judge(
            mine.numbers, [r.numbers for r in rest if r.numbers is not None], gates, gates.window_s)
        none = f"canary r{canary.index} rolled back: no numbers ({mine.problem})"
        self.report.canary = verdict
        self.report.notes.append(verdict.headline() if verdict else none)
        emit(Info(message=verdict.summary() if verdict else none))
        self._write(verdict_entry(self.fleet.name, verdict, mine.problem, canary.index))
        return verdict

    def _promote(self, canary: ReplicaMember) -> None:
        rest = [r for r in self.fleet.replicas if r is not canary and r.index not in self.results]
        size = self.plan.rollout.max_unavailable
        for start in range(0, len(rest), size):
            batch = rest[start:start + size]
            if len(batch) == 1:
                done = {batch[0].index: roll_one(self.fleet, batch[0], self.sink, self.replace, self.remote,
                                                 self.unchanged, self.layout)}
            else:
                done = roll_batch(self.fleet, batch, self.sink, self.replace, self.remote, self.unchanged)
            self.results.update(done)
            failed = next((r for r in done.values() if r.error is not None), None)
            if failed is not None:
                self._stopped(self.fleet.replica(failed.index), failed.error or failed.status)
                return
        self._end("promoted")

    def _roll_back(self, canary: ReplicaMember, verdict: Verdict | None) -> None:
        why = "; ".join(verdict.reasons) if verdict else "it could not be judged"
        back = roll_one(self.fleet, canary, self.sink, self.plan.back, self.remote, None, self.layout)
        restored = {"status": back.status, "run_dir": back.run_dir, "content_hash": back.content_hash}
        self.results[canary.index] = dataclasses.replace(
            back, status="rolled-back" if back.serving else "failed", restored=restored,
            error=f"the canary was rolled back: {why}" + (f"; its rollback failed: {back.error}" if back.error else ""))
        self._leave_rest("not replaced: the canary was rolled back")
        self._end("rolled-back")

    def _stopped(self, replica: ReplicaMember, error: str) -> None:
        self.report.notes.append(f"rollout stopped at r{replica.index}@{replica.host}: {error}")
        self._leave_rest("not replaced: the rollout stopped before it")
        self._end("stopped")

    def _leave_rest(self, why: str) -> None:
        """The replicas not reached: left as they were (serving when the router calls them healthy)."""
        have = workers(self.remote, self.fleet.router) if self.fleet.router else {}
        for r in self.fleet.replicas:
            if r.index not in self.results:
                healthy = r.url in have and have[r.url].healthy
                self.results[r.index] = ReplicaResult(r.index, r.host, r.name, r.url,
                                                      "left-running" if healthy else "skipped", error=why)

    def _end(self, outcome: Outcome) -> None:
        self.report.outcome = outcome
        statuses = {i: r.status for i, r in self.results.items()}
        self._write(end_entry(self.fleet.name, outcome, statuses, self.report.notes))

    def _write(self, entry: dict[str, object]) -> None:
        assert self.fleet.router is not None
        warning = record(self.remote, self.fleet.router.target.workdir, self.fleet.name, entry,
                         self.plan.local_history)
        if warning:
            self.sink.tagged(self.fleet.router.host, "router")(Warn(message=warning))


def canary_up(profile: Profile, opts: UpOptions, emit: EventSink, rollout: Rollout | None = None,
              address_of: AddressOf = ssh_address) -> FleetReport:
    """`deploy up FLEET --canary`: a serving fleet is moved to `profile` through a canary judged by `rollout`
    (default: the profile's `rollout:`); a fleet that does not serve yet is started as `up` starts it (there is
    nothing to compare with). Raises as `up` does (a rolled-back canary: PartlyFailed, exit 9, the report along)."""
    check_canary(fleet_of(profile, address_of))
    plan = rollout or profile.rollout or Rollout()

    def roller_for(links: Links, given: UpOptions) -> Roller:
        def back(member: ReplicaMember, e: EventSink) -> object:
            t = member.profile.target
            return rollback_replica(Ref(member.name, spec_of(t, given.trust_new_host), t.workdir, member.profile), e,
                                    given)
        return canary_roller(CanaryPlan(plan, back, lambda m: links.to(m.profile.target), given.local_history))

    report = fleet_up(profile, opts, emit, address_of, roller_for)
    if report.mode == "fan-out":
        report.notes.append("the fleet did not serve yet: every replica was started (a canary needs a serving "
                            "fleet to compare with)")
    return report


def run_canary(profile: Profile, opts: UpOptions, emit: EventSink, rollout: Rollout | None = None,
               address_of: AddressOf = ssh_address) -> CanaryResult:
    """canary_up for other commands (an engine upgrade's `--apply` on a fleet): the rollout's own outcome is a
    result, never raised (`error`: its one-line summary when it was not promoted); ProfileError and the like
    (nothing was touched) do raise."""
    try:
        report = canary_up(profile, opts, emit, rollout, address_of)
    except DeployError as exc:
        outcome = getattr(exc, "outcome", None)
        if not isinstance(outcome, FleetReport):
            raise
        return CanaryResult(_outcome(outcome), outcome.canary, outcome, exc.message)
    return CanaryResult(_outcome(report), report.canary, report)


def _outcome(report: FleetReport) -> Outcome:
    for known in OUTCOMES:
        if report.outcome == known:
            return known
    return "promoted" if report.mode == "fan-out" and report.status == "ready" else "stopped"
