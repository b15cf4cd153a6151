"""`LiveSource` (deployer/dashboard/live.py) over stand-in deployments (issue 35): every host asked at once, each
within its own deadline (a host that does not answer is a row saying so, and the next overview does not wait for it
again; its pages answer NoAnswer in time), one log read at most 256 KiB whatever is asked, and a partial log line
joined with its end rather than shown as two lines."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest

from deployer.dashboard.live import LiveSource, Watched
from deployer.dashboard.model import LogRequest
from deployer.dashboard.source import MAX_LOG_BYTES, NoAnswer
from deployer.deployments.base import Deployment, Select
from deployer.deployments.reports import FleetStatus, HostStatus
from deployer.operate.rows import StatusRow
from deployer.box.snapshot import LogWindow


class _Json:
    def __init__(self, data: Any) -> None:
        self._data = data

    def to_json(self) -> Any:
        return self._data


class StandInDeployment:
    """Stand-in for a single-host Deployment: status, history and a growing engine log; `hang` makes every call
    wait until it is set free (a host whose SSH session stalled)."""

    def __init__(self, name: str, host: str, hang: threading.Event | None = None) -> None:
        self.name = name
        self.host = host
        self.hang = hang
        self.log = b""
        self.asked_bytes: list[int] = []

    def _wait(self) -> None:
        if self.hang is not None:
            self.hang.wait(30)

    def status(self) -> HostStatus:
        self._wait()
        return HostStatus([StatusRow.of({
            "name": self.name, "host": self.host, "status": "ready", "pid": 7, "uptime_s": 1.0, "healthy": True,
            "attempt": 1, "content_hash": "c0ffee", "run_dir": f"/w/{self.name}/runs/r1", "port": 30000,
            "restarts": 0, "last_crash": None, "exit_code": None, "signal_name": None, "drift": [], "runs": 1,
            "diagnosis": None, "lock": None, "serving": True, "metrics": None, "unhealthy": None})])

    def history(self) -> _Json:
        self._wait()
        return _Json([{"kind": "attempt", "run_id": "r1", "outcome": "ready", "current": True}])

    def member(self, select: Select) -> StandInDeployment:
        return self

    def plan(self) -> _Json:
        self._wait()
        return _Json({})

    def known_profile(self) -> None:
        return None

    def log_window(self, offset: int | None, max_bytes: int) -> LogWindow | None:
        self._wait()
        self.asked_bytes.append(max_bytes)
        start = max(0, len(self.log) - max_bytes) if offset is None else min(offset, len(self.log))
        return LogWindow(run_id="r1", size=len(self.log), start=start, data=self.log[start:start + max_bytes])


def watched(d: StandInDeployment) -> Watched:
    return Watched(cast(Deployment, d))


@pytest.fixture()
def stalled() -> Iterator[threading.Event]:
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()          # the stalled calls end with the test


def test_a_stalled_host_is_a_row_within_its_deadline_and_the_others_are_shown(stalled: threading.Event) -> None:
    dead = StandInDeployment("dead", "gpu-dead", hang=stalled)
    source = LiveSource([watched(StandInDeployment("a", "gpu-a")), watched(dead),
                         watched(StandInDeployment("b", "gpu-b"))], deadline_s=0.5)
    result: list[Any] = []
    asker = threading.Thread(target=lambda: result.append(source.overview()), daemon=True)
    started = time.monotonic()
    asker.start()
    asker.join(timeout=10)
    assert result, "the overview waited for the stalled host"
    assert time.monotonic() - started < 2.0
    rows = {row.name: row for row in result[0]}
    assert rows["a"].status == rows["b"].status == "ready" and rows["a"].serving
    assert rows["dead"].status == "no answer" and not rows["dead"].serving

    started = time.monotonic()
    again = {row.name: row.status for row in source.overview()}   # the stalled call is not waited for again
    assert again == {"a": "ready", "dead": "no answer", "b": "ready"}
    assert time.monotonic() - started < 0.4

    for _ in range(6):   # its page and log answer in time too (and a full lane refuses at once)
        started = time.monotonic()
        with pytest.raises(NoAnswer):
            source.detail(rows["dead"].key)
        with pytest.raises(NoAnswer):
            source.log(rows["dead"].key, LogRequest())
        assert time.monotonic() - started < 1.5

    stalled.set()                                                   # the host answers again
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "dead" not in {r.name for r in source.overview() if r.status == "ready"}:
        time.sleep(0.1)
    assert {r.name: r.status for r in source.overview()}["dead"] == "ready"


def test_one_log_read_is_at_most_256_kib_whatever_is_asked() -> None:
    host = StandInDeployment("big", "gpu-a")
    host.log = b"".join(b"%08d " % i + b"y" * 90 + b"\n" for i in range(10_000))   # ~1 MB
    source = LiveSource([watched(host)])
    (row,) = source.overview()
    for request in (LogRequest(None, 1 << 30), LogRequest(0, 1 << 30)):
        chunk = source.log(row.key, request)
        assert chunk is not None and chunk.end - chunk.start <= MAX_LOG_BYTES
    assert host.asked_bytes and max(host.asked_bytes) <= MAX_LOG_BYTES


def test_a_partial_line_waits_for_its_end_and_is_shown_as_one_line() -> None:
    host = StandInDeployment("part", "gpu-a")
    host.log = b"first line\n"
    source = LiveSource([watched(host)])
    (row,) = source.overview()
    tail = source.log(row.key, LogRequest())
    assert tail is not None and tail.lines == ("first line",)
    host.log += b"a partial li"
    waiting = source.log(row.key, LogRequest(tail.end))
    assert waiting is not None and waiting.lines == () and waiting.end == tail.end
    host.log += b"ne, finished later\nand the next"
    done = source.log(row.key, LogRequest(waiting.end))
    assert done is not None and done.lines == ("a partial line, finished later",)
    assert done.end == len(b"first line\na partial line, finished later\n")


def test_a_line_longer_than_a_whole_read_is_handed_on_rather_than_stall() -> None:
    host = StandInDeployment("long", "gpu-a")
    host.log = b"z" * (MAX_LOG_BYTES + 10)
    source = LiveSource([watched(host)])
    (row,) = source.overview()
    chunk = source.log(row.key, LogRequest(0, 1 << 20))
    assert chunk is not None and chunk.end == MAX_LOG_BYTES and len(chunk.lines[0]) == MAX_LOG_BYTES


class StandInFleet(StandInDeployment):
    """Stand-in for a fleet's Deployment: its status is a FleetStatus (r0 ready, r1 never deployed, the router);
    `member` records which part each page asks for."""

    def __init__(self) -> None:
        super().__init__("chat", "gpu-a")
        self.asked: list[Select] = []

    def status(self) -> FleetStatus:   # type: ignore[override]
        row = super().status().rows[0].to_json()
        place = {"url": "http://gpu-a:30000", "alias": "gpu-a"}
        replicas = [{**row, "name": "chat-r0", "role": "replica", "index": 0, "member": "r0", **place,
                     "in_router": True, "router_health": "healthy"},
                    {"name": "chat-r1", "host": "gpu-b", "status": "absent", "healthy": False, "serving": False,
                     "role": "replica", "index": 1, "member": "r1", "url": "http://gpu-b:30000", "alias": "gpu-b",
                     "in_router": None, "router_health": None}]
        router = {**row, "name": "chat-router", "role": "router", "index": None, "member": "router", **place}
        return FleetStatus({"name": "chat", "serving": False, "code": 9, "replicas": replicas, "router": router}, 9)

    def member(self, select: Select) -> StandInDeployment:
        self.asked.append(select)
        return self


def test_a_fleets_members_are_rows_and_each_page_asks_its_own_member() -> None:
    fleet = StandInFleet()
    source = LiveSource([watched(fleet)])
    rows = source.overview()
    assert [(r.name, r.kind, r.member, r.status, r.engine_version) for r in rows] == [
        ("chat-r0", "replica", "r0", "ready", None), ("chat-r1", "replica", "r1", "absent", None),
        ("chat-router", "router", "router", "ready", None)]
    for row in rows:
        source.detail(row.key)
    assert fleet.asked == [Select(replica=0), Select(replica=1), Select(router=True)]
