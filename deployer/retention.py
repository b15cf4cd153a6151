"""Retention: what the target keeps of a deployment's old runs (their dirs, and the secrets in their env files).

An env file (0600, the run's secret values) stays only where a restart or rollback may need it: the current run,
the newest run that reached ready, and the newest ready run of another version (rollback's target). Every other
run loses its env file as soon as an `up` (restart, rollback) ends. Run dirs beyond the newest `keep` are
deleted whole, except those same runs and any run whose state still looks alive: they are never deleted.
`deploy prune` applies the same plan on demand, with `--keep` and `--dry-run`.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Any

from deployer.push import Layout
from deployer.remote import Remote
from deployer.targetview import LIVE, RunView, all_runs

DEFAULT_KEEP = 10


@dataclass
class RetentionPlan:
    keep: int
    runs: int
    delete: list[str] = field(default_factory=list)          # run ids whose dir goes
    drop_env: list[str] = field(default_factory=list)        # run ids (kept) whose env file goes
    protected: dict[str, str] = field(default_factory=dict)  # run id -> why it is never deleted

    def to_json(self) -> dict[str, Any]:
        return {"keep": self.keep, "runs": self.runs, "delete": self.delete, "drop_env": self.drop_env,
                "protected": self.protected}


def plan_retention(views: list[RunView], current: str | None, keep: int, with_env: set[str]) -> RetentionPlan:
    """Pure: what to delete and which env files to drop, for runs listed oldest first."""
    protected = _protected(views, current)
    for view in views:
        if view.run.run_id not in protected and view.status in LIVE:
            protected[view.run.run_id] = f"its state says {view.status}"
    newest = {v.run.run_id for v in views[-keep:]}
    plan = RetentionPlan(keep=keep, runs=len(views), protected=protected)
    for view in views:
        run_id = view.run.run_id
        if run_id not in newest and run_id not in protected:
            plan.delete.append(run_id)
        elif run_id in with_env and run_id not in protected:
            plan.drop_env.append(run_id)
    return plan


def _protected(views: list[RunView], current: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if current is not None and any(v.run.run_id == current for v in views):
        out[current] = "current"
    ready = [v for v in views if v.reached_ready]
    if ready:
        out.setdefault(ready[-1].run.run_id, "newest run that reached ready")
        current_hash = next((v.content_hash for v in views if v.run.run_id == current), ready[-1].content_hash)
        other = [v for v in ready if v.content_hash != current_hash]
        if other:
            out.setdefault(other[-1].run.run_id, "rollback's target (newest ready run of another version)")
    return out


def runs_with_env(remote: Remote, layout: Layout) -> set[str]:
    """Run ids whose env file still exists."""
    cmd = f"cd {shlex.quote(layout.runs)} 2>/dev/null && ls -1d -- */env 2>/dev/null"
    result = remote.run(cmd, timeout=20, check=False)
    return {line.split("/", 1)[0] for line in result.stdout.split() if line.endswith("/env")}


def retention_plan(remote: Remote, layout: Layout, keep: int) -> RetentionPlan:
    views, current = all_runs(remote, layout)
    return plan_retention(views, current, keep, runs_with_env(remote, layout))


def apply_plan(remote: Remote, layout: Layout, plan: RetentionPlan) -> None:
    """Env files first (the secrets), then whole run dirs; one remote command."""
    paths = [posixpath.join(layout.runs, r, "env") for r in plan.drop_env]
    dirs = [posixpath.join(layout.runs, r) for r in plan.delete]
    if not paths and not dirs:
        return
    words = " ".join(shlex.quote(p) for p in paths)
    script = (f"rm -f -- {words}\n" if paths else "") + \
        "".join(f"rm -f -- {shlex.quote(d + '/env')} && rm -rf -- {shlex.quote(d)}\n" for d in dirs)
    remote.run("bash -s", stdin=script.encode(), timeout=120)


def tidy(remote: Remote, layout: Layout, keep: int) -> RetentionPlan:
    """Apply the retention now (called at the end of every up, restart and rollback, under the lock)."""
    plan = retention_plan(remote, layout, keep)
    apply_plan(remote, layout, plan)
    return plan
