"""On-call: restart the last good version, roll back to the last version that reached ready.

Both rebuild the profile of an earlier run from what the target keeps (profile.json, with secrets masked, plus
the run's 0600 env file for the real values), then go through the same `up` flow: lock, stop, start, watch, heal.
"""

from __future__ import annotations

from typing import Any

from deployer.errors import NotFound, RecordUnreadable
from deployer.oncall.deployment import Ref, layout_of, opened
from deployer.pipeline.up import UpOptions, UpReport, up
from deployer.profile.model import MASK, Profile
from deployer.remote.base import Remote
from deployer.render.bundle import secret_var
from deployer.supervisor.supervise_base import SuperviseError, parse_env_text
from deployer.target.records import RunView, all_runs
from deployer.watch.watcher import EventSink


def restart(ref: Ref, emit: EventSink, opts: UpOptions) -> UpReport:
    """Graceful stop and start of the last good version (the current one if it ever reached ready)."""
    profile = _profile_from(ref, lambda views, current: _last_good(views, current, skip_hash=None), "restart")
    return up(profile, _forced(opts, "restart"), emit)


def rollback(ref: Ref, emit: EventSink, opts: UpOptions) -> UpReport:
    """Back to the newest version, other than the current one, that reached ready."""
    def pick(views: list[RunView], current: RunView | None) -> RunView:
        skip = current.content_hash if current else None
        return _last_good(views, None, skip_hash=skip)

    profile = _profile_from(ref, pick, "rollback")
    return up(profile, _forced(opts, "rollback"), emit)


def _forced(opts: UpOptions, what: str) -> UpOptions:
    return UpOptions(trust_new_host=opts.trust_new_host, heal=opts.heal, skip_preflight=opts.skip_preflight,
                     save_fixed=None, force=True, what=what, rollback=opts.rollback, break_lock=opts.break_lock)


def _last_good(views: list[RunView], current: RunView | None, skip_hash: str | None) -> RunView:
    if current is not None and current.reached_ready:
        return current
    for view in reversed(views):
        if view.reached_ready and view.content_hash != skip_hash:
            return view
    what = "another version" if skip_hash else "a version"
    raise NotFound(f"no run of {what} ever reached ready; nothing to go back to")


def _profile_from(ref: Ref, pick: Any, what: str) -> Profile:
    assert ref.name
    with opened(ref) as (remote, workdir):
        views, current_id = all_runs(remote, layout_of(workdir, ref.name))
        current = next((v for v in views if v.run.run_id == current_id), None)
        chosen: RunView = pick(views, current)
        return rebuild_profile(remote, chosen, ref, workdir)


def _env_of(remote: Remote, view: RunView) -> dict[str, str]:
    """The run's env file (the real secret values); one clear line when it is missing or damaged."""
    env_path = view.run.file("env")
    try:
        text = remote.read(env_path, 0, 1 << 20).decode("utf-8", "replace")
    except NotFound as exc:
        raise NotFound(f"run {view.run.run_id}: its env file is missing ({exc}); cannot restore its environment") \
            from None
    try:
        return parse_env_text(text, env_path)
    except SuperviseError as exc:
        raise RecordUnreadable(f"run {view.run.run_id}: {exc}") from None


def rebuild_profile(remote: Remote, view: RunView, ref: Ref, workdir: str) -> Profile:
    """The run's profile with its real env values and the target as given now (host, user, port, workdir)."""
    data = dict(view.record.get("profile") or {})
    if not data:
        raise NotFound(f"run {view.run.run_id} has no profile record")
    env_file = _env_of(remote, view)
    engine = dict(data.get("engine") or {})
    masked = {k for k, v in (engine.get("env") or {}).items() if v == MASK}
    engine["env"] = {k: (env_file.get(k, v) if v == MASK else v) for k, v in (engine.get("env") or {}).items()}
    hidden = {k for k, v in (engine.get("args") or {}).items() if v == MASK}
    engine["args"] = {k: (env_file.get(secret_var(k), v) if k in hidden else v)
                      for k, v in (engine.get("args") or {}).items()}
    data["engine"] = engine
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
    profile._secret_env = frozenset(masked)
    profile._secret_args = frozenset(hidden)
    return profile
