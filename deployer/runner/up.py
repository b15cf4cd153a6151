"""Pipeline: `up` = render -> push -> start -> watch -> diagnose -> remedy -> retry, with the attempt history.

Each step lives in its own module; this one holds the target (connection, helper, lock), runs preflight, finds
what already runs, and hands the attempts to the attempt runner (deployer/runner: bounded, no identical change
twice, outcome.json and the local history), the single host being a group of one.

Push first, stop last: the serving version is stopped only once the new run dir is on the target, complete and
verified. If anything fails after that stop (the new version cannot be made to start, the port is taken, the
connection or the disk fails), the version that was serving is started again (unless --no-rollback) and the
report says so. Attempt 1's run dir goes up while preflight runs, when that can pay (runner/early_push.py).
"""

from __future__ import annotations

import posixpath
import shlex
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from deployer.remedy.effective import DryResolution
from deployer.errors import DeployError, TargetError
from deployer.events import EventSink, Info, Warn
from deployer.runner.before_launch import BeforeLaunch
from deployer.runner.early_push import Planned, early_push
from deployer.profile.model import Profile
from deployer.box import session
from deployer.box.push import Layout
from deployer.remedy.propose import Change
from deployer.remote.base import Remote
from deployer.remote.connect import target_spec
from deployer.render.bundle import Bundle, render
from deployer.runner.attempts import AttemptRunner
from deployer.runner.install import prune_unused, with_environment
from deployer.runner.logs import attempt_log, diagnose_attempt, diagnose_run, diagnose_state
from deployer.runner.report import AttemptReport, Reach, UpOptions, UpReport, restart_summary
from deployer.runner.shape import SingleHostShape, HeldHost
from deployer.runner.weights import fetch_weights
from deployer.secrets import masking_sink
from deployer.box.process import check_port
from deployer.box.records import RunView, current_view, healthy
from deployer.box.retention import prune_pushed, tidy
from deployer.box.session import DeploymentPlace

__all__ = ["AttemptReport", "UpOptions", "UpReport", "attempt_log", "diagnose_attempt", "diagnose_run",
           "diagnose_state", "locked_session", "up"]


@contextmanager
def locked_session(profile: Profile, opts: UpOptions, emit: EventSink,
                   connection: Remote | None = None) -> Iterator[tuple[Remote, Layout]]:
    """The profile's deployment in a locked session (box/session.py); `connection` stays open."""
    place = DeploymentPlace(target_spec(profile, opts.trust_new_host), profile.target.workdir, profile.name)
    with session.locked_session(place, opts.what, lambda m: emit(Warn(message=m)), break_lock=opts.break_lock,
                                connection=connection) as held:
        yield held


def up(profile: Profile, opts: UpOptions, emit: EventSink, connection: Remote | None = None) -> UpReport:
    """`connection`: an open connection to the profile's host to use (and leave open), else one of its own."""
    emit = masking_sink(emit)  # events carry engine text: the engine may print a secret (its own args dump)
    with locked_session(profile, opts, emit, connection) as (remote, layout):
        managed = profile.engine.install is not None
        profile = with_environment(remote, profile, emit)  # engine.install: built or reused, launched from it
        report = UpReport(name=profile.name, host=remote.label, status="failed", reach=reach_of(profile),
                          restart=restart_summary(profile.restart))
        original, version = profile, profile.engine.version
        tried: list[Change] = []
        dry: DryResolution | None = None
        up_id = uuid.uuid4().hex[:12]
        view = current_view(remote, layout)
        running = view is not None and view.alive
        own_port = running and view is not None and view.record.get("port") == profile.engine.port
        written = _written(profile, up_id)
        target = HeldHost(remote=remote, layout=layout, serving=view if view is not None and running else None)
        # engine.weights: the launch is pinned to the commit fetched, known only after the fetch (no early push)
        early_plan = _early_plan(written, view, opts) if profile.engine.weights is None else None
        with early_push(remote, layout, early_plan) as early:
            if not opts.skip_preflight:
                profile, version, dry = BeforeLaunch(opts, report, emit, tried).checked(remote, profile,
                                                                                        own_port=own_port)
            else:
                _check_engine_python(remote, profile)  # preflight's facts include this
            profile, _ = fetch_weights([remote], profile, emit)  # engine.weights: before anything is stopped
            bundle = render(profile)
            if target.serving is not None and _already_running(target, profile, bundle, opts, report, emit):
                return report
            if not own_port:  # someone else's port: refused before anything changes
                check_port(remote, layout, profile.engine.port)
            written_hash = written.bundle.content_hash if written is not None else None
            pushed = early.claim(Planned.of(profile, up_id=up_id, written_hash=written_hash, bundle=bundle)) \
                if early is not None else None
        runner = AttemptRunner(SingleHostShape([target]), profile, opts, emit, report, up_id, original, version=version,
                               dry=dry, tried=tried, written_hash=written_hash, pushed=pushed)
        try:
            done = runner.run()
        except DeployError:  # a failed launch too (not Ctrl-C: that leaves at once)
            _tidy(remote, layout, profile, emit, envs=managed)
            raise
        _tidy(remote, layout, profile, emit, envs=managed)
        return done


def reach_of(profile: Profile) -> Reach:
    """How a person reaches this profile's server (UpReport.reach)."""
    t, engine = profile.target, profile.engine
    return Reach(t.host, t.user, t.port, engine.host, engine.port, engine.served_model,
                 bool(engine.args.get("api_key")))


def _already_running(target: HeldHost, profile: Profile, bundle: Bundle, opts: UpOptions, report: UpReport,
                     emit: EventSink) -> bool:
    """The running version is this bundle and healthy: nothing to do (reported). One whose supervisor is gone is
    replaced (False, with a warning)."""
    remote, view = target.remote, target.serving
    assert view is not None
    if view.content_hash != bundle.content_hash or opts.force or \
            not healthy(remote, profile.engine.port, profile.health.path, address=profile.engine.probe_address):
        return False
    if not view.state.get("supervisor_alive"):
        _unsupervised(view, profile, report, emit)
        return False
    emit(Info(message=f"{profile.name} {bundle.short_hash} is already running and healthy"))
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


def _tidy(remote: Remote, layout: Layout, profile: Profile, emit: EventSink, *, envs: bool = False) -> None:
    """Retention after every up: old runs lose their env file (secrets) at once, their dirs beyond keep_runs; with
    `envs` (engine.install) the managed environments no kept run uses; the pushed model directories no kept run of
    the workdir loads (box/retention.py)."""
    try:
        tidy(remote, layout, profile.retention.keep_runs)
        if envs:
            prune_unused(remote, posixpath.dirname(layout.root))
        said = prune_pushed(remote, posixpath.dirname(layout.root)).describe()
        if said:
            emit(Info(message=f"{said} on {remote.label}"))
    except DeployError as exc:  # never hides the outcome of the up itself
        emit(Warn(message=f"retention of old runs skipped: {exc}"))


def _unsupervised(view: RunView, profile: Profile, report: UpReport, emit: EventSink) -> None:
    """A healthy engine whose supervisor is gone is no longer covered by the restart policy: replace it."""
    message = (f"{profile.name} {view.content_hash[:12]} is healthy but its supervisor (pid "
               f"{view.state.get('supervisor_pid')}) is gone, so the restart policy no longer covers it: "
               f"restarting it under a new supervisor")
    report.warnings.append(message)
    emit(Warn(message=message))


def _check_engine_python(remote: Remote, profile: Profile) -> None:
    py = shlex.quote(profile.engine.python)
    result = remote.run(f"command -v {py} >/dev/null || test -x {py}", timeout=20, check=False)
    if not result.ok:
        raise TargetError(f"engine python {profile.engine.python} not found on {remote.label}",
                          hint="set engine.python to the interpreter that has the engine installed")
