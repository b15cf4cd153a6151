"""The dashboard server's limits over real sockets (issue 35): every query parameter checked (a one-line 400, no
traceback), one log read at most 256 KiB whatever is asked, idle and dripping connections closed after the idle
timeout, the number of connections and of threads bounded while a normal request is still answered at once, a
source that does not answer a one-line 504, and no `NaN` in the JSON."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from deployer.dashboard import (
    DashboardConfig, DashboardServer, DeploymentDetail, LogChunk, LogRequest, OverviewRow, StaticSource, running,
)
from deployer.dashboard.shown import json_bytes
from deployer.dashboard.source import MAX_LOG_BYTES, NoAnswer

KEY = "big@box"
BIG_LOG = "".join(f"line {i:07d} " + "x" * 80 + "\n" for i in range(12_000))  # ~1.1 MB


class RecordingSource(StaticSource):
    """Stand-in source: a StaticSource that records every log request it is asked."""

    def __init__(self) -> None:
        row = OverviewRow(key=KEY, name="big", host="box", status="ready", p99_latency_ms=float("nan"),
                          tokens_per_s=float("inf"))
        super().__init__([row], {KEY: DeploymentDetail(row=row)}, {KEY: BIG_LOG})
        self.asked: list[LogRequest] = []

    def log(self, key: str, request: LogRequest) -> LogChunk | None:
        self.asked.append(request)
        return super().log(key, request)


class SilentSource(RecordingSource):
    """Stand-in source whose detail never comes in time."""

    def detail(self, key: str) -> DeploymentDetail | None:
        raise NoAnswer("deploy@box: no answer within 8 s")


FAST_DOOR = DashboardConfig(min_interval_s=0.0, idle_timeout_s=0.5, max_connections=32, workers=4)


@pytest.fixture()
def source() -> RecordingSource:
    return RecordingSource()


@pytest.fixture()
def server(source: RecordingSource) -> Iterator[DashboardServer]:
    with running(source, FAST_DOOR) as s:
        yield s


def token_of(server: DashboardServer) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/api/session", headers={"X-Deployer-Ticket": server.url.split("#ticket=")[1]})
        return str(json.loads(conn.getresponse().read())["token"])
    finally:
        conn.close()


def get(server: DashboardServer, path: str, token: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


@pytest.mark.parametrize("query, says", [
    ("offset=%C2%B2", "offset: expected a whole number"),         # ², which str.isdigit() calls a digit
    ("offset=" + "9" * 5000, "offset: expected a whole number"),
    ("offset=-1", "offset: expected a whole number"),
    ("offset=1.5", "offset: expected a whole number"),
    ("offset=%EF%BC%91", "offset: expected a whole number"),       # a fullwidth digit one
    ("offset=", "offset: expected a whole number"),
    ("max_bytes=0", "max_bytes: expected a whole number from 1"),
    ("max_bytes=-5", "max_bytes: expected a whole number from 1"),
    ("max_bytes=" + "9" * 5000, "max_bytes: expected a whole number from 1"),
    ("offset=1&offset=2", "offset is given twice"),
    ("bogus=1", "unknown query parameter 'bogus'"),
    ("a=1&b=2&c=3&d=4&e=5&f=6&g=7&h=8&i=9", "more than 8 query parameters"),
])
def test_a_bad_log_query_is_a_one_line_400(server: DashboardServer, query: str, says: str,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    status, body = get(server, f"/api/log?key={KEY}&{query}", token_of(server))
    text = body.decode()
    assert status == 400 and says in text, text
    assert text.count("\n") == 1 and text.endswith("\n") and len(text) < 300, text
    assert "Traceback" not in "".join(capfd.readouterr())


@pytest.mark.parametrize("path, says", [
    ("/api/deployment", "key is required"),
    ("/api/deployment?key=../../etc/passwd", "key: not a row's key"),
    ("/api/deployment?key=" + "k" * 200, "key: not a row's key"),
    ("/api/deployment?key=%FF%FE", "key: not a row's key"),
    ("/api/overview?key=x", "unknown query parameter 'key'"),
    (f"/api/log?key={KEY}&key={KEY}", "key is given twice"),
])
def test_every_data_route_checks_its_query(server: DashboardServer, path: str, says: str) -> None:
    status, body = get(server, path, token_of(server))
    assert status == 400 and says in body.decode(), body


def test_one_log_read_is_at_most_256_kib_whatever_is_asked(server: DashboardServer,
                                                           source: RecordingSource) -> None:
    token = token_of(server)
    for query in ("max_bytes=100000000", "max_bytes=999999999999", "offset=0&max_bytes=100000000"):
        status, body = get(server, f"/api/log?key={KEY}&{query}", token)
        assert status == 200
        chunk = json.loads(body)
        assert chunk["end"] - chunk["start"] <= MAX_LOG_BYTES
        assert sum(len(line) + 1 for line in chunk["lines"]) <= MAX_LOG_BYTES
    assert source.asked and all(r.max_bytes <= MAX_LOG_BYTES for r in source.asked), source.asked


def test_json_has_no_nan_and_a_source_without_an_answer_is_a_one_line_504() -> None:
    assert json.loads(json_bytes({"a": float("nan"), "b": [float("inf")], "c": 1.5})) == {"a": None, "b": [None],
                                                                                          "c": 1.5}
    with running(SilentSource(), FAST_DOOR) as server:
        token = token_of(server)
        status, body = get(server, "/api/overview", token)
        assert status == 200 and json.loads(body)["rows"][0]["p99_latency_ms"] is None
        status, body = get(server, f"/api/deployment?key={KEY}", token)
        assert status == 504 and body.decode() == "504 Gateway Timeout: deploy@box: no answer within 8 s\n"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
def test_the_config_refuses_a_refresh_that_is_not_a_positive_number(value: float) -> None:
    with pytest.raises(ValueError, match="refresh_s must be a finite number of seconds above 0"):
        DashboardConfig(refresh_s=value)


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server ends `sock` within `within_s`: the end of the stream (after a one-line refusal, if
    any) or a reset."""
    sock.settimeout(within_s)
    try:
        while sock.recv(1024):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_and_dripping_connections_are_closed_after_the_idle_timeout(server: DashboardServer) -> None:
    started = time.monotonic()
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    drip = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        drip.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n")   # the head never ends
        for _ in range(3):
            time.sleep(0.1)
            drip.sendall(b"X-Drip: 1\r\n")
        assert closed_by_server(idle, 5.0) and closed_by_server(drip, 5.0)
        assert time.monotonic() - started < 4.0
    finally:
        idle.close()
        drip.close()


def test_many_idle_connections_take_no_thread_and_a_request_is_answered_at_once(server: DashboardServer) -> None:
    token = token_of(server)
    threads_before = threading.active_count()
    with ExitStack() as stack:
        idle = [stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=5))
                for _ in range(120)]
        time.sleep(0.3)                                   # the doorway has taken them all in
        assert threading.active_count() - threads_before <= 2, threading.active_count()
        assert server.doorway is not None and server.doorway.open_connections <= FAST_DOOR.max_connections
        started = time.monotonic()
        status, body = get(server, "/api/overview", token)
        assert status == 200 and json.loads(body)["rows"][0]["key"] == KEY
        assert time.monotonic() - started < 1.0
        assert closed_by_server(idle[0], 2.0)             # the oldest made room for newer ones
    assert threading.active_count() - threads_before <= 2
