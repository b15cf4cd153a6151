"""`LiveSource`: the dashboard's data from real targets, through the Deployment interface only.

Each watched deployment (a `deploy dashboard` argument, resolved as every command resolves it) answers `status()`
for the overview: the typed report `deploy status --json` prints from; its rows (a single host's, every deployment
of a host's, a group's nodes: `StatusRow`s; a fleet's members: `FleetMember`s, each with its `StatusRow`) are read
with dashboard/readers.py, so a row shows every field status shows (engine and version from the run's own record).
A row's page asks the part it is (`Deployment.member`) for its `history()` (the attempts) and reads its engine log
by offset (`Deployment.log_window`). The memory picture comes
from `plan()` of a deployment named by a profile file, asked once per part (a preflight trip) and kept.

A target that cannot be reached, or a deployment not found, is a row saying so (`unreachable` / `absent`, with the
error), never a failed page. Connections are kept open by the caller (remote.connect.kept_open around the server).

Each watched deployment's calls run on its own `Lane` (threads of its own, at most `LANE_DEPTH` calls at a time),
and each is awaited at most `deadline_s`: the overview asks every deployment at once and a host that does not
answer in time is a row `no answer` (its call left to finish; the next overview does not wait for it again), a
page or log read of it a `NoAnswer` (the server's 504); never a stall for the other hosts or the other pages.
One log read is at most MAX_LOG_BYTES, and only complete lines are handed on (a partial last line waits for its
end, unless it fills the whole window).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any, TypeVar

from deployer.dashboard.model import Attempt, DeploymentDetail, GpuMemory, LogChunk, LogRequest, OverviewRow, Rollback
from deployer.dashboard.readers import (
    attempts_from_history, drift_from_lines, memory_from_plan, row_of_member, row_of_status,
)
from deployer.dashboard.source import MAX_LOG_BYTES, NoAnswer
from deployer.deployments.base import Deployment, Select
from deployer.deployments.reports import FleetMember, FleetStatus
from deployer.operate.rows import StatusRow
from deployer.errors import DeployError, NotFound

_KEY_CHARS = re.compile(r"[^A-Za-z0-9._@-]+")
DEADLINE_S = 8.0                   # how long one page waits for one host
LANE_DEPTH = 4                     # calls of one deployment at a time (a host that stalls holds at most these)
T = TypeVar("T")


class Lane:
    """One watched deployment's calls, each on a daemon thread of its own (a stalled SSH session never holds up
    the process's exit), at most `depth` at a time: beyond that a call is refused at once (NoAnswer)."""

    def __init__(self, name: str, depth: int = LANE_DEPTH) -> None:
        self.name = name
        self._slots = threading.BoundedSemaphore(depth)

    def submit(self, call: Callable[[], T]) -> Future[T]:
        if not self._slots.acquire(blocking=False):
            raise NoAnswer(f"{self.name}: still waiting for its earlier answers")
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 (handed to whoever waits)
                future.set_exception(exc)
            finally:
                self._slots.release()

        threading.Thread(target=run, name=f"dashboard-lane-{self.name}"[:60], daemon=True).start()
        return future

    def ask(self, call: Callable[[], T], deadline_s: float) -> T:
        """`call()`'s answer, or NoAnswer after `deadline_s` (the call goes on and is forgotten)."""
        future = self.submit(call)
        done, _ = wait_for([future], timeout=deadline_s)
        if not done:
            raise NoAnswer(f"{self.name}: no answer within {deadline_s:g} s")
        return future.result()


Named = Callable[[str], Deployment]


@dataclass(frozen=True)
class Watched:
    """One deployment the dashboard shows, and what the CLI knows of its engine (from the profile, when given);
    for every deployment on a host (`deployment.name` None), `named` resolves one of them by its name (as the
    command line would, with the same --host and --workdir): its page and log are read from that one."""

    deployment: Deployment
    engine: str | None = None
    version: str | None = None
    named: Named | None = None


@dataclass(frozen=True)
class _Part:
    """Which part of which watched deployment a row is; `deployment`: the one its page is read from (the watched
    one, or for a host-wide one the row's own; None: none to read from)."""

    watched: Watched
    select: Select
    name: str
    host: str
    deployment: Deployment | None

    def member(self) -> Deployment:
        if self.deployment is None:
            raise NotFound(f"{self.name}: no deployment to read its page from")
        return self.deployment.member(self.select)


@dataclass
class _Asked:
    """A watched deployment's lane, and its status call still under way (if any)."""

    lane: Lane
    status: Future[list[OverviewRow]] | None = None
    plans: dict[str, Future[Any]] = field(default_factory=dict)


def watched(deployment: Deployment, named: Named | None = None) -> Watched:
    """A deployment to show, with its engine's kind and version when its profile names them; `named`: see
    Watched (for every deployment on a host)."""
    if deployment.name is None:
        return Watched(deployment, named=named)
    try:
        profile = deployment.known_profile()
    except DeployError:
        profile = None
    if profile is None:
        return Watched(deployment, named=named)
    return Watched(deployment, profile.engine.kind, profile.engine.version, named)


def row_key(name: str, host: str, node: int | None = None) -> str:
    """A row's address: name@host (and the node's rank), spelt as dashboard keys may be."""
    key = _KEY_CHARS.sub("-", f"{name}@{host}" + ("" if node is None else f".n{node}"))
    return key.strip("-.")[:128] or "deployment"


class LiveSource:
    """A DashboardSource over Deployments; thread-safe (the server answers pages from several threads)."""

    def __init__(self, watched: Sequence[Watched], deadline_s: float = DEADLINE_S) -> None:
        self._watched = list(watched)
        self._deadline_s = deadline_s
        self._asked = {id(w): _Asked(Lane(w.deployment.name or f"deployments-{i}")) for i, w in enumerate(watched)}
        self._parts: dict[str, _Part] = {}
        self._by_name: dict[tuple[int, str], Deployment] = {}
        self._rows: dict[str, OverviewRow] = {}
        self._drift: dict[str, tuple[str, ...]] = {}
        self._memory: dict[str, tuple[GpuMemory, ...]] = {}
        self._lock = threading.Lock()

    def overview(self) -> Sequence[OverviewRow]:
        """Every watched deployment's rows, all asked at once; one that has not answered within the deadline
        (or is still busy with an earlier ask) is a row saying so."""
        asks = [self._status_of(w) for w in self._watched]
        wait_for([future for future, fresh in asks if future is not None and fresh], timeout=self._deadline_s)
        rows: list[OverviewRow] = []
        for watched, (future, _) in zip(self._watched, asks):
            if future is not None and future.done():
                rows.extend(future.result())
            else:
                rows.append(self._silent_row(watched))
        return rows

    def detail(self, key: str) -> DeploymentDetail | None:
        part = self._part(key)
        if part is None:
            return None
        with self._lock:
            row, drift_lines = self._rows[key], self._drift.get(key, ())
        try:
            member = part.member()
            history = self._lane(part).ask(lambda: member.history().to_json(), self._deadline_s)
            attempts = tuple(attempts_from_history(history))
        except DeployError:
            attempts = ()
        drift = tuple(drift_from_lines(drift_lines))
        return DeploymentDetail(row=row, attempts=attempts, rollbacks=rollbacks_of(attempts), drift=drift,
                                memory=self._memory_of(key, part))

    def log(self, key: str, request: LogRequest) -> LogChunk | None:
        part = self._part(key)
        if part is None:
            return None
        limit = max(1, min(request.max_bytes, MAX_LOG_BYTES))
        try:
            member = part.member()
            window = self._lane(part).ask(lambda: member.log_window(request.offset, limit), self._deadline_s)
        except DeployError:
            return None
        if window is None:
            return None
        data, start = window.data[:limit], window.start
        if request.offset is None and start > 0:  # a tail: its first line is cut, unless it is all there is
            cut = data.find(b"\n")
            if 0 <= cut < len(data) - 1:
                data, start = data[cut + 1:], start + cut + 1
        return _offset_chunk(data, start, window.size, window.run_id, limit)

    # --- lanes ------------------------------------------------------------------------------------------------

    def _lane(self, part: _Part) -> Lane:
        return self._asked[id(part.watched)].lane

    def _status_of(self, watched: Watched) -> tuple[Future[list[OverviewRow]] | None, bool]:
        """The deployment's status call and whether it is new: the one still under way from an earlier overview
        (not waited for again), else a new one (None: its lane is full)."""
        asked = self._asked[id(watched)]
        with self._lock:
            if asked.status is not None and not asked.status.done():
                return asked.status, False
            try:
                asked.status = asked.lane.submit(lambda: self._rows_of(watched))
            except NoAnswer:
                asked.status = None
            return asked.status, True

    def _silent_row(self, watched: Watched) -> OverviewRow:
        name = watched.deployment.name or "deployments"
        row = OverviewRow(key=row_key(name, "no-answer"), name=name, host="", status="no answer",
                          engine=watched.engine, engine_version=watched.version)
        return self._keep(row, _Part(watched, Select(), name, "", watched.deployment), ())

    # --- rows -------------------------------------------------------------------------------------------------

    def _rows_of(self, watched: Watched) -> list[OverviewRow]:
        deployment = watched.deployment
        try:
            report = deployment.status()
        except DeployError as exc:
            name = deployment.name or "deployments"
            row = OverviewRow(key=row_key(name, "unreachable"), name=name, host="", status="unreachable",
                              engine=watched.engine, engine_version=watched.version)
            return [self._keep(row, _Part(watched, Select(), name, "", deployment), ())]
        if isinstance(report, FleetStatus):
            return [self._member_row(watched, m) for m in report.members]
        return [self._host_row(watched, r) for r in report.rows]

    def _member_row(self, watched: Watched, member: FleetMember) -> OverviewRow:
        router = member.role == "router"
        select = Select(router=True) if router else Select(replica=member.index or 0)
        host = member.row.host if member.row is not None else member.host
        row = row_of_member(member, row_key(member.name, host), engine=None if router else watched.engine,
                            version=None if router else watched.version)
        return self._keep(row, _Part(watched, select, member.name, host, watched.deployment), member.drift)

    def _host_row(self, watched: Watched, status: StatusRow) -> OverviewRow:
        node = None if status.node is None else status.node.rank
        select = Select(node=node) if node is not None else Select()
        row = row_of_status(status, row_key(status.name, status.host, node), engine=watched.engine,
                            version=watched.version)
        part = _Part(watched, select, status.name, status.host, self._read_from(watched, status.name))
        return self._keep(row, part, tuple(status.drift))

    def _read_from(self, watched: Watched, name: str) -> Deployment | None:
        """The deployment a row of `watched` is read from: itself, or (every deployment on a host) the one of
        the row's name, resolved once."""
        if watched.deployment.name is not None:
            return watched.deployment
        if watched.named is None or not name:
            return None
        with self._lock:
            found = self._by_name.get((id(watched), name))
        if found is None:
            try:
                found = watched.named(name)
            except DeployError:
                return None
            with self._lock:
                self._by_name[(id(watched), name)] = found
        return found

    def _keep(self, row: OverviewRow, part: _Part, drift: tuple[str, ...]) -> OverviewRow:
        with self._lock:
            self._parts[row.key], self._rows[row.key], self._drift[row.key] = part, row, drift
        return row

    def _part(self, key: str) -> _Part | None:
        with self._lock:
            known = key in self._parts
        if not known:
            self.overview()  # a page opened before the overview (a bookmark): learn the rows first
        with self._lock:
            return self._parts.get(key)

    def _memory_of(self, key: str, part: _Part) -> tuple[GpuMemory, ...]:
        """The plan's memory picture of a part of a profile's deployment (asked once: a preflight trip; kept once
        it has come, awaited within the deadline, none meanwhile)."""
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        if part.select.router or part.select.replica is not None:
            return ()
        plans = self._asked[id(part.watched)].plans
        with self._lock:
            future = plans.get(key)
        if future is None:
            try:
                whole = part.deployment
                if whole is None:
                    return ()
                future = self._lane(part).submit(lambda: whole.plan().to_json())
            except NoAnswer:
                return ()
            with self._lock:
                plans[key] = future
        if not wait_for([future], timeout=self._deadline_s).done:
            return ()
        try:
            plan = future.result()
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


def _offset_chunk(data: bytes, start: int, size: int, run_id: str, limit: int) -> LogChunk:
    """The complete lines of bytes read from `start`: a partial last line waits for the next poll (joined then,
    never shown as two), unless the window is full and holds no newline (a line longer than a read: handed on
    rather than stall)."""
    last = data.rfind(b"\n")
    body = data if last < 0 and len(data) >= limit else data[:last + 1]
    text = body.decode("utf-8", "replace")
    lines = tuple(text[:-1].split("\n") if text.endswith("\n") else [text] if text else [])
    return LogChunk(lines=lines, start=start, end=start + len(body), size=size, run_id=run_id)


__all__ = ["DEADLINE_S", "Lane", "LiveSource", "Watched", "rollbacks_of", "row_key", "watched"]
