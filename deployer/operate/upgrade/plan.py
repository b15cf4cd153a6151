"""`deploy upgrade` without `--apply`: preflight of the profile on the release the target runs and on the new one,
over one connection, and what changes between them (`compare`). Nothing stops; the new release's managed
environment (when the profile has one, or names no python of the release) is built beside the old one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.engines.renames import load_renames
from deployer.events import EventSink
from deployer.local.history import home
from deployer.operate.upgrade.compare import Comparison, Side, compare, memory_rows
from deployer.operate.upgrade.release import Release, for_release
from deployer.preflight.checks import PreflightReport, run_preflight
from deployer.preflight.flags import load_cached_flagset
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.remote.connect import conversing, target_spec
from deployer.runner.install import launched_from, plan_environment, prepared_environment


@dataclass(frozen=True)
class UpgradeOptions:
    """What `deploy upgrade` was asked: the release, the new release's python on the target (else a managed
    environment), a local model folder for the memory plans."""

    release: Release
    python: str | None = None
    model_config: Path | None = None
    cache_dir: Path = field(default_factory=lambda: home() / "cache")


@dataclass
class UpgradePlan:
    """The comparison, the profile the new release runs (its python, the upgraded args and env), and each side's
    preflight report."""

    name: str
    comparison: Comparison
    profile: Profile
    old: PreflightReport
    new: PreflightReport

    @property
    def ok(self) -> bool:
        return not self.comparison.refused and not self.new.problems

    def text(self) -> str:
        c = self.comparison
        lines = [f"upgrade of {self.name}: {c.kind} {c.old.version or '?'} -> {c.new.version}"]
        for title, kinds in (("flags", ("renamed", "removed", "respelt", "refused")),
                             ("environment", ("env renamed", "env retired")),
                             ("values the engine resolves differently", ("resolves",)),
                             ("follow-on checks", ("check",))):
            found = [ch for ch in c.changes if ch.what in kinds]
            lines.append(f"{title}: {'none' if not found else ''}".rstrip())
            lines += [f"  - {ch.line()}" for ch in found]
        lines.append(f"dry resolution: {c.old.version}: {c.old.resolution}; {c.new.version}: {c.new.resolution}")
        rows = memory_rows(c.old, c.new)
        if rows:
            width = max(len(r[0]) for r in rows)
            lines.append(f"memory plan (one GPU): {c.old.version} | {c.new.version}")
            lines += [f"  {name.ljust(width)}  {before} | {after}" for name, before, after in rows]
        lines += [f"problem on {c.new.version}: {p}" for p in self.new.problems]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        c = self.comparison
        return {"name": self.name, "engine": c.kind, "from": c.old.version, "to": c.new.version, "ok": self.ok,
                "changes": [ch.to_json() for ch in c.changes],
                "resolution": {"from": c.old.resolution, "to": c.new.resolution},
                "memory": [{"row": n, "from": a, "to": b} for n, a, b in memory_rows(c.old, c.new)],
                "problems": list(self.new.problems),
                "engine_args": self.profile.public_dict()["engine"]["args"],
                "engine_env": self.profile.public_dict()["engine"]["env"]}


def plan_upgrade(remote: Remote, profile: Profile, opts: UpgradeOptions, emit: EventSink) -> UpgradePlan:
    """Both releases' preflight and the comparison; the new release's environment built when it is a managed one."""
    old_profile, _ = plan_environment(remote, profile)
    old = run_preflight(remote, old_profile, cache_dir=opts.cache_dir, model_config=opts.model_config,
                        own_port=True)
    runs_new = for_release(profile, opts.release, opts.python)
    prepared = prepared_environment(remote, runs_new, emit)
    if prepared is not None:
        runs_new = launched_from(runs_new, prepared.python)
    new = run_preflight(remote, runs_new, cache_dir=opts.cache_dir, model_config=opts.model_config, own_port=True)
    result = _compared(profile, old, new, opts)
    if result.args != new.profile.engine.args or result.env != new.profile.engine.env:
        upgraded = with_changes(runs_new, result)   # a follow-on check's fix: resolved again with it
        new = run_preflight(remote, upgraded, cache_dir=opts.cache_dir, model_config=opts.model_config,
                            own_port=True)
        result = _compared(profile, old, new, opts)
    return UpgradePlan(profile.name, result, with_changes(runs_new, result), old, new)


def _compared(profile: Profile, old: PreflightReport, new: PreflightReport, opts: UpgradeOptions) -> Comparison:
    knowledge = profile.engine.definition.knowledge
    renames = load_renames(knowledge)
    return compare(profile.engine.kind, _side(old, opts, profile.engine.args),
                   _side(new, opts, dict(new.profile.engine.args), version=opts.release.version),
                   dict(profile.engine.env), renames, knowledge, profile.secret_env_keys())


def _side(report: PreflightReport, opts: UpgradeOptions, args: dict[str, Any], version: str | None = None) -> Side:
    engine = report.profile.engine.kind
    found = report.facts.engine_version
    flags = load_cached_flagset(opts.cache_dir, engine, found) if found else None
    memory = tuple((str(k), str(v)) for k, v in report.memory.rows()) if report.memory is not None else ()
    return Side(version=version or found, flags=flags, args=dict(args), resolution=report.resolution,
                resolved=report.resolved, changes=tuple(report.resolution_changes), memory=memory,
                problems=tuple(report.problems))


def with_changes(runs_new: Profile, result: Comparison) -> Profile:
    """`runs_new` (a profile on the new release) with the comparison's args and env, its flags renamed."""
    renamed = {c.name: str(c.after) for c in result.changes if c.what in ("renamed", "respelt")}
    engine = runs_new.engine.model_copy(update={"args": dict(result.args), "env": dict(result.env)})
    return runs_new.with_engine(engine, renamed)


def upgrade_plan(profile: Profile, opts: UpgradeOptions, trust_new_host: bool, emit: EventSink) -> UpgradePlan:
    """`plan_upgrade` over a new connection to the profile's host."""
    with conversing(target_spec(profile, trust_new_host)) as remote:
        return plan_upgrade(remote, profile, opts, emit)
