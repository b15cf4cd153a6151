"""Pipeline: `up` = render -> push -> start -> watch -> diagnose -> remedy -> retry, with the attempt history.

Each step lives in its own module; this one composes them, keeps the attempts bounded, makes no identical change
twice, and writes what happened to the target (outcome.json) and to the local history.

Push first, stop last: the serving version is stopped only once the new run dir is on the target, complete and
verified. If anything fails after that stop (the new version cannot be made to start, the port is taken, the
connection or the disk fails), the version that was serving is started again (unless --no-rollback) and the
report says so. Attempt 1's run dir goes up while preflight runs, when that can pay (pipeline/early_push.py).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from deployer.diagnose.diagnosis import Diagnosis, diagnose, hang_diagnosis, oom_killer_lines
from deployer.diagnose.drift import compare, masked, parse_server_args
from deployer.effective import DryResolution, EngineValues, engine_values
from deployer.engines import engine_for
from deployer.errors import DeployError, LaunchFailed, LockLost, PortBusy, ProfileError, RetriesExhausted, TargetError
from deployer.local_history import History
from deployer.lock import DeploymentLock
from deployer.pipeline.before_launch import checked_profile
from deployer.pipeline.early_push import Planned, early_push
from deployer.profile.fixed import save_fixed
from deployer.profile.model import Profile
from deployer.logtext import bounded_diagnosis
from deployer.watch.hubcache import hub_cache
from deployer.push import Layout, RunDir, layout_for, new_run_id, prepare, profile_record, push, set_current
from deployer.push import supervisor_config, write_outcome
from deployer.remedy import Change, propose
from deployer.remote.base import Remote
from deployer.remote.connect import conversing, target_spec
from deployer.render.bundle import Bundle, render
from deployer.secrets import masking_sink
from deployer.start import Launch, check_port, listener, start, status, stop
from deployer.target.records import RunView, current_run_id, current_view, healthy, read_json, record_address
from deployer.target.retention import tidy
from deployer.watch.watcher import (
    Crashed, Event, EventSink, Hung, Outcome, PortTaken, Ready, Stuck, TimedOut, Unsupervised,
)
from deployer.watch.watcher import Watcher

DIAG_WINDOW = 1 << 20
TAIL_WINDOW = 512 << 10
TRACEBACK = "Traceback (most recent call last)"
PORT_WAIT_S = 15.0            # for the port to free after a stop (a just-stopped server can hold it a while)


@dataclass(frozen=True)
class UpOptions:
    trust_new_host: bool = False
    heal: bool = True
    skip_preflight: bool = False
    save_fixed: Path | None = None
    model_config: Path | None = None
    force: bool = False
    what: str = "up"
    rollback: bool = True     # a failed replace brings the version that was serving back
    break_lock: bool = False
    local_history: bool = True   # write the attempts to this machine's SQLite history (deployer.api: off)


@dataclass
class AttemptReport:
    attempt: int
    run_id: str
    content_hash: str
    outcome: str                              # ready | crashed | hung | timeout
    detail: str
    diagnosis: dict[str, Any] | None = None
    change: dict[str, Any] | None = None      # the change made after this attempt
    drift: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class UpReport:
    name: str
    host: str
    status: str                               # ready | already-running | failed
    run_dir: str | None = None
    content_hash: str | None = None
    attempts: list[AttemptReport] = field(default_factory=list)
    replaced: str | None = None
    warnings: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    saved_fixed: str | None = None
    before_launch: list[dict[str, Any]] = field(default_factory=list)   # preflight diagnoses and changes
    restored: dict[str, Any] | None = None    # the version brought back after a failed replace: run_id, status

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@contextmanager
def locked_session(profile: Profile, opts: UpOptions, emit: EventSink,
                   connection: Remote | None = None) -> Iterator[tuple[Remote, Layout]]:
    """Connect once (or use `connection`, which stays open: a fleet's one connection per host), start the
    target-side helper, create the deployment dir, hold the deployment lock; release everything on exit.

    The remote handed out acts only while the lock is held: once it is lost, every call raises LockLost."""
    # the one exec channel (the first request rides with it): every step below talks to this helper
    with conversing(target_spec(profile, opts.trust_new_host), connection) as conv:
        layout = layout_for(conv, profile)
        prepare(conv, layout)
        with DeploymentLock(conv, layout, opts.what, break_lock=opts.break_lock,
                            notify=lambda m: emit(Event("warning", {"message": m}))) as lock:
            with lock.reporting_loss():
                yield lock.guarded(), layout


@dataclass
class Serving:
    """The version that was serving when `up` began: stopped only after the push, brought back on failure."""

    view: RunView
    stopped: bool = False


def up(profile: Profile, opts: UpOptions, emit: EventSink, connection: Remote | None = None) -> UpReport:
    """`connection`: an open connection to the profile's host to use (and leave open), else one of its own."""
    emit = masking_sink(emit)  # events carry engine text: the engine may print a secret (its own args dump)
    with locked_session(profile, opts, emit, connection) as (remote, layout):
        report = UpReport(name=profile.name, host=remote.label, status="failed")
        original, version = profile, profile.engine.version
        tried: list[Change] = []
        dry: DryResolution | None = None
        up_id = uuid.uuid4().hex[:12]
        view = current_view(remote, layout)
        running = view is not None and view.alive
        own_port = running and view is not None and view.record.get("port") == profile.engine.port
        written = _written(profile, up_id)
        with early_push(remote, layout, _early_plan(written, view, opts)) as early:
            if not opts.skip_preflight:
                profile, version, dry = checked_profile(remote, profile, heal=opts.heal,
                                                        model_config=opts.model_config, own_port=own_port,
                                                        tried=tried, emit=emit, notes=report.before_launch,
                                                        warnings=report.warnings)
            else:
                _check_engine_python(remote, profile)  # preflight's facts include this
            bundle = render(profile)
            if running and view is not None and _already_running(remote, view, profile, bundle, opts, report, emit):
                return report
            if not own_port:  # someone else's port: refused before anything changes
                check_port(remote, layout, profile.engine.port)
            written_hash = written.bundle.content_hash if written is not None else None
            pushed = early.claim(Planned.of(profile, up_id=up_id, written_hash=written_hash, bundle=bundle)) \
                if early is not None else None
        serving = Serving(view) if view is not None and running else None
        try:
            done = _attempts(remote, layout, profile, opts, report, emit, version, tried=tried, original=original,
                             serving=serving, dry=dry, up_id=up_id, written_hash=written_hash, pushed=pushed)
        except DeployError:  # a failed launch too (not Ctrl-C: that leaves at once)
            _tidy(remote, layout, profile, emit)
            raise
        _tidy(remote, layout, profile, emit)
        return done


def _already_running(remote: Remote, view: RunView, profile: Profile, bundle: Bundle, opts: UpOptions,
                     report: UpReport, emit: EventSink) -> bool:
    """The running version is this bundle and healthy: nothing to do (reported). One whose supervisor is gone is
    replaced (False, with a warning)."""
    if view.content_hash != bundle.content_hash or opts.force or \
            not healthy(remote, profile.engine.port, profile.health.path, address=profile.engine.probe_address):
        return False
    if not view.state.get("supervisor_alive"):
        _unsupervised(view, profile, report, emit)
        return False
    emit(Event("info", {"message": f"{profile.name} {bundle.short_hash} is already running and healthy"}))
    report.status, report.run_dir, report.content_hash = "already-running", view.run.path, bundle.content_hash
    return True


def _written(profile: Profile, up_id: str) -> Planned | None:
    """Attempt 1 as the profile is written (before preflight); None when it does not even render (the same error
    then comes, as before, after preflight)."""
    try:
        bundle = render(profile)
        return Planned.of(profile, up_id=up_id, written_hash=bundle.content_hash, bundle=bundle)
    except DeployError:
        return None


def _early_plan(written: Planned | None, view: RunView | None, opts: UpOptions) -> Planned | None:
    """What to push while preflight runs; None when an early push cannot pay: no preflight to overlap, or the
    running version is likely what this `up` finds already running (the same files, or what preflight made of
    this very profile before launch last time)."""
    if written is None or opts.skip_preflight:
        return None
    digest = written.bundle.content_hash
    if view is not None and view.alive and not opts.force and (
            view.content_hash == digest or (view.record.get("written_hash") == digest and
                                            view.record.get("attempt") == 1)):
        return None
    return written


def _tidy(remote: Remote, layout: Layout, profile: Profile, emit: EventSink) -> None:
    """Retention after every up: old runs lose their env file (secrets) at once, their dirs beyond keep_runs."""
    try:
        tidy(remote, layout, profile.retention.keep_runs)
    except DeployError as exc:  # never hides the outcome of the up itself
        emit(Event("warning", {"message": f"retention of old runs skipped: {exc}"}))


def _unsupervised(view: RunView, profile: Profile, report: UpReport, emit: EventSink) -> None:
    """A healthy engine whose supervisor is gone is no longer covered by the restart policy: replace it."""
    message = (f"{profile.name} {view.content_hash[:12]} is healthy but its supervisor (pid "
               f"{view.state.get('supervisor_pid')}) is gone, so the restart policy no longer covers it: "
               f"restarting it under a new supervisor")
    report.warnings.append(message)
    emit(Event("warning", {"message": message}))


def _check_engine_python(remote: Remote, profile: Profile) -> None:
    py = shlex.quote(profile.engine.python)
    result = remote.run(f"command -v {py} >/dev/null || test -x {py}", timeout=20, check=False)
    if not result.ok:
        raise TargetError(f"engine python {profile.engine.python} not found on {remote.label}",
                          hint="set engine.python to the interpreter that has the engine installed")


def _attempts(remote: Remote, layout: Layout, profile: Profile, opts: UpOptions, report: UpReport,
              emit: EventSink, version: str | None, *, tried: list[Change], original: Profile,
              serving: Serving | None, dry: DryResolution | None = None, up_id: str,
              written_hash: str | None = None, pushed: RunDir | None = None) -> UpReport:
    """pushed: attempt 1's run dir, already on the target (pushed while preflight ran)."""
    history = History.kept(opts.local_history)
    try:
        for attempt in range(1, profile.retry.max_attempts + 1):
            bundle = render(profile)
            emit(Event("attempt", {"attempt": attempt, "content_hash": bundle.content_hash}))
            run = pushed if attempt == 1 and pushed is not None else \
                push(remote, layout, bundle, profile_record(profile, bundle, attempt=attempt, up_id=up_id,
                                                            written_hash=written_hash),
                     supervisor_config(profile), new_run_id(bundle, attempt))
            emit(Event("pushed", {"run_id": run.run_id, "run_dir": run.path}))
            port_wait = _stop_serving(remote, serving, profile, report, emit) if attempt == 1 else 5.0
            set_current(remote, layout, run)
            row = history.begin_attempt(deployment=profile.name, host=remote.label, up_id=up_id, attempt=attempt,
                                        run_id=run.run_id, content_hash=bundle.content_hash,
                                        profile=profile.public_dict())
            launch = _start(remote, layout, run, profile.engine.port, port_wait, history, row)
            outcome = Watcher(remote, launch, profile.engine.port, profile.health,
                              engine_for(profile.engine.kind), emit,
                              cache=hub_cache(profile.engine.model_path, profile.engine.env),
                              address=profile.engine.probe_address).run()
            item = AttemptReport(attempt, run.run_id, bundle.content_hash, _outcome_name(outcome),
                                 _describe(outcome))
            report.attempts.append(item)
            if isinstance(outcome, Ready):
                _finish_ready(remote, run, launch, profile, bundle, item, report, emit)
                if opts.save_fixed is not None and original.source is not None:
                    _save_fixed(original, profile, tried, opts.save_fixed, report)
                history.end_attempt(row, outcome="ready", diagnosis=None, change=None)
                return report
            if isinstance(outcome, PortTaken):
                _port_taken(remote, run, profile, item, history, row)
            change = _after_failure(remote, run, launch, outcome, profile, opts, item, tried, version, emit, dry)
            history.end_attempt(row, outcome=item.outcome, diagnosis=item.diagnosis, change=item.change)
            write_outcome(remote, run, item.to_json())
            if change is False:
                _raise_not_started(remote, run, profile, opts, item, report)
            if isinstance(change, Change):
                profile = profile.patched(args=change.args, env=change.env)
        exhausted = RetriesExhausted(f"{profile.name}: not ready after {profile.retry.max_attempts} attempts; "
                                     f"last: {report.attempts[-1].detail}", attempts=report.attempts)
        exhausted.outcome = report
        raise exhausted
    except DeployError as exc:
        _bring_back(remote, layout, serving, profile, opts, report, emit, exc)
        raise
    finally:
        history.close()


def _stop_serving(remote: Remote, serving: Serving | None, profile: Profile, report: UpReport,
                  emit: EventSink) -> float:
    """Stop the version that was serving (the new run dir is already complete); the wait for its port."""
    if serving is None or serving.stopped:
        return 0.0
    view = serving.view
    emit(Event("info", {"message": f"stopping the running version {view.content_hash[:12]} "
                                   f"({view.run.run_id}) to replace it"}))
    serving.stopped = True  # from here on, a failure brings it back
    stop(remote, view.run, profile.restart.grace_s)
    report.replaced = view.run.run_id
    return PORT_WAIT_S


def _start(remote: Remote, layout: Layout, run: RunDir, port: int, port_wait: float, history: History,
           row: int) -> Launch:
    """Wait for the port to free (after a stop), then claim it and start: one step on the target, which also
    refuses a port that cannot be bound. A failure is recorded as such."""
    try:
        if port_wait > 0:
            check_port(remote, layout, port, wait_s=port_wait)
        return start(remote, run)
    except DeployError as exc:
        history.end_attempt(row, outcome="not-started", diagnosis=None, change=None)
        _try_write_outcome(remote, run, {"outcome": "not-started", "detail": exc.message})
        raise


def _try_write_outcome(remote: Remote, run: RunDir, data: dict[str, Any]) -> None:
    try:
        write_outcome(remote, run, data)
    except DeployError:
        pass  # the failure being reported matters more than its record (a full disk, a dropped connection)


def _port_taken(remote: Remote, run: RunDir, profile: Profile, item: AttemptReport, history: History,
                row: int) -> NoReturn:
    """The health answer came from another server: stop our engine, record it, exit 4 naming the holder."""
    stop(remote, run, min(profile.restart.grace_s, 10.0))
    history.end_attempt(row, outcome=item.outcome, diagnosis=None, change=None)
    _try_write_outcome(remote, run, item.to_json())
    raise PortBusy(f"{profile.name}: {item.detail} on {remote.label}; this run's engine was stopped",
                   hint="stop what holds it, or set engine.port to another port")


def _raise_not_started(remote: Remote, run: RunDir, profile: Profile, opts: UpOptions, item: AttemptReport,
                       report: UpReport) -> NoReturn:
    diagnosis = item.diagnosis or {}
    if diagnosis.get("signature") == "port-in-use":  # lost the port to a process that is not a deployment
        holder = listener(remote, run, profile.engine.port)
        raise PortBusy(f"{profile.name}: port {profile.engine.port} taken by {holder.describe()} on "
                       f"{remote.label} (the engine could not bind it)",
                       hint="stop what holds it, or set engine.port to another port")
    why = "healing disabled (--no-heal)" if not opts.heal else \
        "the known changes are used up" if diagnosis.get("remedy") else "no known change fixes it"
    summary = diagnosis.get("summary", "unknown failure")
    raise LaunchFailed(f"{profile.name}: {item.detail}: {summary} ({why})", outcome=report)


def _bring_back(remote: Remote, layout: Layout, serving: Serving | None, profile: Profile, opts: UpOptions,
                report: UpReport, emit: EventSink, exc: DeployError) -> None:
    """Last resort after a failed replace: start the version that was serving again, and say so."""
    if serving is None or not serving.stopped or not serving.view.reached_ready:
        return
    view = serving.view
    name = f"{view.content_hash[:12]} ({view.run.run_id})"
    if not opts.rollback:
        _amend(exc, f"the previous version {name} was not brought back (--no-rollback)")
        return
    if isinstance(exc, LockLost):  # whoever holds the lock now owns the target: change nothing more
        _amend(exc, f"the previous version {name} was not brought back (the lock is no longer ours)")
        return
    emit(Event("rollback", {"message": f"bringing back the previous version {name}", "run_id": view.run.run_id,
                            "content_hash": view.content_hash, "reason": exc.message}))
    report.restored = {"run_id": view.run.run_id, "content_hash": view.content_hash, "run_dir": view.run.path}
    try:
        outcome = _restart_run(remote, layout, view, profile, emit)
    except DeployError as err:
        report.restored.update(status="failed", detail=err.message)
        _amend(exc, f"bringing back the previous version {name} failed too: {err.message}")
        return
    report.restored.update(status=_outcome_name(outcome), detail=_describe(outcome))
    if isinstance(outcome, Ready):
        emit(Event("restored", {"message": f"the previous version {name} is serving again",
                                "run_id": view.run.run_id, "content_hash": view.content_hash}))
        _amend(exc, f"brought back the previous version {name}: it is serving again")
    else:
        _amend(exc, f"brought back the previous version {name}, but it did not become ready: {_describe(outcome)}")


def _restart_run(remote: Remote, layout: Layout, view: RunView, profile: Profile, emit: EventSink) -> Outcome:
    """Start an earlier run dir again in place (its own files, its own port) and watch it."""
    failed = current_run_id(remote, layout)
    if failed and failed != view.run.run_id and status(remote, layout.run(failed)).get("alive"):
        stop(remote, layout.run(failed), min(profile.restart.grace_s, 10.0))
    set_current(remote, layout, view.run)
    port = int(view.record.get("port") or profile.engine.port)
    check_port(remote, layout, port, wait_s=PORT_WAIT_S)
    launch = start(remote, view.run)
    health = profile.health.model_copy(update={"path": str(view.record.get("health_path") or profile.health.path)})
    return Watcher(remote, launch, port, health, engine_for(str(view.record.get("kind") or profile.engine.kind)),
                   emit, address=record_address(view.record)).run()


def _amend(exc: DeployError, note: str) -> None:
    exc.message = f"{exc.message}; {note}"
    exc.args = (exc.message,)


def _after_failure(remote: Remote, run: RunDir, launch: Launch, outcome: Outcome, profile: Profile,
                   opts: UpOptions, item: AttemptReport, tried: list[Change], version: str | None,
                   emit: EventSink, dry: DryResolution | None = None) -> Change | bool:
    """Diagnose a failed attempt: the change to make, True to retry unchanged (transient), False to stop."""
    if isinstance(outcome, (Hung, Stuck, TimedOut, Unsupervised)):  # unsupervised: no restart policy covers it
        stop(remote, run, min(profile.restart.grace_s, 10.0))
    diag = diagnose_attempt(remote, launch, outcome, version, kind=profile.engine.kind)
    item.diagnosis = bounded_diagnosis({**diag.to_json(), "hint": diag.hint})  # outcome.json, history, output
    emit(Event("diagnosis", {"attempt": item.attempt, **item.diagnosis}))
    if not opts.heal:
        return False
    if diag.transient:
        # Retrying unchanged is itself a change (the empty one): made at most once per signature in one `up`.
        unchanged = Change(reason=f"retry unchanged after transient {diag.signature}")
        if any(c.is_empty() and c.reason == unchanged.reason for c in tried):
            return False
        tried.append(unchanged)
        emit(Event("info", {"message": f"transient failure; retrying unchanged in {profile.retry.backoff_s:g}s"}))
        time.sleep(profile.retry.backoff_s)
        return True
    values = _attempt_values(remote, launch, diag, profile, dry) if diag.remedy is not None else None
    change = propose(diag, profile, tried, values)
    if change is None:
        return False
    tried.append(change)
    item.change = change.to_json()
    emit(Event("change", {"attempt": item.attempt, **item.change}))
    return change


def _attempt_values(remote: Remote, launch: Launch, diag: Diagnosis, profile: Profile,
                    dry: DryResolution | None) -> EngineValues:
    """What the engine used in this attempt: its own args dump (in the diagnosed window, else the log's head),
    else the dry resolution of these args, else the profile."""
    dump = diag.engine_args
    if dump is None:
        try:
            head = remote.read(launch.run.log, launch.log_offset, 512 << 10).decode("utf-8", "replace")
        except (DeployError, OSError):
            head = ""   # no log to read: the dry resolution and the profile still say what was asked
        dump = parse_server_args(head, engine_for(profile.engine.kind).args_dump)
    return engine_values(dump, dry, dict(profile.engine.args))


def diagnose_attempt(remote: Remote, launch: Launch, outcome: Outcome, version: str | None, *,
                     kind: str) -> Diagnosis:
    if isinstance(outcome, Unsupervised):  # started again under a new supervisor, once per `up`
        return Diagnosis(signature="supervisor-lost", summary=outcome.describe(), transient=True,
                         evidence=outcome.tail[-5:],
                         hint="something killed the supervisor (the OOM killer? a cleanup job?): see the target's "
                              "kernel log; the engine was stopped so that it runs only under a supervisor")
    if isinstance(outcome, (Hung, TimedOut)):
        stalled = outcome.stalled_s if isinstance(outcome, Hung) else outcome.elapsed
        diag = hang_diagnosis(outcome.tail, stalled)
        return diag if isinstance(outcome, Hung) else dataclasses.replace(diag, summary=outcome.describe())
    if isinstance(outcome, Stuck):  # stopped by us after its fatal line: the log says why, as a crash's would
        return diagnose_run(remote, launch.run, launch.log_offset, _state_traceback(remote, launch.run), None,
                            None, version, kind=kind)
    assert isinstance(outcome, Crashed)
    tb_offset = outcome.traceback_offset
    if tb_offset is None:  # the supervisor writes its final state after its last scan
        tb_offset = _state_traceback(remote, launch.run)
    return diagnose_run(remote, launch.run, launch.log_offset, tb_offset, outcome.exit_code, outcome.signal,
                        version, kind=kind)


def diagnose_state(remote: Remote, run: RunDir, state: dict[str, Any], version: str | None, *,
                   kind: str) -> Diagnosis:
    """The diagnosis of a run's last engine death, from what its supervisor recorded (state.json)."""
    end = state.get("last_crash") or state
    return diagnose_run(remote, run, int(end.get("log_offset") or 0), end.get("traceback_offset"),
                        end.get("exit_code"), end.get("signal"), version, kind=kind)


def diagnose_run(remote: Remote, run: RunDir, offset: int, traceback_offset: int | None, exit_code: int | None,
                 signal: int | None, version: str | None, *, kind: str) -> Diagnosis:
    """Diagnose one engine run's log window; a death by signal with no traceback gets the host's OOM-killer lines."""
    text = attempt_log(remote, run, offset, traceback_offset)
    diag = diagnose(text, engine_version=version, exit_code=exit_code, signal=signal, kind=kind)
    if diag.signature == "killed-by-signal":
        dmesg = remote.run("dmesg 2>/dev/null | tail -n 300", timeout=15, check=False).stdout
        diag = dataclasses.replace(diag, evidence=[*diag.evidence, *oom_killer_lines(dmesg)[-3:]])
    return diag


def _state_traceback(remote: Remote, run: RunDir) -> int | None:
    value = (read_json(remote, run.state) or {}).get("traceback_offset")
    return int(value) if isinstance(value, int) else None


def attempt_log(remote: Remote, run: RunDir, offset: int, traceback_offset: int | None = None) -> str:
    """A bounded window of this attempt's log: its first traceback and its tail, whatever the log's size.

    The supervisor notes where the first traceback starts while the log is written; without that note (an older
    supervisor, a log from elsewhere) the target greps for it.
    """
    size = remote.size(run.log) or 0
    if size - offset <= DIAG_WINDOW + TAIL_WINDOW:
        return remote.read(run.log, offset, DIAG_WINDOW + TAIL_WINDOW).decode("utf-8", "replace")
    start = traceback_offset if traceback_offset is not None and traceback_offset >= offset else \
        _grep_traceback(remote, run, offset)
    parts: list[bytes] = []
    if start is not None:
        parts.append(remote.read(run.log, start, DIAG_WINDOW))
    tail_from = max(offset, size - TAIL_WINDOW, start + DIAG_WINDOW if start is not None else 0)
    parts.append(remote.read(run.log, tail_from, TAIL_WINDOW))
    return b"\n".join(parts).decode("utf-8", "replace")


def _grep_traceback(remote: Remote, run: RunDir, offset: int) -> int | None:
    log = shlex.quote(run.log)
    grep = f"LC_ALL=C grep -a -b -m1 -F {shlex.quote(TRACEBACK)}"
    cmd = f"{grep} {log}" if offset == 0 else f"tail -c +{offset + 1} {log} | {grep}"
    found = remote.run(cmd, timeout=60, check=False).stdout
    head = found.split(":", 1)[0]
    return offset + int(head) if head.isdigit() else None


def _save_fixed(original: Profile, final: Profile, tried: list[Change], dest: Path, report: UpReport) -> None:
    assert original.source is not None
    save_fixed(original.source, original, final, [c.reason for c in tried if c.reason and not c.is_empty()], dest)
    report.saved_fixed = str(dest)


def _finish_ready(remote: Remote, run: RunDir, launch: Launch, profile: Profile, bundle: Bundle,
                  item: AttemptReport, report: UpReport, emit: EventSink) -> None:
    head = remote.read(run.log, launch.log_offset, 512 << 10).decode("utf-8", "replace")
    spec = engine_for(profile.engine.kind)
    resolved = parse_server_args(head, spec.args_dump)
    if resolved is not None:
        secret = spec.secret_flags | profile.secret_arg_keys()
        asked = {k: v for k, v in profile.engine.args.items() if k not in secret}
        drifts = compare(asked, masked(resolved, secret), spec.value_aliases, complete=spec.args_dump_complete)
        item.drift = [d.describe() for d in drifts]
        for line in item.drift:
            emit(Event("drift", {"message": line}))
    write_outcome(remote, run, item.to_json())
    report.status, report.run_dir, report.content_hash, report.drift = "ready", run.path, bundle.content_hash, \
        item.drift


def _outcome_name(outcome: Outcome) -> str:
    return {Ready: "ready", Crashed: "crashed", Hung: "hung", Stuck: "crashed", TimedOut: "timeout",
            PortTaken: "port-taken", Unsupervised: "supervisor-lost"}[type(outcome)]


def _describe(outcome: Outcome) -> str:
    return "ready" if isinstance(outcome, Ready) else outcome.describe()
