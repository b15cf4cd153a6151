"""Pipeline: `up` = render -> push -> start -> watch -> diagnose -> remedy -> retry, with the attempt history.

Each step lives in its own module; this one composes them, keeps the attempts bounded, makes no identical change
twice, and writes what happened to the target (outcome.json) and to the local history.
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
from typing import Any

from deployer.diagnose import Diagnosis, diagnose, hang_diagnosis, oom_killer_lines
from deployer.drift import compare, parse_server_args
from deployer.engines import engine_for
from deployer.prelaunch import checked_profile
from deployer.errors import LaunchFailed, RetriesExhausted, TargetError
from deployer.profile import Profile
from deployer.push import Layout, RunDir, layout_for, new_run_id, prepare, profile_record, push, set_current
from deployer.push import supervisor_config, write_outcome
from deployer.remedy import Change, propose
from deployer.remote import Remote, TargetSpec, connect
from deployer.render import Bundle, render
from deployer.lock import DeploymentLock
from deployer.start import Launch, check_port, start, stop
from deployer.state import History
from deployer.targetview import current_view, healthy
from deployer.watch import Crashed, Event, EventSink, Hung, Outcome, Ready, TimedOut, Watcher

DIAG_WINDOW = 1 << 20
TAIL_WINDOW = 512 << 10
TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class UpOptions:
    trust_new_host: bool = False
    heal: bool = True
    skip_preflight: bool = False
    save_fixed: Path | None = None
    model_config: Path | None = None
    force: bool = False
    what: str = "up"
    break_lock: bool = False


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

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def target_spec(profile: Profile, trust_new_host: bool = False) -> TargetSpec:
    t = profile.target
    return TargetSpec(host=t.host, user=t.user, port=t.port, identity_file=t.identity_file,
                      known_hosts=t.known_hosts, trust_new_host=trust_new_host)


@contextmanager
def locked_session(profile: Profile, opts: UpOptions, emit: EventSink) -> Iterator[tuple[Remote, Layout]]:
    """Connect once, create the deployment dir, hold the deployment lock; release everything on exit.

    The remote handed out acts only while the lock is held: once it is lost, every call raises LockLost."""
    remote = connect(target_spec(profile, opts.trust_new_host))
    try:
        layout = layout_for(remote, profile)
        prepare(remote, layout)
        with DeploymentLock(remote, layout, opts.what, break_lock=opts.break_lock,
                            notify=lambda m: emit(Event("warning", {"message": m}))) as lock:
            with lock.reporting_loss():
                yield lock.guarded(), layout
    finally:
        remote.close()


def up(profile: Profile, opts: UpOptions, emit: EventSink) -> UpReport:
    with locked_session(profile, opts, emit) as (remote, layout):
        report = UpReport(name=profile.name, host=remote.label, status="failed")
        original, version = profile, profile.engine.version
        tried: list[Change] = []
        view = current_view(remote, layout)
        running = view is not None and view.alive
        if not opts.skip_preflight:
            own_port = running and view is not None and view.record.get("port") == profile.engine.port
            profile, version = checked_profile(remote, profile, heal=opts.heal, model_config=opts.model_config,
                                               own_port=own_port, tried=tried, emit=emit,
                                               notes=report.before_launch, warnings=report.warnings)
        else:
            _check_engine_python(remote, profile)  # preflight's facts include this
        bundle = render(profile)
        if view and running and view.content_hash == bundle.content_hash and not opts.force and \
                healthy(remote, profile.engine.port, profile.health.path):
            emit(Event("info", {"message": f"{profile.name} {bundle.short_hash} is already running and healthy"}))
            report.status, report.run_dir, report.content_hash = "already-running", view.run.path, bundle.content_hash
            return report
        waited = 0.0
        if view and running:
            emit(Event("info", {"message": f"stopping the running version {view.content_hash[:12]} "
                                           f"({view.run.run_id}) to replace it"}))
            stop(remote, view.run, profile.restart.grace_s)
            report.replaced, waited = view.run.run_id, 15.0
        return _attempts(remote, layout, profile, opts, report, emit, version, port_wait=waited, tried=tried,
                         original=original)


def _check_engine_python(remote: Remote, profile: Profile) -> None:
    py = shlex.quote(profile.engine.python)
    result = remote.run(f"command -v {py} >/dev/null || test -x {py}", timeout=20, check=False)
    if not result.ok:
        raise TargetError(f"engine python {profile.engine.python} not found on {remote.label}",
                          hint="set engine.python to the interpreter that has the engine installed")


def _attempts(remote: Remote, layout: Layout, profile: Profile, opts: UpOptions, report: UpReport,
              emit: EventSink, version: str | None, port_wait: float, tried: list[Change],
              original: Profile) -> UpReport:
    history = History()
    up_id = uuid.uuid4().hex[:12]
    try:
        for attempt in range(1, profile.retry.max_attempts + 1):
            bundle = render(profile)
            emit(Event("attempt", {"attempt": attempt, "content_hash": bundle.content_hash}))
            check_port(remote, layout, profile.engine.port, wait_s=port_wait)
            run = push(remote, layout, bundle, profile_record(profile, bundle, attempt=attempt, up_id=up_id),
                       supervisor_config(profile), new_run_id(bundle, attempt))
            set_current(remote, layout, run)
            emit(Event("pushed", {"run_id": run.run_id, "run_dir": run.path}))
            row = history.begin_attempt(deployment=profile.name, host=remote.label, up_id=up_id, attempt=attempt,
                                        run_id=run.run_id, content_hash=bundle.content_hash,
                                        profile=profile.public_dict())
            launch = start(remote, run)
            outcome = Watcher(remote, launch, profile.engine.port, profile.health,
                              engine_for(profile.engine.kind), emit).run()
            item = AttemptReport(attempt, run.run_id, bundle.content_hash, _outcome_name(outcome),
                                 _describe(outcome))
            report.attempts.append(item)
            if isinstance(outcome, Ready):
                _finish_ready(remote, run, launch, profile, bundle, item, report, emit)
                if opts.save_fixed is not None and original.source is not None:
                    _save_fixed(original, profile, tried, opts.save_fixed, report)
                history.end_attempt(row, outcome="ready", diagnosis=None, change=None)
                return report
            change = _after_failure(remote, run, launch, outcome, profile, opts, item, tried, version, emit)
            history.end_attempt(row, outcome=item.outcome, diagnosis=item.diagnosis, change=item.change)
            write_outcome(remote, run, item.to_json())
            if change is False:
                why = "healing disabled (--no-heal)" if not opts.heal else \
                    "the known changes are used up" if (item.diagnosis or {}).get("remedy") else \
                    "no known change fixes it"
                summary = (item.diagnosis or {}).get("summary", "unknown failure")
                raise LaunchFailed(f"{profile.name}: {item.detail}: {summary} ({why})", outcome=report)
            if isinstance(change, Change):
                profile = profile.patched(args=change.args, env=change.env)
            port_wait = 5.0
        exhausted = RetriesExhausted(f"{profile.name}: not ready after {profile.retry.max_attempts} attempts; "
                                     f"last: {report.attempts[-1].detail}", attempts=report.attempts)
        exhausted.outcome = report
        raise exhausted
    finally:
        history.close()


def _after_failure(remote: Remote, run: RunDir, launch: Launch, outcome: Outcome, profile: Profile,
                   opts: UpOptions, item: AttemptReport, tried: list[Change], version: str | None,
                   emit: EventSink) -> Change | bool:
    """Diagnose a failed attempt: the change to make, True to retry unchanged (transient), False to stop."""
    if isinstance(outcome, (Hung, TimedOut)):
        stop(remote, run, min(profile.restart.grace_s, 10.0))
    diag = diagnose_attempt(remote, launch, outcome, version)
    item.diagnosis = {**diag.to_json(), "hint": diag.hint}
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
    change = propose(diag, profile, tried)
    if change is None:
        return False
    tried.append(change)
    item.change = change.to_json()
    emit(Event("change", {"attempt": item.attempt, **item.change}))
    return change


def diagnose_attempt(remote: Remote, launch: Launch, outcome: Outcome, version: str | None) -> Diagnosis:
    if isinstance(outcome, (Hung, TimedOut)):
        stalled = outcome.stalled_s if isinstance(outcome, Hung) else outcome.elapsed
        diag = hang_diagnosis(outcome.tail, stalled)
        return diag if isinstance(outcome, Hung) else dataclasses.replace(diag, summary=outcome.describe())
    assert isinstance(outcome, Crashed)
    tb_offset = outcome.traceback_offset
    if tb_offset is None:  # the supervisor writes its final state after its last scan
        tb_offset = _state_traceback(remote, launch.run)
    return diagnose_run(remote, launch.run, launch.log_offset, tb_offset, outcome.exit_code, outcome.signal,
                        version)


def diagnose_state(remote: Remote, run: RunDir, state: dict[str, Any], version: str | None) -> Diagnosis:
    """The diagnosis of a run's last engine death, from what its supervisor recorded (state.json)."""
    end = state.get("last_crash") or state
    return diagnose_run(remote, run, int(end.get("log_offset") or 0), end.get("traceback_offset"),
                        end.get("exit_code"), end.get("signal"), version)


def diagnose_run(remote: Remote, run: RunDir, offset: int, traceback_offset: int | None, exit_code: int | None,
                 signal: int | None, version: str | None) -> Diagnosis:
    """Diagnose one engine run's log window; a death by signal with no traceback gets the host's OOM-killer lines."""
    text = attempt_log(remote, run, offset, traceback_offset)
    diag = diagnose(text, engine_version=version, exit_code=exit_code, signal=signal)
    if diag.signature == "killed-by-signal":
        dmesg = remote.run("dmesg 2>/dev/null | tail -n 300", timeout=15, check=False).stdout
        diag = dataclasses.replace(diag, evidence=[*diag.evidence, *oom_killer_lines(dmesg)[-3:]])
    return diag


def _state_traceback(remote: Remote, run: RunDir) -> int | None:
    from deployer.targetview import read_json

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
    from deployer.fixed import save_fixed

    assert original.source is not None
    save_fixed(original.source, original, final, [c.reason for c in tried if c.reason and not c.is_empty()], dest)
    report.saved_fixed = str(dest)


def _finish_ready(remote: Remote, run: RunDir, launch: Launch, profile: Profile, bundle: Bundle,
                  item: AttemptReport, report: UpReport, emit: EventSink) -> None:
    head = remote.read(run.log, launch.log_offset, 512 << 10).decode("utf-8", "replace")
    resolved = parse_server_args(head)
    if resolved is not None:
        aliases = engine_for(profile.engine.kind).value_aliases
        item.drift = [d.describe() for d in compare(dict(profile.engine.args), resolved, aliases)]
        for line in item.drift:
            emit(Event("drift", {"message": line}))
    write_outcome(remote, run, item.to_json())
    report.status, report.run_dir, report.content_hash, report.drift = "ready", run.path, bundle.content_hash, \
        item.drift


def _outcome_name(outcome: Outcome) -> str:
    return {Ready: "ready", Crashed: "crashed", Hung: "hung", TimedOut: "timeout"}[type(outcome)]


def _describe(outcome: Outcome) -> str:
    return "ready" if isinstance(outcome, Ready) else outcome.describe()
