"""Retention: what the target keeps of a deployment's old runs (their dirs, and the secrets in their env files).

An env file (0600, the run's secret values) stays only where a restart or rollback may need it, in a run that
reached ready (one that can be rolled back to): the current run, the newest run that reached ready, and the newest
ready run of another version (rollback's target); and the current run while its state says it is alive (a reboot's
start reads it). Every other run loses its env file as soon as an `up` (restart, rollback) ends: a run that ended
in a timeout or a crash before ready never needs its secrets again, current or not. Run dirs beyond the newest `keep` are
deleted whole, except those same runs and any run whose state still looks alive: they are never deleted.
`deploy prune` applies the same plan on demand, with `--keep` and `--dry-run`.

The supervisor payloads (`<deployment>/payload/<sha256>.py`, one per deployer version, named by the entry files of
the runs and the root: remote/program.py) stay while a kept run dir or the root names one, and the one this deployer
runs; another goes only when older than PAYLOAD_UNUSED_S, so a payload another deployer has just put there (before
it takes the lock and pushes a run naming it) is never taken from under it.

Pushed model directories (`engine.weights.push`, `<workdir>/.deployer/models/<content>/`) are shared by every
deployment of the workdir: one goes once no kept run of any of them loads it and nothing pushed or reused it for
MODELS_UNUSED_S (a `deploy prepare` ahead of its `up`), and never while a push of it runs.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import TargetError
from deployer.prepare.pushed import models_dir
from deployer.prepare.weights import size_text
from deployer.box.push import Layout, expand_workdir
from deployer.remote.base import Remote
from deployer.remote.program import payload_bundle
from deployer.supervisor.base import LIVE

DEFAULT_KEEP = 10
MODELS_UNUSED_S = 24 * 3600.0   # a pushed directory no kept run loads stays this long after its last push or reuse
PAYLOAD_UNUSED_S = 3600.0       # a payload nothing names stays this long after it was written

@dataclass(frozen=True)
class RunSummary:
    """What retention needs to know of one run."""

    run_id: str
    content_hash: str
    reached_ready: bool
    status: str
    has_env: bool
    payload: str = ""    # the sha256 of the payload its supervise.py names ("": a program of its own)


@dataclass(frozen=True)
class Payloads:
    """The payloads in a deployment dir (sha256 -> seconds since written) and the one its root's entries name."""

    ages: dict[str, float]
    root: str = ""


@dataclass
class RetentionPlan:
    keep: int
    runs: int
    delete: list[str] = field(default_factory=list)          # run ids whose dir goes
    drop_env: list[str] = field(default_factory=list)        # run ids (kept) whose env file goes
    protected: dict[str, str] = field(default_factory=dict)  # run id -> why it is never deleted
    drop_payloads: list[str] = field(default_factory=list)   # sha256s of the payload files that go

    def to_json(self) -> dict[str, Any]:
        return {"keep": self.keep, "runs": self.runs, "delete": self.delete, "drop_env": self.drop_env,
                "protected": self.protected, "drop_payloads": self.drop_payloads}


def plan_retention(runs: list[RunSummary], current: str | None, keep: int) -> RetentionPlan:
    """Pure: what to delete and which env files to drop, for runs listed oldest first."""
    protected = _protected(runs, current)
    for run in runs:
        if run.run_id not in protected and run.status in LIVE:
            protected[run.run_id] = f"its state says {run.status}"
    newest = {r.run_id for r in runs[-keep:]}
    plan = RetentionPlan(keep=keep, runs=len(runs), protected=protected)
    for run in runs:
        if run.run_id not in newest and run.run_id not in protected:
            plan.delete.append(run.run_id)
        elif run.has_env and not (run.run_id in protected and _needs_env(run, current)):
            plan.drop_env.append(run.run_id)
    return plan


def unused_payloads(runs: list[RunSummary], plan: RetentionPlan, payloads: Payloads, own: str) -> list[str]:
    """Pure: the payloads no run that stays, nor the root, nor this deployer (`own`) names, written long enough
    ago (PAYLOAD_UNUSED_S) that no push of another deployer can be about to name them."""
    named = {r.payload for r in runs if r.run_id not in plan.delete} | {payloads.root, own}
    return sorted(d for d, age in payloads.ages.items() if d not in named and age >= PAYLOAD_UNUSED_S)


def _needs_env(run: RunSummary, current: str | None) -> bool:
    """Whether a kept run may be started again from its env file: it reached ready (restart, rollback), or it is
    the current run and alive (a reboot starts it again)."""
    return run.reached_ready or (run.run_id == current and run.status in LIVE)


def _protected(runs: list[RunSummary], current: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if current is not None and any(r.run_id == current for r in runs):
        out[current] = "current"
    ready = [r for r in runs if r.reached_ready]
    if ready:
        out.setdefault(ready[-1].run_id, "newest run that reached ready")
        current_hash = next((r.content_hash for r in runs if r.run_id == current), ready[-1].content_hash)
        other = [r for r in ready if r.content_hash != current_hash]
        if other:
            out.setdefault(other[-1].run_id, "rollback's target (newest ready run of another version)")
    return out


def run_summaries(remote: Remote, layout: Layout) -> tuple[list[RunSummary], str | None, Payloads]:
    """Every run (oldest first), the current run's id and the payloads, read on the target in one request (the
    helper's `runs`)."""
    data = remote.helper.runs(layout.runs)
    try:
        runs = [RunSummary(str(r["id"]), str(r["hash"]), bool(r["ready"]), str(r["status"]), bool(r["env"]),
                           str(r.get("payload") or "")) for r in data["runs"]]
        payloads = Payloads({str(p["digest"]): float(p["age_s"]) for p in data.get("payloads") or []},
                            str(data.get("root_payload") or ""))
    except (KeyError, TypeError, ValueError):
        raise TargetError(f"cannot list the runs of {layout.root} on {remote.label}: "
                          f"the deployer helper answered {str(data)[:200]}") from None
    current = data.get("current")
    return runs, str(current) if current else None, payloads


def retention_plan(remote: Remote, layout: Layout, keep: int) -> RetentionPlan:
    runs, current, payloads = run_summaries(remote, layout)
    plan = plan_retention(runs, current, keep)
    plan.drop_payloads = unused_payloads(runs, plan, payloads, payload_bundle()[1])
    return plan


def apply_plan(remote: Remote, layout: Layout, plan: RetentionPlan) -> None:
    """Env files first (the secrets: also those of the dirs that go), then whole run dirs, then the payloads
    nothing names; one request."""
    dirs = [posixpath.join(layout.runs, r) for r in plan.delete]
    envs = [posixpath.join(layout.runs, r, "env") for r in plan.drop_env] + [posixpath.join(d, "env") for d in dirs]
    payloads = [posixpath.join(layout.payloads, f"{digest}.py") for digest in plan.drop_payloads]
    remote.helper.remove([*envs, *dirs, *payloads], layout.root)


def tidy(remote: Remote, layout: Layout, keep: int) -> RetentionPlan:
    """Apply the retention now (called at the end of every up, restart and rollback, under the lock)."""
    plan = retention_plan(remote, layout, keep)
    apply_plan(remote, layout, plan)
    return plan


@dataclass(frozen=True)
class PrunedModels:
    """What the retention of pushed model directories did (or, dry, would do) on one host."""

    removed: list[str] = field(default_factory=list)   # contents
    freed: int = 0                                      # bytes (a file another content shares is not counted)
    recent: list[str] = field(default_factory=list)    # unused, but pushed or reused within MODELS_UNUSED_S
    busy: list[str] = field(default_factory=list)      # being pushed now

    def to_json(self) -> dict[str, Any]:
        return {"removed": self.removed, "freed_bytes": self.freed, "recent": self.recent, "busy": self.busy}

    def describe(self, dry: bool = False) -> str | None:
        if not self.removed:
            return None
        verb = "would remove" if dry else "removed"
        names = ", ".join(c[:12] for c in self.removed)
        return (f"{verb} {len(self.removed)} pushed model dir(s) no kept run loads ({names}): "
                f"{size_text(self.freed)} freed")


def prune_pushed(remote: Remote, workdir: str, *, dry: bool = False, going: frozenset[str] = frozenset(),
                 min_age_s: float = MODELS_UNUSED_S) -> PrunedModels:
    """Retention of the pushed model directories under `workdir` (see the module's docstring), in one request to
    the helper, which reads what the kept runs of every deployment there load; `going`: run dirs
    (`<name>/runs/<id>`, relative to the workdir) about to be deleted, whose records do not count (a dry run's)."""
    root = expand_workdir(remote, workdir).rstrip("/")
    reply = remote.helper.call("models_prune", {"models": models_dir(root), "owned_from": root,
                                                "going": sorted(going), "min_age_s": min_age_s, "dry": dry},
                               120.0, "retention of the pushed model directories")
    return PrunedModels([str(c) for c in reply.get("removed") or ()], int(reply.get("bytes") or 0),
                        [str(c) for c in reply.get("recent") or ()], [str(c) for c in reply.get("busy") or ()])
