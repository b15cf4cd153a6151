"""Operations on an existing deployment: status, logs, down. They need only a name and a host (or a profile).

Everything is read from the target, so these work from a laptop that never ran the original `up`.
"""

from __future__ import annotations

import posixpath
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.errors import LaunchFailed, NotFound, ProfileError, Unhealthy
from deployer.lock import DeploymentLock, Notify, lock_state
from deployer.logtext import bounded_diagnosis
from deployer.pipeline.up import diagnose_state, target_spec
from deployer.profile.host import parse_host
from deployer.profile.loader import load_profile
from deployer.profile.model import NAME_RE, Profile
from deployer.push import Layout, expand_workdir
from deployer.remote.base import Remote, TargetSpec
from deployer.remote.connect import connect
from deployer.oncall.secret_restore import learn_secrets
from deployer.secrets import mask_data, mask_text
from deployer.start import stop
from deployer.supervisor.supervise_base import CRASHED as CRASHED_STATES
from deployer.supervisor.supervise_base import UP
from deployer.target.records import (RunView, current_view, healthy, list_deployments, list_runs, record_kind,
                                     run_view, tail_lines)
from deployer.watch.watcher import LogTail

DEFAULT_WORKDIR = "/workspace/deployer"

# `deploy status` exits like `systemctl is-active`: 0 only while the deployment serves (README, exit codes).
SERVING = 0
CRASHED = LaunchFailed.exit_code  # 5: exited, crashloop, lost (the engine died and stays down)
NOT_SERVING = Unhealthy.exit_code  # 6: alive but /health fails: starting, restarting, hung, overloaded
STOPPED = 8  # stopped (or stopping) on purpose, by `deploy down`
NO_DEPLOYMENT = NotFound.exit_code  # 7


@dataclass(frozen=True)
class Ref:
    """Which deployment on which host: from a profile file, or from a name plus --host."""

    name: str | None
    spec: TargetSpec
    workdir: str
    profile: Profile | None = None


def make_ref(arg: str | None, host: str | None, workdir: str | None, trust_new_host: bool = False,
             overrides: tuple[str, ...] = ()) -> Ref:
    """NAME|PROFILE (+ --host): a profile file gives everything; a bare name needs --host."""
    if arg and (Path(arg).is_file() or arg.endswith((".yaml", ".yml"))):
        prof = load_profile(arg, overrides=list(overrides), host=host)
        return Ref(prof.name, target_spec(prof, trust_new_host), workdir or prof.target.workdir, prof)
    if not host:
        raise ProfileError("give --host [USER@]HOST[:PORT] (or a profile file instead of a name)")
    if arg is not None and not re.match(NAME_RE, arg):
        raise ProfileError(f"{arg!r} is neither a profile file nor a deployment name")
    try:
        user, hostname, port = parse_host(host)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    return Ref(arg, TargetSpec(host=hostname, user=user, port=port, trust_new_host=trust_new_host),
               workdir or DEFAULT_WORKDIR)


@contextmanager
def opened(ref: Ref) -> Iterator[tuple[Remote, str]]:
    remote = connect(ref.spec)
    try:
        yield remote, expand_workdir(remote, ref.workdir)
    finally:
        remote.close()


def layout_of(workdir: str, name: str) -> Layout:
    return Layout(f"{workdir.rstrip('/')}/{name}")


def describe(view: RunView, remote: Remote, name: str, runs: int) -> dict[str, Any]:
    state, record = view.state, view.record
    learn_secrets(remote, view.run.file("env"), record)  # the diagnosis quotes engine text
    port = int(record.get("port") or 0)
    started = state.get("started_at")
    alive = view.status in UP
    return {
        "name": name, "host": remote.label, "status": view.status, "pid": state.get("pid"),
        "uptime_s": round(time.time() - started, 1) if started and alive else None,
        "healthy": healthy(remote, port, str(record.get("health_path", "/health"))) if port and alive else False,
        "attempt": record.get("attempt"), "content_hash": view.content_hash, "run_dir": view.run.path,
        "port": port, "restarts": state.get("restarts", 0), "last_crash": state.get("last_crash"),
        "exit_code": state.get("exit_code"), "signal_name": state.get("signal_name"),
        "drift": (view.outcome or {}).get("drift", []), "runs": runs,
        "diagnosis": crash_diagnosis(remote, view) or (view.outcome or {}).get("diagnosis"),
        "lock": lock_state(remote, Layout(posixpath.dirname(posixpath.dirname(view.run.path)))),
    }


def status_exit_code(row: dict[str, Any]) -> int:
    """One deployment's row -> the exit code of `deploy status` (SERVING only when it answers /health)."""
    if row["status"] in ("ready", "running") and row["healthy"]:
        return SERVING
    if row["status"] in UP:
        return NOT_SERVING
    if row["status"] in ("stopped", "stopping"):
        return STOPPED
    return CRASHED


def worst_exit_code(rows: list[dict[str, Any]]) -> int:
    """Several deployments: the most urgent problem wins (crashed, then not serving, then stopped)."""
    if not rows:
        return NO_DEPLOYMENT
    codes = {status_exit_code(row) for row in rows}
    return next((c for c in (CRASHED, NOT_SERVING, STOPPED) if c in codes), SERVING)


def crash_diagnosis(remote: Remote, view: RunView) -> dict[str, Any] | None:
    """For an engine that died after ready (crash loop, or restart policy "no"), or whose restart by the policy
    died before ready: why, from its last run's log."""
    state = view.state
    crash = state.get("last_crash")
    after_ready = state.get("ready_at") or state.get("restarts")  # the policy restarts only a ready engine
    if view.status not in CRASHED_STATES or not crash or not after_ready:
        return None

    version = (view.record.get("profile") or {}).get("engine", {}).get("version")
    diag = diagnose_state(remote, view.run, state, version, kind=record_kind(view.record))
    return bounded_diagnosis({**diag.to_json(), "hint": diag.hint})


def status(ref: Ref) -> list[dict[str, Any]]:
    with opened(ref) as (remote, workdir):
        names = [ref.name] if ref.name else list_deployments(remote, workdir)
        out = []
        for name in names:
            layout = layout_of(workdir, name)
            view = current_view(remote, layout)
            if view is None:
                if ref.name:
                    raise NotFound(f"no deployment {name!r} under {workdir} on {remote.label}")
                continue
            row = describe(view, remote, name, len(list_runs(remote, layout)))
            out.append({**row, "serving": status_exit_code(row) == SERVING})
        return list(mask_data(out))


def down(ref: Ref, grace: float | None = None, *, break_lock: bool = False,
         notify: Notify | None = None) -> dict[str, Any]:
    """Graceful stop of the current run; 'not running' is success."""
    assert ref.name
    with opened(ref) as (remote, workdir):
        layout = layout_of(workdir, ref.name)
        view = current_view(remote, layout)
        if view is None:
            return {"name": ref.name, "host": remote.label, "was_running": False, "status": "absent"}
        wait = grace if grace is not None else (ref.profile.restart.grace_s if ref.profile else 30.0)
        with DeploymentLock(remote, layout, "down", break_lock=break_lock, notify=notify) as lock, \
                lock.reporting_loss():
            final = stop(lock.guarded(), view.run, wait)
        return {"name": ref.name, "host": remote.label, "was_running": bool(final.get("was_running")),
                "status": final.get("status"), "run_dir": view.run.path}


def pick_run(remote: Remote, layout: Layout, previous: bool) -> RunView:
    views = list_runs(remote, layout)
    if not views:
        raise NotFound(f"no runs of {layout.root} on {remote.label}")
    current = current_view(remote, layout)
    run_id = current.run.run_id if current else views[-1]
    if previous:
        older = [r for r in views if r < run_id]
        if not older:
            raise NotFound(f"no run before {run_id}")
        run_id = older[-1]
    return run_view(remote, layout, run_id, live=False)


def logs(ref: Ref, *, lines: int, follow: bool, previous: bool, out: Callable[[str], None],
         follow_for: float | None = None) -> None:
    assert ref.name
    with opened(ref) as (remote, workdir):
        layout = layout_of(workdir, ref.name)
        view = pick_run(remote, layout, previous)
        learn_secrets(remote, view.run.file("env"), view.record)
        if previous:  # an older run's env file may be pruned; the secrets are usually the current run's too
            now = current_view(remote, layout)
            if now is not None:
                learn_secrets(remote, now.run.file("env"), now.record)
        size = remote.size(view.run.log) or 0
        for line in tail_lines(remote, view.run.log, lines):
            out(mask_text(line))
        if follow:
            _follow(remote, view, size, lambda line: out(mask_text(line)), follow_for)


def _follow(remote: Remote, view: RunView, offset: int, out: Callable[[str], None], limit_s: float | None) -> None:
    tail = LogTail(remote, view.run.log, offset)
    deadline = time.monotonic() + limit_s if limit_s else None
    while deadline is None or time.monotonic() < deadline:
        for line in tail.poll():
            out(line)
        time.sleep(0.5)
