"""The profile of the run that last reached ready on a target: what `up` learned (healed flags, renames), read
back from the target's records, secrets masked. Nothing secret is read: the export references secrets by name.
"""

from __future__ import annotations

from deployer.errors import NotFound
from deployer.operate.deployment import Ref, layout_of, opened
from deployer.profile.model import Profile
from deployer.box.records import all_runs

MASK = "***"


def last_ready_profile(ref: Ref) -> tuple[Profile, str]:
    """(profile, run id) of the newest run of `ref` that reached ready; NotFound when none did."""
    assert ref.name
    with opened(ref) as (remote, workdir):
        views, _ = all_runs(remote, layout_of(workdir, ref.name))
    ready = [v for v in views if v.reached_ready]
    if not ready:
        raise NotFound(f"{ref.name}: no run on {ref.spec.label} ever reached ready; nothing to export")
    view = ready[-1]
    data = dict(view.record.get("profile") or {})
    if not data:
        raise NotFound(f"run {view.run.run_id} has no profile record")
    engine = dict(data.get("engine") or {})
    secret_env = {k for k, v in (engine.get("env") or {}).items() if v == MASK}
    secret_args = {k for k, v in (engine.get("args") or {}).items() if v == MASK}
    data.pop("extends", None)
    data["template"] = None
    profile = Profile.model_validate(data)
    profile._secret_env = frozenset(secret_env)
    profile._secret_args = frozenset(secret_args)
    return profile, view.run.run_id
