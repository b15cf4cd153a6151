"""Operations on an existing deployment: status, logs, down. They need only a name and a host (or a profile).

Everything is read from the target, so these work from a laptop that never ran the original `up`.

The profile model, the diagnosis and the pipeline are imported where they are needed (a profile file, a crashed
run), not at the top: `deploy status NAME` is what on-call runs most, and those imports were most of its start-up.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.engines import Engine
from deployer.errors import LaunchFailed, NotFound, ProfileError, TargetError, Unhealthy, UnsafeTarget
from deployer.box.lock import DeploymentLock, Notify, lease_of
from deployer.logtext import bounded_diagnosis, line_time
from deployer.host import NAME_RE, parse_host
from deployer.box.push import Layout, expand_workdir
from deployer.remote.base import Remote
from deployer.host import TargetSpec
from deployer.remote.connect import conversing, target_spec
from deployer.local import remembered
from deployer.operate import serving
from deployer.operate.rows import DownResult, StatusRow
from deployer.operate.secret_restore import learn_env_text
from deployer.secrets import mask_data, mask_text
from deployer.box.process import Listener, drain_of, forget_boot, listener, rescue, stop
from deployer.supervisor.base import CRASHED as CRASHED_STATES
from deployer.supervisor.base import UP
from deployer.box import snapshot
from deployer.box.records import RunView, healthy, record_address, record_engine, record_kind

if TYPE_CHECKING:
    from deployer.events import EventSink
    from deployer.diagnose.diagnosis import Diagnosis
    from deployer.profile.model import Profile

DEFAULT_WORKDIR = "/workspace/deployer"

# `deploy status` exits like `systemctl is-active`: 0 only while the deployment serves (README, exit codes).
SERVING = 0
CRASHED = LaunchFailed.exit_code  # 5: exited, crashloop, lost (the engine died and stays down)
NOT_SERVING = Unhealthy.exit_code  # 6: alive but /health fails: starting, restarting, hung, overloaded
STOPPED = 8  # stopped (or stopping) on purpose, by `deploy down`
NO_DEPLOYMENT = NotFound.exit_code  # 7


@dataclass(frozen=True)
class LogOptions:
    """`logs`: how many lines, follow, the previous attempt's log; only the lines that match `grep` (a regular
    expression, matched against the masked text) and that were logged at or after `since` (epoch seconds; a line
    without its own time goes with the line before it)."""

    lines: int = 50
    follow: bool = False
    previous: bool = False
    grep: str | None = None
    since: float | None = None


def log_filter(out: Callable[[str], None], grep: str | None, since: float | None) -> Callable[[str], None]:
    """`out` for only the lines LogOptions' grep and since let through."""
    if grep is None and since is None:
        return out
    pattern = re.compile(grep) if grep is not None else None
    last: list[float | None] = [None]

    def emit(line: str) -> None:
        at = line_time(line)
        if at is not None:
            last[0] = at
        if since is not None and (last[0] is None or last[0] < since):
            return
        if pattern is None or pattern.search(line):
            out(line)

    return emit


@dataclass(frozen=True)
class DownOptions:
    """`down`: the SIGTERM..SIGKILL grace (None: the profile's), break another's lock, where warnings go
    (`notify`: one line; `emit`: the events of a fan-out over several hosts)."""

    grace: float | None = None
    break_lock: bool = False
    notify: Notify | None = None
    emit: EventSink | None = None


@dataclass(frozen=True)
class Ref:
    """Which deployment on which host: from a profile file, or from a name plus --host."""

    name: str | None
    spec: TargetSpec
    workdir: str
    profile: Profile | None = None


def make_ref(arg: str | None, host: str | None, workdir: str | None, trust_new_host: bool = False,
             overrides: tuple[str, ...] = (), *, read_only: bool = False) -> Ref:
    """NAME|PROFILE (+ --host): a profile file gives everything; a bare name needs --host.

    read_only (the on-call commands that change no engine): the engine's `${VAR}`s may be unset here, and where
    the profile points is remembered for `remembered_ref`."""
    if arg and (Path(arg).is_file() or arg.endswith((".yaml", ".yml"))):
        from deployer.profile.loader import READ_ONLY, load_profile

        prof = load_profile(arg, overrides=list(overrides), host=host, allow_unset=READ_ONLY if read_only else False)
        ref = Ref(prof.name, target_spec(prof, trust_new_host), workdir or prof.target.workdir, prof)
        if read_only:
            remembered.remember(arg, overrides, host, prof)
        return ref
    if arg is not None and not re.match(NAME_RE, arg):
        raise ProfileError(f"{arg!r} is neither a profile file nor a deployment name")
    return _name_ref(arg, host, workdir, trust_new_host)


def _name_ref(name: str | None, host: str | None, workdir: str | None, trust_new_host: bool) -> Ref:
    """A bare NAME: host and workdir from the command line, the environment, the local history (deployer.operate.
    known), the config file, the built-in workdir, in that order (deployer.local.settings)."""
    from deployer.local import settings
    from deployer.local.lookup import Located, locate

    given_host = settings.strong_default("host", host, "--host")
    given_workdir = settings.strong_default("workdir", workdir, "--workdir")
    found = Located(None, None)
    if name is not None and (given_host is None or given_workdir is None):
        found = locate(name, given_host.value if given_host else None,
                       given_workdir.value if given_workdir else None, trust_new_host)
    spec = found.spec
    if spec is None:
        host_value = given_host.value if given_host else settings.weak_default("host", settings.load_config()).value
        if not host_value:
            raise ProfileError("give --host [USER@]HOST[:PORT] (or a profile file instead of a name, or a default "
                               "host in the config file: see `deploy config`)")
        spec = _spec_of(host_value, trust_new_host)
    if given_workdir is not None or found.workdir is not None:
        where = given_workdir.value if given_workdir else found.workdir
    else:
        where = settings.weak_default("workdir", settings.load_config()).value
    return Ref(name, spec, where or DEFAULT_WORKDIR)


def _spec_of(host: str, trust_new_host: bool) -> TargetSpec:
    try:
        user, hostname, port = parse_host(host)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    return TargetSpec(host=hostname, user=user, port=port, trust_new_host=trust_new_host)


def remembered_ref(arg: str, host: str | None, workdir: str | None, trust_new_host: bool = False,
                   overrides: tuple[str, ...] = ()) -> Ref | None:
    """The Ref of a single-host profile file that an earlier command loaded and that has not changed since (no
    profile load: the model's imports are most of a status's start-up), else None."""
    pointer = remembered.lookup(arg, overrides, host)
    if pointer is None:
        return None
    return Ref(pointer.name, pointer.spec(trust_new_host), workdir or pointer.workdir)


@contextmanager
def opened(ref: Ref) -> Iterator[tuple[Remote, str]]:
    """`connected`, and the workdir as the target spells it (`~` expanded there)."""
    with connected(ref) as remote:
        yield remote, expand_workdir(remote, ref.workdir)


@contextmanager
def connected(ref: Ref, connection: Remote | None = None) -> Iterator[Remote]:
    """The connection (or `connection`, left open) and its one exec channel, the target-side helper (a snapshot,
    the lock, a stop: all requests to it); the workdir is taken as given (`~` is expanded on the target, no trip)."""
    with conversing(ref.spec, connection) as conv:
        yield conv


def layout_of(workdir: str, name: str) -> Layout:
    return Layout(f"{workdir.rstrip('/')}/{name}")


def describe(view: RunView, remote: Remote, name: str, runs: int, env_text: str | None,
             attempt: snapshot.Attempt | None = None, lock: dict[str, Any] | None = None,
             with_metrics: bool = True) -> dict[str, Any]:
    """One deployment's status row; `metrics` (serving metrics and GPU memory) while it is alive and
    `with_metrics` (None otherwise); `unhealthy` while the supervisor's last one-token probe failed (its /health
    may answer: not healthy)."""
    state, record = view.state, view.record
    learn_env_text(env_text, record, view.run.file("env"))  # the diagnosis quotes engine text
    port = int(record.get("port") or 0)
    started = state.get("started_at")
    alive = view.status in UP
    # restarting (its backoff): the pid and start are the dead engine's, shown as if it ran; an ended run keeps its
    # last pid (it says exited, crashloop, ...)
    engine_up = alive and bool(state.get("alive"))
    supervisor = supervision_note(state, name, remote.label)
    diagnosis = crash_diagnosis(remote, view, attempt) or _as_diagnosis(supervisor)
    engine_metrics = with_metrics and record.get("role") != "router"  # a fleet's router: no engine /metrics
    args = ((record.get("profile") or {}).get("engine") or {}).get("args")
    with ThreadPoolExecutor(max_workers=1) as pool:  # who listens on the port, asked beside /health: one round trip
        owner = pool.submit(listener, remote, view.run, port) if port and alive else None
        looked = serving.look(remote, record_engine(record), _endpoint(view, port), engine_metrics,
                              args if isinstance(args, dict) else None) if port and alive else serving.Looked(False)
    unhealthy = state.get("unhealthy") if alive and isinstance(state.get("unhealthy"), dict) else None
    if looked.healthy and owner is not None:  # /health answered: by this run's engine, or by whoever took its port?
        unhealthy = squatter(owner.result(), port) or unhealthy
    return {
        "name": name, "host": remote.label, "status": view.status, "pid": None if alive and not engine_up else state.get("pid"),
        "uptime_s": round(time.time() - started, 1) if started and engine_up else None, "supervisor": supervisor,
        "healthy": looked.healthy and unhealthy is None, "unhealthy": unhealthy,
        "attempt": record.get("attempt"), "content_hash": view.content_hash, "run_dir": view.run.path,
        "port": port, "restarts": state.get("restarts", 0), "last_crash": last_crash(remote, view, alive, diagnosis),
        "exit_code": state.get("exit_code"), "signal_name": state.get("signal_name"),
        "drift": (view.outcome or {}).get("drift", []), "runs": runs,
        "diagnosis": diagnosis or (view.outcome or {}).get("diagnosis"),
        "lock": lock, "metrics": looked.metrics, **engine_of(record),
        "pulled": state.get("pulled") if alive and isinstance(state.get("pulled"), dict) else None,
    }


def supervision_note(state: Mapping[str, Any], name: str, host: str) -> dict[str, Any] | None:
    """What a dead or frozen supervisor means and the command that fixes it (None while it watches, or for a run
    that ended): {state, supervisor_pid, heartbeat_age_s, summary, next}. From the target's `supervisor` verdict
    (base.supervision); an older payload says nothing of it and is not judged."""
    verdict, sup = state.get("supervisor"), state.get("supervisor_pid")
    if verdict == "dead" and state.get("status") == "lost":
        summary = f"the engine and its supervisor (pid {sup}) are both gone: nothing restarts it"
        fix = f"`deploy up PROFILE` (the profile of {name}) starts it again"
    elif verdict == "dead":
        summary = (f"the engine (pid {state.get('pid')}) runs, but its supervisor (pid {sup}) is gone: nothing "
                   f"restarts the engine if it dies, nothing watches its log or health")
        fix = (f"`deploy up PROFILE` (the profile of {name}) puts it back under a supervisor (the same version, "
               f"the engine restarted)")
    elif verdict == "frozen":
        summary = (f"its supervisor (pid {sup}) lives but has written no heartbeat for "
                   f"{state.get('heartbeat_age_s')}s (stopped or wedged): it restarts and watches nothing")
        fix = (f"on {host}: `kill -CONT {sup}` resumes a stopped one; if it stays frozen, `kill -9 {sup}`, then "
               f"`deploy up PROFILE` (the profile of {name}) puts the engine under a new supervisor")
    else:
        return None
    return {"state": verdict, "supervisor_pid": sup, "heartbeat_age_s": state.get("heartbeat_age_s"),
            "summary": summary, "next": fix}


def _as_diagnosis(supervisor: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A supervisor problem as the diagnosis a row shows (signature, summary, hint: the `next:` line)."""
    if supervisor is None:
        return None
    return {"signature": f"supervisor-{supervisor['state']}", "summary": supervisor["summary"],
            "hint": supervisor["next"]}


def squatter(owner: Listener, port: int) -> dict[str, Any] | None:
    """The `unhealthy` record of a port another process answers on (pid, user as far as /proc tells), else None."""
    if owner.ours is not False:
        return None
    return {"reason": f"port {port} is answered by {owner.describe()}, not by this run's engine",
            "holders": owner.holders}


def engine_of(record: Mapping[str, Any]) -> dict[str, str | None]:
    """The run's engine kind, the version its profile names (None: none named) and the model it serves (its
    --served-model-name, else model_path), from the run's record."""
    profile = record.get("profile")
    engine = profile.get("engine") if isinstance(profile, Mapping) else None
    engine = engine if isinstance(engine, Mapping) else {}
    args = engine.get("args")
    model = (args.get("served_model_name") if isinstance(args, Mapping) else None) or engine.get("model_path")
    if isinstance(model, list):
        model = model[0] if model else None
    version = engine.get("version")
    return {"engine": record_kind(record), "engine_version": None if version is None else str(version),
            "model": None if model is None else str(model)}


def _endpoint(view: RunView, port: int) -> serving.Endpoint:
    record = view.record
    gpus = ((record.get("profile") or {}).get("engine") or {}).get("gpus")
    return serving.Endpoint(port, record_address(record), str(record.get("health_path", "/health")), view.run.path,
                            gpus if isinstance(gpus, list) else None)


def status_code(status: str, healthy: bool) -> int:
    """A deployment's status and health -> the exit code of `deploy status` (SERVING only when it answers
    /health)."""
    if status in ("ready", "running") and healthy:
        return SERVING
    if status in UP or status == "replacing":  # replacing: stopped for an `up` (or its guard) to start another
        return NOT_SERVING
    if status in ("stopped", "stopping"):
        return STOPPED
    return CRASHED


def status_exit_code(row: StatusRow) -> int:
    """One deployment's row -> the exit code of `deploy status`; an engine that serves while its supervisor is
    dead or frozen is NOT_SERVING (6: up, but not as it should be; nothing would restart it), not SERVING."""
    code = status_code(row.status, row.healthy)
    return NOT_SERVING if code == SERVING and row.supervisor is not None else code


def worst_exit_code(rows: list[StatusRow]) -> int:
    """Several deployments: the most urgent problem wins (crashed, then not serving, then stopped)."""
    if not rows:
        return NO_DEPLOYMENT
    codes = {status_exit_code(row) for row in rows}
    return next((c for c in (CRASHED, NOT_SERVING, STOPPED) if c in codes), SERVING)


def crash_diagnosis(remote: Remote, view: RunView, attempt: snapshot.Attempt | None = None) -> dict[str, Any] | None:
    """For an engine that died after ready (crash loop, or restart policy "no"), or whose restart by the policy
    died before ready: why, from its last run's log (the snapshot's `attempt` when it has this run's)."""
    state = view.state
    crash = state.get("last_crash")
    after_ready = state.get("ready_at") or state.get("restarts")  # the policy restarts only a ready engine
    if view.status not in CRASHED_STATES or not crash or not after_ready:
        return None

    from deployer.runner.up import diagnose_state

    version = (view.record.get("profile") or {}).get("engine", {}).get("version")
    engine = record_engine(view.record)
    if attempt is not None and attempt.run_id == view.run.run_id:
        diag = diagnose_attempt(attempt, state, version, engine=engine)
    else:
        diag = diagnose_state(remote, view.run, state, version, engine=engine)
    return bounded_diagnosis({**diag.to_json(), "hint": diag.hint})


def last_crash(remote: Remote, view: RunView, alive: bool, crashed: dict[str, Any] | None) -> dict[str, Any] | None:
    """The supervisor's record of the engine's last crash, with why it crashed (`diagnosis`): `crashed`, the
    diagnosis of a deployment that is down after it, or, for one the policy restarted that runs again, the
    crashed run's own (at 3 a.m. "restarts: 1" alone does not say whether to worry)."""
    crash = view.state.get("last_crash")
    if not isinstance(crash, dict):
        return None
    if crashed is not None:
        return {**crash, "diagnosis": crashed}
    if not alive or not view.state.get("restarts"):
        return dict(crash)

    from deployer.runner.up import diagnose_state

    version = (view.record.get("profile") or {}).get("engine", {}).get("version")
    diag = diagnose_state(remote, view.run, view.state, version, engine=record_engine(view.record))
    return {**crash, "diagnosis": bounded_diagnosis({**diag.to_json(), "hint": diag.hint})}


def diagnose_attempt(attempt: snapshot.Attempt, state: Mapping[str, Any], version: str | None, *,
                     engine: Engine) -> Diagnosis:
    """pipeline.up.diagnose_state on what a snapshot brought: no further trip to the target."""
    from deployer.diagnose.diagnosis import diagnose, no_token_diagnosis, oom_killer_lines
    from deployer.diagnose.hung import hung_diagnosis

    end = state.get("last_crash") or state
    hung = hung_diagnosis(end)  # the hang rule ended it (hang): its progress and stacks
    if hung is not None:
        return hung
    probe = no_token_diagnosis(dict(end))
    if probe is not None:
        return probe
    diag = diagnose(attempt.text, engine_version=version, exit_code=end.get("exit_code"), signal=end.get("signal"),
                    engine=engine)
    if diag.signature == "killed-by-signal":
        diag = dataclasses.replace(diag, evidence=[*diag.evidence, *oom_killer_lines(attempt.dmesg or "")[-3:]])
    return diag


def status(ref: Ref, connection: Remote | None = None, *, with_metrics: bool = True,
           also: Sequence[str] = ()) -> list[StatusRow]:
    """One deployment's row, or (no name) every deployment's under the workdir and the workdirs `also` names (the
    local history's for the host); one exec channel either way. `with_metrics`: each live row's serving metrics
    (deployer.operate.serving), else its `metrics` is None."""
    with connected(ref, connection) as remote:
        if ref.name:
            snap = snapshot.take(remote, layout_of(ref.workdir, ref.name).root)
            snaps = [(ref.name, snap)]
            if snap.current is None:
                raise NotFound(f"no deployment {ref.name!r} under {snap.workdir} on {remote.label}")
        else:
            snaps = [found for workdir in dict.fromkeys([ref.workdir, *also])
                     for found in snapshot.take_workdir(remote, workdir)[1].items()]
        out = []
        for name, snap in snaps:
            view = snap.current_view()
            if view is None:
                continue
            row = describe(view, remote, name, len(snap.runs), snap.env.get(view.run.run_id), snap.attempt,
                           lease_of(remote, snap.layout, snap.lock), with_metrics)
            # serving: what exit 0 means; an unsupervised engine answers (healthy) but is not served as it should be
            out.append({**row, "serving": status_code(row["status"], row["healthy"]) == SERVING and
                        row["supervisor"] is None})
        return [StatusRow.of(row) for row in mask_data(out)]


def down(ref: Ref, grace: float | None = None, *, break_lock: bool = False,
         notify: Notify | None = None) -> DownResult:
    """Graceful stop of the current run; 'not running' is success."""
    assert ref.name
    with connected(ref) as remote:
        snap = snapshot.take(remote, layout_of(ref.workdir, ref.name).root)  # what runs: one exec channel
        layout, view = snap.layout, snap.current_view()
        if view is None:
            return DownResult(ref.name, remote.label, was_running=False, status="absent")
        wait = grace if grace is not None else (ref.profile.restart.grace_s if ref.profile else 30.0)
        try:
            with DeploymentLock(remote, layout, "down", break_lock=break_lock, notify=notify) as lock, \
                    lock.reporting_loss():
                final = stop(lock.guarded(), view.run, wait, drain_s=drain_of(view.record))
                on_boot = forget_boot(lock.guarded(), view.run)  # a reboot must not bring back what was stopped
        except UnsafeTarget as e:  # another user controls its path now: stop what deployer started, read nothing
            raise UnsafeTarget(f"{e.message}; {rescue(remote, layout, wait)} (found by their processes, without "
                               f"the lock; nothing in the directory was read or run)", hint=e.hint) from None
        # an engine that had ended by itself (crashloop, exited, lost) is now stopped as asked: say so
        status = final.get("status")
        stopped_from = final.get("stopped_from")
        return DownResult(ref.name, remote.label, was_running=bool(final.get("was_running") or stopped_from),
                          status=None if status is None else str(status), run_dir=view.run.path,
                          stopped_from=None if stopped_from is None else str(stopped_from), on_boot=on_boot)


def pick_run(snap: snapshot.Snapshot, previous: bool, label: str) -> RunView:
    """The run `logs` shows: the current one (else the newest), or with `previous` the one before it."""
    if not snap.runs:
        raise NotFound(f"no runs of {snap.layout.root} on {label}")
    run_id = snap.current or snap.runs[-1]
    if previous:
        older = [r for r in snap.runs if r < run_id]
        if not older:
            raise NotFound(f"no run before {run_id}")
        run_id = older[-1]
    return snap.view(run_id)


def logs(ref: Ref, *, lines: int, follow: bool, previous: bool, out: Callable[[str], None],
         follow_for: float | None = None, grep: str | None = None, since: float | None = None) -> None:
    """The last `lines` lines of the run's log, masked, from one snapshot; `follow` then reads on over SFTP.
    `grep`, `since`: only the lines LogOptions says (matched after masking)."""
    assert ref.name
    out = log_filter(out, grep, since)
    with connected(ref) as remote:
        snap = snapshot.take(remote, layout_of(ref.workdir, ref.name).root, log_lines=lines, previous=previous)
        view = pick_run(snap, previous, remote.label)
        learn_env_text(snap.env.get(view.run.run_id), view.record, view.run.file("env"))
        now = snap.current_view()
        if previous and now is not None:  # an older run's env file may be pruned; the current's secrets help
            learn_env_text(snap.env.get(now.run.run_id), now.record, now.run.file("env"))
        window = snap.log
        if window is None or window.run_id != view.run.run_id or window.lines is None:
            raise TargetError(f"the target's snapshot of {snap.layout.root} has no log of run {view.run.run_id}")
        size = window.size
        for line in snapshot.shown_lines(window.lines, window.first_partial, window.start):
            out(mask_text(line))
        if follow:
            _follow(remote, view, size, lambda line: out(mask_text(line)), follow_for)


def _follow(remote: Remote, view: RunView, offset: int, out: Callable[[str], None], limit_s: float | None) -> None:
    # imported here: the watcher pulls in the timeline, progress and fatal-line modules, which every other
    # on-call command (status above all) would load for nothing; only `logs --follow` tails
    from deployer.watch.watcher import LogTail

    tail = LogTail(remote, view.run.log, offset)
    deadline = time.monotonic() + limit_s if limit_s else None
    while deadline is None or time.monotonic() < deadline:
        for line in tail.poll():
            out(line)
        time.sleep(0.5)
