"""The local web dashboard: every deployment, fleet member and node at a glance, and one deployment's attempts,
memory plan, effective-args drift and live engine log. A read-only view over a `DashboardSource` (the same calls
as the CLI, whose `--json` field names its typed values mirror); nothing of it runs on the GPU boxes.

- model.py: the typed values (OverviewRow, DeploymentDetail, Attempt, GpuMemory, Drift, LogChunk, ...).
- readers.py: typed status rows and fleet members, and the CLI's `--json` outputs (history, plan, drift lines),
  read into them.
- source.py: the `DashboardSource` protocol, `StaticSource` (fixed values: tests, `--demo`), `Throttled`.
- shown.py: what may leave the server (control sequences stripped, secrets masked, JSON no parser reads as HTML).
- server.py: the standard-library HTTP server (127.0.0.1 by default, a per-run token sent as a header, a strict CSP).
- doorway.py: its connections (bounded in number and idle time, answered by a fixed pool of threads).
- query.py: the data routes' query parameters, checked (a one-line 400).
- options.py: the address, port and refresh a person gives, checked (one line each).
- live.py: `LiveSource`, the real targets through the Deployment interface (each host within its own deadline).
- static/: the pages (plain HTML, CSS and JS; no build step, nothing fetched from elsewhere).
- demo/: the data `python -m deployer.dashboard --demo` serves when given no directory.
"""

from deployer.dashboard.model import (
    Attempt, Change, DeploymentDetail, Diagnosis, Drift, GpuMemory, LastCrash, LogChunk, LogRequest, OverviewRow,
    Phase, Rollback,
)
from deployer.dashboard.readers import (
    attempts_from_history, drift_from_lines, memory_from_plan, row_of_member, row_of_status, with_phases,
)
from deployer.dashboard.server import DashboardConfig, DashboardServer, running
from deployer.dashboard.source import DashboardSource, StaticSource, Throttled

__all__ = [
    "Attempt", "Change", "DashboardConfig", "DashboardServer", "DashboardSource", "DeploymentDetail", "Diagnosis",
    "Drift", "GpuMemory", "LastCrash", "LogChunk", "LogRequest", "OverviewRow", "Phase", "Rollback", "StaticSource",
    "Throttled",
    "attempts_from_history", "drift_from_lines", "memory_from_plan", "row_of_member", "row_of_status", "running",
    "with_phases",
]
