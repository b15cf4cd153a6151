"""Watch: follow a starting engine until it is ready or has failed.

A small state machine: starting (process alive, nothing listening) -> loading (the log shows progress lines) ->
ready (the health endpoint answers 200) or failed (exited, hung, timed out). The log is read incrementally from
a byte offset, so a poll costs the same whatever the log's size; polls start fast and back off to interval_s.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from deployer.engines.base import EngineSpec
from deployer.errors import DeployError, NotFound
from deployer.logtext import readable
from deployer.profile import Health
from deployer.remote import EndpointUnreachable, Remote
from deployer.start import Launch, status

READ_LIMIT = 1 << 20          # bytes read per poll at most
SKIP_AHEAD = 4 << 20          # further behind than this: jump to the last JUMP_TO bytes
JUMP_TO = 64 << 10            # (progress lines are short; the diagnosis reads its own window)
LIVENESS_EVERY_S = 5.0        # ask the supervisor (not just state.json) this often
FIRST_POLL_S = 0.05
DEAD_STATES = {"exited", "stopped", "crashloop", "lost", "absent"}


@dataclass(frozen=True)
class Event:
    kind: str                  # phase | progress | ready | exited | hung | timeout | attempt | diagnosis | change ...
    data: dict[str, Any]
    at: float = field(default_factory=time.time)


EventSink = Callable[[Event], None]


@dataclass(frozen=True)
class Ready:
    elapsed: float
    phase: str = "ready"


@dataclass(frozen=True)
class Crashed:
    elapsed: float
    exit_code: int | None
    signal: int | None
    signal_name: str | None
    tail: list[str]
    traceback_offset: int | None = None     # noted by the supervisor while the log was written

    def describe(self) -> str:
        how = f"killed by {self.signal_name or self.signal}" if self.signal else f"exited with code {self.exit_code}"
        return f"engine {how} after {self.elapsed:.1f}s"


@dataclass(frozen=True)
class Hung:
    elapsed: float
    stalled_s: float
    tail: list[str]

    def describe(self) -> str:
        return f"engine printed nothing for {self.stalled_s:.0f}s (hung) after {self.elapsed:.1f}s"


@dataclass(frozen=True)
class TimedOut:
    elapsed: float
    tail: list[str]

    def describe(self) -> str:
        return f"engine not ready after {self.elapsed:.0f}s (startup_timeout_s)"


Outcome = Union[Ready, Crashed, Hung, TimedOut]


class LogTail:
    """Reads a remote log from a byte offset; never re-reads, never holds more than a bounded window."""

    def __init__(self, remote: Remote, path: str, offset: int = 0, keep: int = 80) -> None:
        self.remote = remote
        self.path = path
        self.offset = offset
        self.partial = b""
        self.lines: deque[str] = deque(maxlen=keep)
        self.skipped = 0

    def poll(self) -> list[str]:
        size = self.remote.size(self.path)
        if size is None:
            return []
        if size < self.offset:  # truncated or replaced: start again
            self.offset, self.partial = 0, b""
        if size - self.offset > SKIP_AHEAD:
            self.skipped += size - JUMP_TO - self.offset
            self.offset, self.partial = size - JUMP_TO, b""
        try:
            data = self.remote.read(self.path, self.offset, READ_LIMIT)
        except NotFound:
            return []
        self.offset += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        new = [readable(c.decode("utf-8", "replace")) for c in chunks]
        new = [line for line in new if line]
        self.lines.extend(new)
        return new

    def tail(self, n: int = 30) -> list[str]:
        pending = readable(self.partial.decode("utf-8", "replace"))
        lines = list(self.lines) + ([pending] if pending else [])
        return lines[-n:]


class Watcher:
    """Polls one launch: supervisor state, log, health. `run()` returns the Outcome."""

    def __init__(self, remote: Remote, launch: Launch, port: int, health: Health, spec: EngineSpec,
                 emit: EventSink, clock: Callable[[], float] = time.monotonic) -> None:
        self.remote, self.launch, self.port, self.health, self.spec = remote, launch, port, health, spec
        self.emit, self.clock = emit, clock
        self.log = LogTail(remote, launch.run.log, launch.log_offset)
        self.phase = "starting"
        self.started = clock()
        self.last_progress = self.started
        self.last_liveness = self.started

    def run(self) -> Outcome:
        delay = FIRST_POLL_S
        for _ in range(10_000_000):  # bounded by the deadlines below
            outcome = self.poll_once()
            if outcome is not None:
                return outcome
            time.sleep(delay)
            delay = min(delay * 1.6, self.health.interval_s)
        raise DeployError("watch loop ran out of polls")  # pragma: no cover

    def poll_once(self) -> Outcome | None:
        now = self.clock()
        elapsed = now - self.started
        dead = self._dead_state(now)  # before the log: an exit is noticed without waiting for a log read
        self._read_log(now, elapsed)  # for a dead engine: its last words
        if dead is not None:
            return self._crashed(dead, elapsed)
        if self._healthy():
            self.emit(Event("ready", {"elapsed": round(elapsed, 3), "phase": "ready"}))
            return Ready(elapsed)
        stalled = now - self.last_progress
        if stalled > self.health.stall_timeout_s:
            self.emit(Event("hung", {"elapsed": elapsed, "stalled_s": stalled}))
            return Hung(elapsed, stalled, self.log.tail())
        if elapsed > self.health.startup_timeout_s:
            self.emit(Event("timeout", {"elapsed": elapsed}))
            return TimedOut(elapsed, self.log.tail())
        return None

    def _read_log(self, now: float, elapsed: float) -> None:
        new = self.log.poll()
        if not new:
            return
        self.last_progress = now
        new = [self.spec.masked(line) for line in new]
        for line in new:
            phase = self.spec.phase_of(line)
            if phase and phase != self.phase:
                self.phase = phase
                self.emit(Event("phase", {"phase": phase, "elapsed": round(elapsed, 3), "line": line[:300]}))
        self.emit(Event("progress", {"phase": self.phase, "elapsed": round(elapsed, 3), "line": new[-1][:300]}))

    def _dead_state(self, now: float) -> dict[str, Any] | None:
        state = self._state_file()
        if state.get("status") in DEAD_STATES:
            return state
        if state.get("status") == "ready":
            # The engine printed its ready line and went quiet, as it should: not a hang while health catches up
            # (SGLang's /health runs a one-token generation that can be slow the first time).
            self.last_progress = now
        if now - self.last_liveness >= LIVENESS_EVERY_S:
            self.last_liveness = now
            live = status(self.remote, self.launch.run)
            if live.get("status") in DEAD_STATES:
                return live
        return None

    def _state_file(self) -> dict[str, Any]:
        try:
            data = json.loads(self.remote.read(self.launch.run.state, 0, 1 << 16) or b"{}")
        except (NotFound, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _healthy(self) -> bool:
        try:
            reply = self.remote.request("GET", self.port, self.health.path, timeout=self.health.request_timeout_s)
        except EndpointUnreachable:
            return False
        return reply.status == 200

    def _crashed(self, state: dict[str, Any], elapsed: float) -> Crashed:
        outcome = Crashed(elapsed, state.get("exit_code"), state.get("signal"), state.get("signal_name"),
                          self.log.tail(), state.get("traceback_offset"))
        self.emit(Event("exited", {"elapsed": round(elapsed, 3), "exit_code": outcome.exit_code,
                                   "signal": outcome.signal, "signal_name": outcome.signal_name,
                                   "status": state.get("status")}))
        return outcome
