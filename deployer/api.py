"""deployer's Python API: load a profile, get its Deployment, call it; typed reports and events back.

    from deployer import api

    profile = api.load("profiles/qwen36-mtp.yaml")
    dep = api.deployment(profile)                      # or api.deployment("qwen36-mtp", host="root@gpu-box")
    up = dep.up(api.UpOptions(), print)                # events (watch.Event) to any callable; an UpReport back
    report = dep.status()                              # HostStatus / NodeStatus / FleetStatus
    print(report.exit_code, report.to_json())

The Deployment (deployer.deployments.base) is the same object the CLI calls: up, plan, render, status, logs,
history, diagnose, down, restart, rollback, prune, smoke. Every report has `to_json()` (the JSON `deploy ...
--json` prints) and `exit_code`. Failures raise the error tree of deployer.errors (each error knows its exit
code). Unlike the CLI, the API keeps no local SQLite history unless asked: `api.UpOptions()` and
`api.SmokeOptions()` have `local_history=False`; pass `local_history=True` to record attempts as `deploy up` and
`deploy smoke` do.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from deployer.deployments.base import Deployment, DownOptions, LogOptions, PruneOptions, Select
from deployer.deployments.reports import (DiagnosisReport, FleetDown, FleetStatus, HistoryReport, HostDown,
                                          HostStatus, NodeDown, NodeStatus, PlanReport, PruneReport)
from deployer.deployments.resolve import READ, Mode, for_profile, resolve
from deployer.deployments.single.deployment import Origin
from deployer.errors import DeployError
from deployer.runner import up as pipeline_up
from deployer.runner.up import UpReport
from deployer.profile.loader import load_profile
from deployer.profile.model import Profile
from deployer import smoke as smoke_run
from deployer.smoke import SmokeReport
from deployer.events import Event, EventSink

__all__ = ["DeployError", "Deployment", "DiagnosisReport", "DownOptions", "Event", "EventSink", "FleetDown",
           "FleetStatus", "HistoryReport", "HostDown", "HostStatus", "LogOptions", "NodeDown", "NodeStatus",
           "PlanReport", "Profile", "PruneOptions", "PruneReport", "SmokeOptions", "SmokeReport", "UpOptions",
           "UpReport", "deployment", "load"]


@dataclasses.dataclass(frozen=True)
class UpOptions(pipeline_up.UpOptions):
    """deployer.runner.up.UpOptions with the API's default: no local SQLite history (`local_history=False`)."""

    local_history: bool = False


@dataclasses.dataclass(frozen=True)
class SmokeOptions(smoke_run.SmokeOptions):
    """deployer.smoke.SmokeOptions with the API's default: no local SQLite history (`local_history=False`)."""

    local_history: bool = False


def load(path: str | Path, *, overrides: list[str] | None = None, host: str | None = None) -> Profile:
    """A profile file, validated (ProfileError, exit code 2, when it is not): `extends`, `${VAR}`, `--set`-style
    overrides (`engine.args.tp_size=2`) and another host, as the CLI reads it."""
    return load_profile(path, overrides=list(overrides or []), host=host)


def deployment(target: Profile | str | Path, *, host: str | None = None, workdir: str | None = None,
               trust_new_host: bool = False, node: int | None = None, mode: Mode = READ) -> Deployment:
    """The Deployment of a loaded profile, a profile file, or a deployment's name (then `host` is needed; a
    loaded profile's host is its target's: `load(path, host=...)` moves it).

    node: one node of a `nodes:` profile (status, logs, down of that node); mode: how an on-call command reaches
    it (READ: the engine's `${VAR}`s may be unset, as for `deploy status`)."""
    if isinstance(target, Profile):
        return for_profile(target, Origin(None, None, workdir, trust_new_host))
    return resolve(str(target), host, workdir, trust_new_host=trust_new_host, select=Select(node=node), mode=mode)
