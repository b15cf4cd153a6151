"""`LiveSource`: the dashboard's data from real targets, through the Deployment interface only.

Each watched deployment (a `deploy dashboard` argument, resolved as every command resolves it) answers `status()`
for the overview; its rows (a single host's, a fleet's members, a group's nodes) are read with dashboard/readers.py,
exactly the JSON `deploy status --json` prints. A row's page asks the part it is (`Deployment.member`) for its
`history()` (the attempts) and reads its engine log by offset (`Deployment.log_window`). The memory picture comes
from `plan()` of a deployment named by a profile file, asked once per part (a preflight trip) and kept.

A target that cannot be reached, or a deployment not found, is a row saying so (`unreachable` / `absent`, with the
error), never a failed page. Connections are kept open by the caller (remote.connect.kept_open around the server).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployer.dashboard.model import Attempt, DeploymentDetail, GpuMemory, LogChunk, LogRequest, OverviewRow, Rollback
from deployer.dashboard.readers import attempts_from_history, drift_from_lines, memory_from_plan, row_from_status
from deployer.deployments.base import Deployment, Select
from deployer.errors import DeployError

_KEY_CHARS = re.compile(r"[^A-Za-z0-9._@-]+")


@dataclass(frozen=True)
class Watched:
    """One deployment the dashboard shows, and what the CLI knows of its engine (from the profile, when given)."""

    deployment: Deployment
    engine: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class _Part:
    """Which part of which watched deployment a row is."""

    watched: Watched
    select: Select
    name: str
    host: str


def watched(deployment: Deployment) -> Watched:
    """A deployment to show, with its engine's kind and version when its profile names them."""
    try:
        profile = deployment.known_profile()
    except DeployError:
        profile = None
    if profile is None:
        return Watched(deployment)
    return Watched(deployment, profile.engine.kind, profile.engine.version)


def row_key(name: str, host: str, node: int | None = None) -> str:
    """A row's address: name@host (and the node's rank), spelt as dashboard keys may be."""
    key = _KEY_CHARS.sub("-", f"{name}@{host}" + ("" if node is None else f".n{node}"))
    return key.strip("-.")[:128] or "deployment"


class LiveSource:
    """A DashboardSource over Deployments; thread-safe (the server answers pages from several threads)."""

    def __init__(self, watched: Sequence[Watched]) -> None:
        self._watched = list(watched)
        self._parts: dict[str, _Part] = {}
        self._rows: dict[str, OverviewRow] = {}
        self._status: dict[str, Mapping[str, Any]] = {}
        self._memory: dict[str, tuple[GpuMemory, ...]] = {}
        self._lock = threading.Lock()

    def overview(self) -> Sequence[OverviewRow]:
        rows: list[OverviewRow] = []
        for watched in self._watched:
            rows.extend(self._rows_of(watched))
        return rows

    def detail(self, key: str) -> DeploymentDetail | None:
        part = self._part(key)
        if part is None:
            return None
        with self._lock:
            row, status = self._rows[key], self._status.get(key, {})
        member = part.watched.deployment.member(part.select)
        try:
            attempts = tuple(attempts_from_history(member.history().to_json()))
        except DeployError:
            attempts = ()
        drift = tuple(drift_from_lines([str(d) for d in status.get("drift") or ()]))
        return DeploymentDetail(row=row, attempts=attempts, rollbacks=rollbacks_of(attempts), drift=drift,
                                memory=self._memory_of(key, part))

    def log(self, key: str, request: LogRequest) -> LogChunk | None:
        part = self._part(key)
        if part is None:
            return None
        try:
            window = part.watched.deployment.member(part.select).log_window(request.offset, request.max_bytes)
        except DeployError:
            return None
        if window is None:
            return None
        data, start = window.data, window.start
        if request.offset is None and start > 0:  # a tail: its first line is cut, unless it is all there is
            cut = data.find(b"\n")
            if 0 <= cut < len(data) - 1:
                data, start = data[cut + 1:], start + cut + 1
        return _offset_chunk(data, start, window.size, window.run_id)

    # --- rows -------------------------------------------------------------------------------------------------

    def _rows_of(self, watched: Watched) -> list[OverviewRow]:
        deployment = watched.deployment
        try:
            data = deployment.status().to_json()
        except DeployError as exc:
            name = deployment.name or "deployments"
            row = OverviewRow(key=row_key(name, "unreachable"), name=name, host="", status="unreachable",
                              engine=watched.engine, version=watched.version)
            return [self._keep(row, _Part(watched, Select(), name, ""), {"error": exc.message})]
        if isinstance(data, dict) and "replicas" in data:
            members = [*(data.get("replicas") or ()), *([data["router"]] if data.get("router") else [])]
            return [self._member_row(watched, m) for m in members]
        rows = data if isinstance(data, list) else [data]
        return [self._host_row(watched, r) for r in rows]

    def _member_row(self, watched: Watched, status: Mapping[str, Any]) -> OverviewRow:
        name, host = str(status.get("name", "")), str(status.get("host", ""))
        router = status.get("role") == "router"
        select = Select(router=True) if router else Select(replica=int(status.get("index") or 0))
        row = row_from_status(status, row_key(name, host), engine=None if router else watched.engine,
                              version=None if router else watched.version)
        return self._keep(row, _Part(watched, select, name, host), status)

    def _host_row(self, watched: Watched, status: Mapping[str, Any]) -> OverviewRow:
        name, host = str(status.get("name", "")), str(status.get("host", ""))
        node = status.get("node")
        select = Select(node=int(node)) if node is not None else Select()
        row = row_from_status(status, row_key(name, host, None if node is None else int(node)),
                              engine=watched.engine, version=watched.version)
        return self._keep(row, _Part(watched, select, name, host), status)

    def _keep(self, row: OverviewRow, part: _Part, status: Mapping[str, Any]) -> OverviewRow:
        with self._lock:
            self._parts[row.key], self._rows[row.key], self._status[row.key] = part, row, status
        return row

    def _part(self, key: str) -> _Part | None:
        with self._lock:
            known = key in self._parts
        if not known:
            self.overview()  # a page opened before the overview (a bookmark): learn the rows first
        with self._lock:
            return self._parts.get(key)

    def _memory_of(self, key: str, part: _Part) -> tuple[GpuMemory, ...]:
        """The plan's memory picture of a part of a profile's deployment (asked once: a preflight trip)."""
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        memory: tuple[GpuMemory, ...] = ()
        if part.select.router is False and part.select.replica is None:
            try:
                plan = part.watched.deployment.plan().to_json()
            except DeployError:
                plan = None
            memory = _plan_memory(plan, part.select.node)
        with self._lock:
            self._memory[key] = memory
        return memory


def rollbacks_of(attempts: Sequence[Attempt]) -> tuple[Rollback, ...]:
    """The version serving again after newer attempts failed (oldest first in `attempts`): the current run is not
    the newest one, so a failed replace brought it back (or `deploy rollback` made an older run current)."""
    current = next((i for i, a in enumerate(attempts) if a.current), None)
    if current is None or current == len(attempts) - 1:
        return ()
    back, newer = attempts[current], attempts[current + 1:]
    failed = [a for a in newer if a.outcome != "ready"]
    why = f"after {failed[-1].run_id} {failed[-1].outcome}" if failed else "an older version made current"
    return (Rollback(run_id=back.run_id, status=back.outcome, at=newer[-1].started_at, reason=why),)


def _plan_memory(plan: Any, node: int | None) -> tuple[GpuMemory, ...]:
    """The memory block of a plan's JSON (a group's plan: node `node`'s, else node 0's)."""
    if isinstance(plan, dict) and isinstance(plan.get("nodes"), list) and plan["nodes"]:
        nodes = plan["nodes"]
        plan = nodes[node] if node is not None and 0 <= node < len(nodes) else nodes[0]
    if not isinstance(plan, dict) or not isinstance(plan.get("memory"), dict):
        return ()
    facts = plan.get("facts")
    gpus = facts.get("gpus") if isinstance(facts, dict) else None
    return tuple(memory_from_plan(plan["memory"], list(gpus or ())))


def _offset_chunk(data: bytes, start: int, size: int, run_id: str) -> LogChunk:
    """The complete lines of bytes read from `start` (a partial last line waits for the next poll, unless the
    window holds no newline at all: then it is handed on rather than stall)."""
    last = data.rfind(b"\n")
    body = data if last < 0 and data else data[:last + 1]
    text = body.decode("utf-8", "replace")
    lines = tuple(text[:-1].split("\n") if text.endswith("\n") else [text] if text else [])
    return LogChunk(lines=lines, start=start, end=start + len(body), size=size, run_id=run_id)


__all__ = ["LiveSource", "Watched", "rollbacks_of", "row_key", "watched"]
