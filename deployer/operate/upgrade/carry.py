"""The same upgrade carried to another profile of the same engine: a fleet's upgrade is planned on its first
replica (every replica runs the same engine) and its changes (flags renamed or dropped, env, engine.version and
where its python comes from) are applied to the fleet profile itself, whose replicas, router and rollout stay
as written. Pure."""

from __future__ import annotations

import dataclasses

from deployer.operate.upgrade.plan import UpgradePlan, with_changes
from deployer.operate.upgrade.release import Release, for_release
from deployer.profile.model import Profile


def carried(plan: UpgradePlan, profile: Profile, python: str | None) -> UpgradePlan:
    """`plan` with `profile` (planned through another profile of it) as the profile the new release runs: the
    release's python when given, else its managed environment (engine.install, built on each host as it starts)."""
    release = Release(plan.comparison.kind, str(plan.comparison.new.version))
    upgraded = with_changes(for_release(profile, release, python), plan.comparison)
    return dataclasses.replace(plan, name=profile.name, profile=upgraded)
