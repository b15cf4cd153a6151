"""Push: the deployment's directory layout on the target and the atomic upload of one attempt's run dir.

    <workdir>/<name>/lock, supervise.py, current -> runs/<id>
    <workdir>/<name>/runs/<id>/launch.sh (0700), env (0600), profile.json, supervise.py, supervise.json,
                               state.json, engine.log, outcome.json
Every file goes over SFTP to a temporary name and is renamed into place after its hash is checked.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.engines import engine_for
from deployer.errors import CommandFailed, TargetError
from deployer.profile import Profile
from deployer.remote import Remote
from deployer.render import Bundle

# The supervisor program: run as `python3 supervise.py`, it imports the other two from beside it;
# supervise_lease.py (the deployment lock) is a program of its own.
SUPERVISOR_FILES = ("supervise.py", "supervise_base.py", "supervise_daemon.py", "supervise_lease.py")


def _put_supervisor(remote: Remote, folder: str) -> None:
    for name in SUPERVISOR_FILES:
        remote.put(Path(__file__).with_name(name).read_bytes(), posixpath.join(folder, name), 0o644)


@dataclass(frozen=True)
class RunDir:
    """One attempt's directory on the target."""

    path: str
    run_id: str

    def file(self, name: str) -> str:
        return posixpath.join(self.path, name)

    @property
    def log(self) -> str:
        return self.file("engine.log")

    @property
    def state(self) -> str:
        return self.file("state.json")


@dataclass(frozen=True)
class Layout:
    """The deployment's directory on the target."""

    root: str

    @property
    def lock(self) -> str:
        return posixpath.join(self.root, "lock")

    @property
    def lease_program(self) -> str:
        return posixpath.join(self.root, "supervise_lease.py")

    @property
    def lock_events(self) -> str:
        return self.lock + "-events.jsonl"

    @property
    def current(self) -> str:
        return posixpath.join(self.root, "current")

    @property
    def runs(self) -> str:
        return posixpath.join(self.root, "runs")

    @property
    def supervisor(self) -> str:
        return posixpath.join(self.root, "supervise.py")

    def run(self, run_id: str) -> RunDir:
        return RunDir(posixpath.join(self.runs, run_id), run_id)


def expand_workdir(remote: Remote, workdir: str) -> str:
    """`~` in the workdir means the target user's home; SFTP and quoted shell words need it spelt out."""
    if not workdir.startswith("~"):
        return workdir
    home = remote.run('printf %s "$HOME"', timeout=15).stdout.strip()
    return home + workdir[1:]


def layout_for(remote: Remote, profile: Profile) -> Layout:
    return Layout(posixpath.join(expand_workdir(remote, profile.target.workdir), profile.name))


def prepare(remote: Remote, layout: Layout) -> None:
    """Create the deployment dir and install the supervisor there (needed for the lock before any run)."""
    try:
        remote.run(f"mkdir -p -m 0700 {shlex.quote(layout.runs)}", timeout=20)
    except CommandFailed as exc:
        raise TargetError(f"cannot create {layout.runs} on {remote.label}: {' '.join(exc.tail) or 'failed'}",
                          hint="check target.workdir and its permissions") from None
    _put_supervisor(remote, layout.root)


def new_run_id(bundle: Bundle, attempt: int) -> str:
    now = time.time()  # microseconds keep ids of attempts made within one second in order
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    return f"{stamp}-{bundle.content_hash[:8]}-a{attempt}"


def supervisor_config(profile: Profile) -> dict[str, Any]:
    restart = profile.restart
    return {
        "launch": "launch.sh", "env_file": "env", "log": "engine.log", "grace_s": restart.grace_s,
        "ready_pattern": engine_for(profile.engine.kind).ready_line,
        "restart": {"policy": restart.policy, "max": restart.max, "backoff_s": list(restart.backoff_s),
                    "window_s": restart.window_s},
    }


def profile_record(profile: Profile, bundle: Bundle, *, attempt: int, up_id: str) -> dict[str, Any]:
    """What the target keeps about this attempt (secrets masked): enough for status/history from any laptop."""
    return {"name": profile.name, "content_hash": bundle.content_hash, "attempt": attempt, "up_id": up_id,
            "argv": bundle.argv, "env": bundle.masked_env, "port": profile.engine.port,
            "health_path": profile.health.path, "kind": profile.engine.kind, "profile": profile.public_dict(),
            "pushed_at": time.time()}


def push(remote: Remote, layout: Layout, bundle: Bundle, record: dict[str, Any], config: dict[str, Any],
         run_id: str) -> RunDir:
    run = layout.run(run_id)
    remote.run(f"mkdir -m 0700 {shlex.quote(run.path)}", timeout=20)
    remote.put(bundle.env.encode(), run.file("env"), 0o600)
    remote.put(bundle.script.encode(), run.file("launch.sh"), 0o700)
    remote.put(json.dumps(record, indent=1).encode(), run.file("profile.json"), 0o644)
    remote.put(json.dumps(config, indent=1).encode(), run.file("supervise.json"), 0o644)
    _put_supervisor(remote, run.path)
    return run


def set_current(remote: Remote, layout: Layout, run: RunDir) -> None:
    """Point `current` at the run atomically (symlink to a temp name, then rename over)."""
    tmp = layout.current + ".tmp"
    target = posixpath.join("runs", run.run_id)
    remote.run(f"ln -sfn {shlex.quote(target)} {shlex.quote(tmp)} && mv -T -f {shlex.quote(tmp)} "
               f"{shlex.quote(layout.current)}", timeout=20)


def write_outcome(remote: Remote, run: RunDir, outcome: dict[str, Any]) -> None:
    remote.put(json.dumps(outcome, indent=1, default=str).encode(), run.file("outcome.json"), 0o644)
