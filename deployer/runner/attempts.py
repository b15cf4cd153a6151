"""The attempt loop: push -> stop what served (attempt 1) -> start -> watch -> diagnose -> change -> again, bounded.

`AttemptRunner` owns one `up`'s run over its shape's targets (one host, or a node group): the profile as it is
changed, the options, the event sink, the report, the local history rows, the changes tried (no identical change
twice) and whether the version that served was stopped (then a failure brings it back: restore.py). Each attempt
writes its outcome to every target (outcome.json) and to the local history.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from deployer.diagnose.drift import compare, masked, parse_args_dump
from deployer.remedy.effective import DryResolution
from deployer.engines import engine_for
from deployer.errors import (
    CommandFailed, DeployError, LaunchFailed, LockLost, PortBusy, RetriesExhausted, TransferFailed,
)
from deployer.events import AttemptStarted, Changed, Diagnosed, Drift, Event, EventSink, Info, PhaseEntered, RunPushed
from deployer.logtext import clip, printable
from deployer.observe.timeline import PastStart, Timeline
from deployer.profile.fixed import save_fixed
from deployer.profile.model import Profile
from deployer.box.push import RunDir, disk_full, new_run_id, profile_record, push, write_outcome
from deployer.remedy.propose import Change, propose
from deployer.render.bundle import Bundle, render
from deployer.runner.history import AttemptRows
from deployer.runner.interrupted import Interrupted
from deployer.runner.logs import attempt_values, log_head
from deployer.runner.report import AttemptReport, PhaseSeen, UpOptions, UpReport
from deployer.runner.restore import Restore, amend
from deployer.runner.startup import StartPlan, timeline_of
from deployer.runner.shape import Found, Result, Shape, HeldHost, result_name, result_text
from deployer.runner.timing import PORT_WAIT_S, RETRY_PORT_WAIT_S, stop_grace
from deployer.box.process import (ReplaceGuard, announce_stop, arm_repair, disarm_repair, drain_of, listener,
                                  stop)
from deployer.box.switch import Ports, switch_to
from deployer.watch.watcher import PortTaken, Ready


def _timeline(seen: list[PhaseSeen], result: Result) -> Timeline:
    """The attempt's timeline: its phases until ready (or until it ended)."""
    ended = float(getattr(result, "elapsed", seen[-1].elapsed if seen else 0.0))
    return timeline_of(seen, ended if isinstance(result, Ready) else None, ended)


class PhaseLog:
    """An event sink that passes every event on and keeps the phases the watch saw (the attempt's timeline, kept in
    outcome.json and the history: the dashboard draws it)."""

    def __init__(self, emit: EventSink) -> None:
        self.emit = emit
        self.seen: list[PhaseSeen] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, PhaseEntered) and event.node in (None, 0):
            self.seen.append(PhaseSeen(event.phase, event.elapsed))
        self.emit(event)


@dataclass
class AttemptRunner:
    """One `up`'s attempts. `profile`: what attempt 1 runs (preflight's changes applied); `original`: the profile
    as written (--save-fixed writes the difference); `pushed`: attempt 1's run dir on the leader, already pushed."""

    shape: Shape
    profile: Profile
    opts: UpOptions
    emit: EventSink
    report: UpReport
    up_id: str
    original: Profile
    version: str | None = None                # the target's engine version
    dry: DryResolution | None = None          # the engine's dry resolution of the args (remedies start from it)
    tried: list[Change] = field(default_factory=list)
    written_hash: str | None = None           # attempt 1's bundle as the profile is written (profile.json says)
    pushed: RunDir | None = None
    stopped: bool = False                     # the version that served was stopped: a failure brings it back
    profiles: list[Profile] = field(default_factory=list)   # each target's profile in this attempt
    rows: AttemptRows = field(init=False)
    past: list[PastStart] | None = None       # the starts the target's records keep (read at attempt 1)
    guarded: list[HeldHost] = field(default_factory=list)   # targets whose repair guard is armed (_stop_one)
    left_stopped: str | None = None           # why a failure leaves the stopped version stopped (the guard is told)

    @property
    def targets(self) -> list[HeldHost]:
        return self.shape.targets

    def run(self) -> UpReport:
        self.rows = AttemptRows(self.opts.local_history)
        settled = True  # False while a bring-back runs: a second interrupt that cuts it short leaves the guard armed
        try:
            return self._attempts()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: a replace is not left half done (runner/interrupted.py)
            if self.stopped:
                settled = False
                Interrupted(self.shape, self.shape.serving_grace_s(self.profile), self.emit).bring_back()
                settled = True
            raise
        except DeployError as failed:  # a failed launch too (not Ctrl-C: that leaves at once)
            self.rows.end_open("not-started")
            exc = self._named_cause(failed)
            if self.stopped:
                Restore(self.shape, self.profile, [p.engine.port for p in self.profiles], self.emit) \
                    .bring_back(exc, self.report, rollback=self.opts.rollback)
                self.left_stopped = None if self.opts.rollback else "--no-rollback"
                self._handed_over(exc)
            if exc is failed:
                raise
            raise exc from failed
        finally:
            if settled:
                self._disarm()
            else:  # the target's guard finishes it once the lock is released (supervise_guard.py)
                self.guarded.clear()
            self.rows.close()

    def _named_cause(self, exc: DeployError) -> DeployError:
        """A launch or a target command that failed on a full disk fails for that reason (exit 4), whatever it
        said (an engine whose supervisor could not write its state dies with no exit code)."""
        if not isinstance(exc, (LaunchFailed, CommandFailed, TransferFailed)):
            return exc
        for target in self.targets:
            full = disk_full(target.remote, target.layout.root) if target.layout is not None else None
            if full is not None:
                full.message, full.outcome = f"{self.profile.name}: {full.message}", getattr(exc, "outcome", None)
                return full
        return exc

    def _attempts(self) -> UpReport:
        for attempt in range(1, self.profile.retry.max_attempts + 1):
            if self._attempt(attempt):
                return self.report
        self.shape.after_failure(self.report)
        exhausted = RetriesExhausted(f"{self.profile.name}: not ready after {self.profile.retry.max_attempts} "
                                     f"attempts; last: {self.report.attempts[-1].detail}",
                                     attempts=self.report.attempts)
        exhausted.outcome = self.report
        raise exhausted

    def _attempt(self, attempt: int) -> bool:
        """One attempt; True when it is ready, False to try again (the change made), else raises."""
        self.profiles = self.shape.profiles(self.profile)
        bundles = [render(p) for p in self.profiles]
        self.emit(AttemptStarted(attempt=attempt, content_hash=bundles[0].content_hash, host=self.shape.hosts))
        self.shape.each(lambda i: self._push(i, bundles[i], attempt), list(range(len(self.targets))))
        self.rows.begin(self.targets, self.profiles, up_id=self.up_id, attempt=attempt,
                        content_hash=bundles[0].content_hash)
        if attempt == 1:
            self._start(stopped=self._stop_serving(), port_wait=PORT_WAIT_S)
        else:  # this run's own engine of the attempt before just stopped
            self._start(stopped=True, port_wait=RETRY_PORT_WAIT_S)
        start = self._start_plan(attempt)
        phases = PhaseLog(self.emit)
        result = self.shape.watch(start.watched(self.profile), phases, start.prediction)
        assert self.targets[0].run is not None
        item = AttemptReport(attempt, self.targets[0].run.run_id, bundles[0].content_hash, result_name(result),
                             result_text(result), phases=phases.seen, start_key=start.key,
                             timeline=_timeline(phases.seen, result))
        self.report.attempts.append(item)
        if isinstance(result, Ready):
            self._ready(item, bundles[0])
            return True
        if isinstance(result, PortTaken):
            self._port_taken(item)
        self._failed(item, result)
        return False

    def _start_plan(self, attempt: int) -> StartPlan:
        """This attempt's key, its prediction from the target's records (shown) and the `auto` deadline."""
        if self.past is None:
            self.past = self.shape.earlier_starts()
        start = StartPlan.of(self.profiles[0], self.version, self.targets[0].remote.label, self.past)
        predicted = start.event(attempt)
        if predicted is not None:
            self.emit(predicted)
        if start.deadline is not None:
            self.emit(Info(message=f"startup_timeout_s auto: {start.deadline.why}"))
        return start

    # --- push, stop, start -------------------------------------------------------------------------------------

    def _push(self, index: int, bundle: Bundle, attempt: int) -> None:
        target, profile = self.targets[index], self.profiles[index]
        if attempt == 1 and index == 0 and self.pushed is not None:
            target.run = self.pushed
        else:
            record = profile_record(profile, bundle, attempt=attempt, up_id=self.up_id, written_hash=self.written_hash)
            target.run = push(target.remote, target.layout, bundle, record,
                              self.shape.supervisor_config(index, profile), new_run_id(bundle, attempt))
        self.shape.sink(self.emit, index)(RunPushed(run_id=target.run.run_id, run_dir=target.run.path))

    def _stop_serving(self) -> bool:
        """Stop the version that served on every target (the new run dirs are complete) before any new run starts
        (a node group's nodes belong together); whether there was one."""
        serving = [t for t in self.targets if t.serving is not None]
        if not serving:
            return False
        self.emit(Info(message=self.shape.stopping(serving)))
        self.stopped = True  # from here on, a failure brings it back
        assert serving[0].serving is not None
        self.report.replaced = serving[0].serving.run.run_id
        grace = self.shape.serving_grace_s(self.profile)
        if len(serving) > 1:  # a node group: every rank hears of the stop before any rank is stopped
            self.shape.each(lambda t: self._announce(t, grace), serving)
        self.shape.each(lambda t: self._stop_one(t, grace), serving)
        return True

    @staticmethod
    def _announce(target: HeldHost, grace: float) -> None:
        """The stop of the version that served there, written ahead: its engine, should it end because another
        rank stopped first, is recorded as stopped rather than as a crash of that version (box/process)."""
        assert target.serving is not None
        announce_stop(target.remote, target.serving.run, grace, "replace")

    def _stop_one(self, target: HeldHost, grace: float) -> None:
        """Arm the target's repair guard (a version that reached ready comes back by itself if this client dies
        before the replace is done: supervise_guard.py), then stop the version that served there."""
        view = target.serving
        assert view is not None
        if view.reached_ready and target.run is not None and target.layout is not None:
            self.guarded.append(target)
            port = int(view.record.get("port") or 0)
            arm_repair(target.remote, target.layout, ReplaceGuard(target.run, view.run, grace, (port,) if port else ()))
        stop(target.remote, view.run, grace, why="replace", drain_s=drain_of(view.record))

    def _disarm(self) -> None:
        """The replace is done (its version started, or what it stopped was brought back, or the lock is lost:
        then the guard, seeing the lease is not ours, leaves by itself): each guard leaves, once it saw for itself
        that what should serve runs; `--no-rollback` says it leaves the stopped version stopped on purpose."""
        for target in self.guarded:
            assert target.layout is not None
            try:
                disarm_repair(target.remote, target.layout, left_stopped=self.left_stopped)
            except DeployError:
                pass
        self.guarded.clear()

    def _handed_over(self, exc: DeployError) -> None:
        """A failure whose bring-back did not serve again (the port taken meanwhile, by another user): the targets'
        guards, still armed, start the stopped version once they can (its port free, the lock released)."""
        restored = self.report.restored
        if self.guarded and self.opts.rollback and not isinstance(exc, LockLost) and \
                (restored is None or restored.status != "ready"):
            amend(exc, "the target's guard starts it again as soon as it can (its port free, the lock released): "
                       "see `deploy status`")

    def _start(self, *, stopped: bool, port_wait: float) -> None:
        """Every target switched to its run (box/switch.py: its port free, waited for when something was
        `stopped` just before, then `current`, then the start). A failure is recorded as such."""
        def one(index: int) -> None:
            target = self.targets[index]
            assert target.run is not None
            target.launch = switch_to(target.remote, target.layout, target.run,
                                      Ports((self.profiles[index].engine.port,)), serving=None,
                                      port_wait_s=port_wait, stopped=stopped)

        try:
            self.shape.each(one, list(range(len(self.targets))))
        except DeployError as exc:
            self.rows.end_open("not-started")
            self._record({"outcome": "not-started", "detail": exc.message})
            raise

    def _record(self, outcome: dict[str, object]) -> None:
        """outcome.json on every target that has this attempt's run (best effort)."""
        def one(target: HeldHost) -> None:
            if target.run is None:
                return
            try:
                write_outcome(target.remote, target.run, outcome)
            except DeployError:
                pass  # the failure being reported matters more than its record (a full disk, a dropped connection)
        self.shape.each(one, self.targets)

    # --- how the attempt ended ---------------------------------------------------------------------------------

    def _ready(self, item: AttemptReport, bundle: Bundle) -> None:
        item.drift = self._drift()
        for line in item.drift:
            self.emit(Drift(message=line))
        if self.opts.save_fixed is not None and self.original.source is not None:
            self._save_fixed(self.opts.save_fixed)
        self.rows.end(item)
        self._record(item.to_json())
        leader = self.targets[0]
        assert leader.run is not None
        self.report.status, self.report.run_dir, self.report.content_hash = "ready", leader.run.path, \
            bundle.content_hash
        self.report.drift = item.drift
        self.shape.after_ready(self.emit, self.report)

    def _drift(self) -> list[str]:
        """What the engine printed it runs with, against what the leader's profile asks."""
        leader, profile = self.targets[0], self.profiles[0]
        assert leader.launch is not None
        spec = profile.engine.definition
        resolved = parse_args_dump(log_head(leader.remote, leader.launch), spec.log.args_dump)
        if resolved is None:
            return []
        secret = spec.launch.secret_flags | profile.secret_arg_keys()
        asked = {k: v for k, v in profile.engine.args.items() if k not in secret}
        drifts = compare(asked, masked(resolved, secret), spec.knowledge.value_aliases, complete=spec.log.args_dump_complete)
        return [d.describe() for d in drifts]

    def _save_fixed(self, dest: Path) -> None:
        assert self.original.source is not None
        save_fixed(self.original.source, self.original, self.profile,
                   [c.reason for c in self.tried if c.reason and not c.is_empty()], dest)
        self.report.saved_fixed = str(dest)

    def _port_taken(self, item: AttemptReport) -> NoReturn:
        """The health answer came from another server: stop our engine, record it, exit 4 naming the holder."""
        grace = stop_grace(self.profile.restart.grace_s)
        self.shape.each(lambda t: stop(t.remote, t.run, grace) if t.run else None, self.targets)
        self.rows.end(item)
        self._record(item.to_json())
        raise PortBusy(f"{self.profile.name}: {item.detail} on {self.targets[0].remote.label}; this run's engine "
                       "was stopped", hint="stop what holds it, or set engine.port to another port")

    def _failed(self, item: AttemptReport, result: Result) -> None:
        """Diagnose the failed attempt and make the change for the next one; raises when there is none."""
        self.shape.stop_failed(result, self.profile)
        found = self.shape.diagnose(result, self.version, self.profile.engine.definition)
        item.diagnosis, item.failed_node = found.diagnosis, found.node
        if found.node is not None:
            item.detail = f"{item.detail}; node {found.node.rank} failed first"
        self.emit(Diagnosed(attempt=item.attempt, **(item.diagnosis_json() or {})))  # node, host: a group's
        change = self._next_change(item, found)
        self.rows.end(item)
        self._record(item.to_json())
        if change is None:
            self.shape.after_failure(self.report)
            raise self._not_started(item, found)
        if not change.is_empty():
            self.profile = self.profile.patched(args=change.args, env=change.env)

    def _next_change(self, item: AttemptReport, found: Found) -> Change | None:
        """The change for the next attempt (the empty one: retry a transient failure once), None to stop."""
        diag = found.diagnosis
        if not self.opts.heal:
            return None
        if diag.transient:
            # Retrying unchanged is itself a change (the empty one): made at most once per signature in one `up`.
            unchanged = Change(reason=f"retry unchanged after transient {diag.signature}")
            if any(c.is_empty() and c.reason == unchanged.reason for c in self.tried):
                return None
            self.tried.append(unchanged)
            self.emit(Info(message=f"transient failure; retrying unchanged in {self.profile.retry.backoff_s:g}s"))
            time.sleep(self.profile.retry.backoff_s)
            return unchanged
        target = self.targets[found.index]
        values = attempt_values(target.remote, target.launch, diag, self.profile, self.dry) \
            if diag.remedy is not None and target.launch is not None else None
        change = propose(diag, self.profile, self.tried, values)
        if change is None:
            return None
        self.tried.append(change)
        item.change = change
        self.emit(Changed(attempt=item.attempt, args=dict(change.args), env=dict(change.env), reason=change.reason,
                          basis=dict(change.basis)))
        return change

    def _not_started(self, item: AttemptReport, found: Found) -> DeployError:
        diag = found.diagnosis
        if diag.signature == "port-in-use":  # lost the port to a process that is not a deployment
            target, port = self.targets[found.index], self.profiles[found.index].engine.port
            assert target.run is not None
            holder = listener(target.remote, target.run, port)
            return PortBusy(f"{self.profile.name}: port {port} taken by {holder.describe()} on "
                            f"{target.remote.label} (the engine could not bind it)",
                            hint="stop what holds it, or set engine.port to another port")
        why = "healing disabled (--no-heal)" if not self.opts.heal else \
            "the known changes are used up" if diag.remedy else "no known change fixes it"
        return LaunchFailed(f"{self.profile.name}: {item.detail}: {clip(printable(diag.summary))} ({why})",
                            outcome=self.report, hint=diag.hint if self.shape.failure_hint else None)
