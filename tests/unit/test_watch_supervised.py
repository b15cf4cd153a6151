"""Ready means supervised: the watch's verdict when the engine serves but its supervisor is gone; and the watch's
own give-up on an engine that printed a fatal line and lives on under a supervisor that does not end it.

Real parts throughout: the run's state.json on disk, the real supervisor's `status` and `listener` commands run
through LocalRemote, a real HTTP server answering /health on loopback from this test's own process group (the
"engine group" of the run), and a real process whose command line names it a supervisor (or a dead pid)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployer.engines import engine_for
from deployer.profile.model import Health
from deployer.box.push import RunDir
from deployer.remote.local import LocalRemote
from deployer.box.process import Launch
from deployer.watch.fatal import FATAL_GRACE_S
from deployer.watch.watcher import LIVENESS_EVERY_S, Event, Ready, Stuck, Unsupervised, Watcher


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def serving_port() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def supervisor() -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose command line says `supervise` (what supervisor_alive checks in /proc)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "supervise.py"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    return proc.pid


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watcher(tmp_path: Path, port: int, supervisor_pid: int) -> tuple[Watcher, list[Event], Clock]:
    run = RunDir(str(tmp_path), "run-1")
    state = {"status": "running", "pid": os.getpid(), "pgid": os.getpgid(0), "supervisor_pid": supervisor_pid,
             "started_at": time.time()}
    (tmp_path / "state.json").write_text(json.dumps(state))
    (tmp_path / "engine.log").write_text("[2026-11-30 10:00:00] Load weight begin.\n")
    events: list[Event] = []
    clock = Clock()
    health = Health(interval_s=0.2, startup_timeout_s=10_000, stall_timeout_s=10_000, request_timeout_s=5)
    watcher = Watcher(LocalRemote(), Launch(run, os.getpid(), os.getpgid(0), time.time(), 0), port, health,
                      engine_for("sglang"), events.append, clock=clock)
    return watcher, events, clock


def test_a_serving_engine_under_a_live_supervisor_is_ready(tmp_path: Path, serving_port: int,
                                                           supervisor: subprocess.Popen[bytes]) -> None:
    watcher, events, _ = _watcher(tmp_path, serving_port, supervisor.pid)
    assert isinstance(watcher.poll_once(), Ready)
    assert [e.kind for e in events if e.kind in ("ready", "supervisor-lost")] == ["ready"]


def test_a_serving_engine_whose_supervisor_died_is_not_ready(tmp_path: Path, serving_port: int) -> None:
    dead = _dead_pid()
    watcher, events, _ = _watcher(tmp_path, serving_port, dead)
    outcome = watcher.poll_once()
    assert isinstance(outcome, Unsupervised) and outcome.supervisor_pid == dead
    assert f"supervisor (pid {dead}) died" in outcome.describe()
    kinds = [e.kind for e in events]
    assert "supervisor-lost" in kinds and "ready" not in kinds


def test_a_loading_engine_whose_supervisor_died_is_noticed_before_it_serves(tmp_path: Path) -> None:
    """No /health yet (nothing listens): the periodic liveness check finds the supervisor gone."""
    watcher, events, clock = _watcher(tmp_path, 1, _dead_pid())
    assert watcher.poll_once() is None  # the first poll is too early for a liveness check
    clock.now += LIVENESS_EVERY_S + 0.1
    assert isinstance(watcher.poll_once(), Unsupervised)
    assert [e.kind for e in events].count("supervisor-lost") == 1


def test_what_the_engine_printed_just_before_serving_is_shown_before_ready(
        tmp_path: Path, serving_port: int, supervisor: subprocess.Popen[bytes],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine prints its last phases and starts serving between the poll's log read and its health check:
    those phases are still shown, before `ready` (a fast engine's `up` showed no phase at all)."""
    watcher, events, _ = _watcher(tmp_path, serving_port, supervisor.pid)
    (tmp_path / "engine.log").write_text("")  # nothing yet when the poll reads the log
    real_healthy = watcher._healthy

    def healthy_after_printing() -> bool:
        with open(tmp_path / "engine.log", "a") as log:
            log.write("[2026-11-30 10:00:01] Load weight begin. avail mem=139.80 GB\n")
        return real_healthy()

    monkeypatch.setattr(watcher, "_healthy", healthy_after_printing)
    assert isinstance(watcher.poll_once(), Ready)
    kinds = [(e.kind, e.data.get("phase")) for e in events if e.kind in ("phase", "ready")]
    assert kinds[-1] == ("ready", "ready")
    assert ("phase", "loading weights") in kinds[:-1], kinds


# Real SGLang 0.5.23 when its port is taken (docs/real-engines.md): uvicorn's bind error, then it never exits
BIND_FAILED = ("[2026-12-01 18:40:20] ERROR:    [Errno 98] error while attempting to bind on address "
               "('127.0.0.1', 30000): address already in use")


def test_an_engine_that_lives_on_after_a_fatal_bind_line_is_given_up_on_by_the_watcher_itself(
        tmp_path: Path, supervisor: subprocess.Popen[bytes]) -> None:
    """The run's supervisor races the watcher to end such an engine (tests/integration/test_watch.py accepts either);
    here the supervisor is a process that never does, and nothing answers /health: the `Stuck` verdict after
    FATAL_GRACE_S, not a minute later at a timeout, is the watcher's own."""
    watcher, events, clock = _watcher(tmp_path, 1, supervisor.pid)
    with open(tmp_path / "engine.log", "a") as log:
        log.write(BIND_FAILED + "\n")
    assert watcher.poll_once() is None  # the line is seen: the engine's grace to exit by itself begins
    clock.now += FATAL_GRACE_S - 0.5
    assert watcher.poll_once() is None
    clock.now += 0.5
    outcome = watcher.poll_once()
    assert isinstance(outcome, Stuck), outcome
    assert outcome.line == BIND_FAILED and outcome.waited_s == FATAL_GRACE_S
    assert "engine printed a fatal error and did not exit within 5s (stopped)" in outcome.describe()
    hung = [e for e in events if e.kind == "hung"]
    assert len(hung) == 1 and hung[0].data["line"] == BIND_FAILED and hung[0].data["stalled_s"] == FATAL_GRACE_S
