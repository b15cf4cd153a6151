"""On-call: restart the last good version, roll back to the last version that stayed up (reached ready and did
not crash-loop: box/records.RunView.stayed_up).

Both rebuild the profile of an earlier run from what the target keeps (profile.json, with secrets masked) and the
real secret values (secret_restore: the run's 0600 env file, or `${VAR}` from the local environment), then go
through the same `up` flow: lock, stop, start, watch, heal.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from deployer.errors import NotFound, RecordUnreadable
from deployer.operate.deployment import Ref, layout_of, opened
from deployer.operate.secret_restore import Restorer, read_env_file
from deployer.runner.up import UpOptions, UpReport, up
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.secrets import MASK
from deployer.box.records import RunView, all_runs
from deployer.events import EventSink


def restart(ref: Ref, emit: EventSink, opts: UpOptions) -> UpReport:
    """Graceful stop and start of the last good version (the current one if it ever reached ready)."""
    profile = _profile_from(ref, lambda views, current: _last_good(views, current, skip_hash=None), "restart")
    return up(profile, _forced(opts, "restart"), emit)


def rollback(ref: Ref, emit: EventSink, opts: UpOptions) -> UpReport:
    """Back to the newest version, other than the current one, that stayed up."""
    def pick(views: list[RunView], current: RunView | None) -> RunView:
        skip = current.content_hash if current else None
        return _last_good(views, None, skip_hash=skip)

    profile = _profile_from(ref, pick, "rollback")
    return up(profile, _forced(opts, "rollback"), emit)


def _forced(opts: UpOptions, what: str) -> UpOptions:
    return dataclasses.replace(opts, save_fixed=None, model_config=None, force=True, what=what)


def _last_good(views: list[RunView], current: RunView | None, skip_hash: str | None) -> RunView:
    """The newest run of a version that stayed up (records.RunView.stayed_up): one that crash-looped after ready
    is never gone back to. `current` (restart): that one, refused when it crash-looped."""
    if current is not None:
        if current.crashlooped:
            raise NotFound(f"the current version {current.content_hash[:12]} ({current.run.run_id}) crash-looped "
                           f"after ready ({current.state.get('restarts', 0)} restarts): restarting it brings the "
                           "same crash back",
                           hint="`deploy rollback` goes back to the last version that stayed up, `deploy diagnose` "
                                "says why it crashed; `deploy up PROFILE.yaml` starts it anyway")
        if current.stayed_up:
            return current
    for view in reversed(views):
        if view.stayed_up and view.content_hash != skip_hash:
            return view
    what = "another version" if skip_hash else "a version"
    raise NotFound(f"no run of {what} ever reached ready and stayed up; nothing to go back to")


def _profile_from(ref: Ref, pick: Any, what: str) -> Profile:
    assert ref.name
    with opened(ref) as (remote, workdir):
        views, current_id = all_runs(remote, layout_of(workdir, ref.name))
        current = next((v for v in views if v.run.run_id == current_id), None)
        chosen: RunView = pick(views, current)
        return rebuild_profile(remote, chosen, ref, workdir)


def rebuild_profile(remote: Remote, view: RunView, ref: Ref, workdir: str) -> Profile:
    """The run's profile with its real secret values and the target as given now (host, user, port, workdir)."""
    data = dict(view.record.get("profile") or {})
    if not data:
        raise NotFound(f"run {view.run.run_id} has no profile record")
    templates = dict(view.record.get("secret_templates") or {})
    restorer = Restorer(view.run.run_id, read_env_file(remote, view.run.file("env"), view.run.run_id),
                        templates)
    recorded = dict(data.get("engine") or {})
    data["engine"] = restorer.engine(recorded)
    spec = ref.spec
    target = dict(data.get("target") or {})
    target.update(host=spec.host, workdir=workdir)
    for key in ("user", "port", "identity_file", "known_hosts"):
        if getattr(spec, key) is not None:
            target[key] = getattr(spec, key)
    data["target"] = target
    data.pop("extends", None)
    data["template"] = None
    profile = Profile.model_validate(data)
    # Secret exactly where the run had secrets: the same render, so the same content hash.
    profile._secret_env = frozenset(k for k, v in (recorded.get("env") or {}).items() if v == MASK)
    profile._secret_args = frozenset(k for k, v in (recorded.get("args") or {}).items() if v == MASK)
    profile._templates = templates
    return profile
