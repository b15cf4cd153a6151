"""Watch: follow a starting engine until it is ready or has failed.

A small state machine: starting (process alive, nothing listening) -> loading (the log shows progress lines, or
`downloading` while weight files are fetched) -> ready (the health endpoint answers 200 and the listener on the
port is a process of this run's engine group, still under its supervisor) or failed (exited, hung, timed out,
the port answered from someone else's server, or the supervisor died and left the engine unsupervised).
Progress is output that moves (new lines, a bar whose count changes), not only new lines: a 54 GB download
drawn with \r on one line is progress; a frozen bar is a stall. The log is read incrementally from a byte
offset, in bounded reads, so a poll costs the same whatever the log's size or the length of its lines; polls
start fast and back off to interval_s.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Union

from deployer.engines.base import Engine
from deployer.errors import DeployError, NotFound
from deployer.events import (
    BecameReady, Download, EngineExited, EngineHung, PhaseEntered, Progressed, PortTakenSeen, StartSlow,
    StartupTimedOut, SupervisorLost,
)
from deployer.events import Event as Event, EventSink as EventSink  # re-exported: the sink type watchers take
from deployer.logtext import clip, readable
from deployer.observe.timeline import Phase as TimelinePhase, Prediction, Timeline, phase_of_watch
from deployer.remote.base import EndpointUnreachable, Remote
from deployer.box.process import Launch, listener, status
from deployer.box.tokenprobe import TokenProbe
from deployer.supervisor.base import ENDED
from deployer.supervisor.protocol import ROTATION_MARK
from deployer.supervisor.probe import NO_TOKEN
from deployer.watch.fatal import FATAL_GRACE_S, fatal_line
from deployer.watch.hubcache import HubCache
from deployer.watch.progress import Bar, describe, human_bytes, parse

if TYPE_CHECKING:  # an annotation: `logs` (LogTail) does not load the profile model
    from deployer.profile.model import Health

READ_LIMIT = 1 << 20          # bytes read per poll at most
SKIP_AHEAD = 4 << 20          # further behind than this: jump to the last JUMP_TO bytes
JUMP_TO = 64 << 10            # (progress lines are short; the diagnosis reads its own window)
PARTIAL_KEEP = 64 << 10       # bytes of a line without newline held between polls
LINE_KEEP = 8 << 10           # characters of one line handed on (phases, tail, events)
BARS_KEPT = 64                # progress bars remembered (by description) to tell moving from frozen
LIVENESS_EVERY_S = 5.0        # ask the supervisor (not just state.json) this often
FIRST_POLL_S = 0.05
CACHE_EVERY_S = 5.0           # a quiet log: look at the model's hub cache this often (at most)
DEAD_STATES = {*ENDED, "absent"}  # absent: no state.json at all




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
        return f"engine output did not move for {self.stalled_s:.0f}s (hung) after {self.elapsed:.1f}s"


@dataclass(frozen=True)
class Stuck:
    """The engine printed an error it never recovers from (watch/fatal.py) but did not exit: deployer stops it."""

    elapsed: float
    line: str
    waited_s: float
    tail: list[str]

    def describe(self) -> str:
        return f"engine printed a fatal error and did not exit within {self.waited_s:.0f}s " \
               f"(stopped) after {self.elapsed:.1f}s"


@dataclass(frozen=True)
class TimedOut:
    elapsed: float
    tail: list[str]
    no_token: str | None = None     # /health answered, but the last one-token probe failed: why

    def describe(self) -> str:
        said = f"engine not ready after {self.elapsed:.0f}s (startup_timeout_s)"
        if self.no_token is not None:
            said += f": /health answers but no token came back ({NO_TOKEN}): {self.no_token}"
        return said


# A 4xx to the readiness probe is the engine's answer, not silence: it will not change by waiting (a wrong endpoint,
# a model name it does not serve, a refused key). 408, 425 and 429 say "later" and are waited out like no answer.
WAIT_AND_RETRY = (408, 425, 429)


def definite_refusal(status: int | None) -> bool:
    """Whether the probe's HTTP status ends the wait: a 4xx that does not say "try later"."""
    return status is not None and 400 <= status < 500 and status not in WAIT_AND_RETRY


@dataclass(frozen=True)
class ProbeRefused:
    """/health answers, but the engine refused the one-token probe with a definite 4xx (wrong endpoint, a model
    name it does not serve): waiting longer would not change the answer."""

    elapsed: float
    status: int
    path: str                    # the probe's endpoint
    model: str                   # the model name the probe asked for (the profile's served model)
    why: str                     # the engine's answer, in one line
    served: list[str] | None     # what the engine serves (GET /v1/models; None: it did not say)
    tail: list[str]

    def describe(self) -> str:
        return (f"the engine refused the readiness probe after {self.elapsed:.1f}s: HTTP {self.status} to POST "
                f"{self.path} for model {self.model!r}")

    def meaning(self) -> str:
        """What the engine said, and the model names it serves when the probe's is not one of them."""
        said = engine_message(self.why)
        if self.served is not None and self.model not in self.served:
            said += (f" (the probe asked for {self.model!r}, the profile's served model; the engine serves "
                     f"{', '.join(map(repr, self.served)) or 'no model'}: GET /v1/models)")
        return said


def engine_message(why: str) -> str:
    """The message of an engine's error answer ("HTTP 404: {json}"): the OpenAI shape `error.message`, a bare
    `message`, FastAPI's `detail`, else the text as it came."""
    head, _, body = why.partition(": ")
    try:
        data = json.loads(body)
    except ValueError:
        return why
    error = data.get("error") if isinstance(data, dict) else None
    for found in (error.get("message") if isinstance(error, dict) else None,
                  data.get("message") if isinstance(data, dict) else None,
                  data.get("detail") if isinstance(data, dict) else None):
        if isinstance(found, str) and found:
            return f"{head}: {found}"
    return why


@dataclass(frozen=True)
class PortTaken:
    """The port answered, but from a server that is not this run's engine (another deployment, a stray)."""

    elapsed: float
    port: int
    holders: str
    tail: list[str]

    def describe(self) -> str:
        return f"port {self.port} taken by {self.holders}"


@dataclass(frozen=True)
class Unsupervised:
    """The engine runs on, but its supervisor died: no restart policy covers it, so it is not ready."""

    elapsed: float
    supervisor_pid: int | None
    tail: list[str]

    def describe(self) -> str:
        return f"the engine's supervisor (pid {self.supervisor_pid}) died after {self.elapsed:.1f}s; " \
               f"the engine ran on unsupervised"


Outcome = Union[Ready, Crashed, Hung, Stuck, TimedOut, PortTaken, Unsupervised, ProbeRefused]


@dataclass(frozen=True)
class LogUpdate:
    """What one poll of the log found: how many bytes it grew, its new complete lines, and the unfinished line as
    it stands on screen now (a bar redrawn with \\r and no newline) when that changed."""

    grew: int
    lines: list[str]
    screen: str | None = None


class LogTail:
    """Reads a remote log from a byte offset; never re-reads, never holds more than a bounded window.

    A line with no newline (a progress bar redrawn with \\r, or a hostile 10 MB line) is held only as its last
    redraw, and at most PARTIAL_KEEP bytes of it; each line handed on is at most LINE_KEEP characters, with a note
    of what was cut.
    """

    def __init__(self, remote: Remote, path: str, offset: int = 0, keep: int = 80) -> None:
        self.remote = remote
        self.path = path
        self.offset = offset
        self.partial = b""
        self.dropped = 0            # bytes of the unfinished line not held (past PARTIAL_KEEP)
        self.lines: deque[str] = deque(maxlen=keep)
        self.skipped = 0

    def poll(self) -> list[str]:
        return self.update().lines

    def update(self) -> LogUpdate:
        size = self.remote.size(self.path)
        if size is None:
            return LogUpdate(0, [])
        if size < self.offset:  # rotated by the supervisor, or truncated or replaced
            self.offset, self.partial, self.dropped = self._after_rotation(size), b"", 0
        if size - self.offset > SKIP_AHEAD:
            self.skipped += size - JUMP_TO - self.offset
            self.offset, self.partial, self.dropped = size - JUMP_TO, b"", 0
        try:
            data = self.remote.read(self.path, self.offset, READ_LIMIT)
        except NotFound:
            return LogUpdate(0, [])
        if not data:
            return LogUpdate(0, [])
        self.offset += len(data)
        pieces = (self.partial + data).split(b"\n")
        new = []
        for i, piece in enumerate(pieces[:-1]):
            line = self._line(piece, self.dropped if i == 0 else 0)
            if line:
                new.append(line)
        if len(pieces) > 1:
            self.dropped = 0
        self._hold(pieces[-1])
        self.lines.extend(new)
        screen = self._line(self.partial, self.dropped) if b"\n" not in data[-1:] and self.partial else None
        return LogUpdate(len(data), new, screen or None)

    def _after_rotation(self, size: int) -> int:
        """Where to go on in a log that shrank: the supervisor's rotation left the startup part (shown already)
        and its marker line, so from that line on; a log truncated or replaced otherwise from its start."""
        try:
            at = self.remote.helper.find_bytes(self.path, ("\n" + ROTATION_MARK).encode())
        except DeployError:
            return 0
        return 0 if at is None or at + 1 > size else at + 1

    def _hold(self, rest: bytes) -> None:
        """Keep the unfinished line bounded: only its last redraw, and at most PARTIAL_KEEP bytes of that."""
        at = rest.rfind(b"\r")
        if at >= 0:
            if not rest[at + 1:].strip():  # a trailing \r: what is on screen is the redraw before it
                at = rest.rfind(b"\r", 0, at)
            if at > 0:
                rest, self.dropped = rest[at:], 0
        if len(rest) > PARTIAL_KEEP:
            self.dropped += len(rest) - PARTIAL_KEEP
            rest = rest[:PARTIAL_KEEP]
        self.partial = rest

    @staticmethod
    def _line(raw: bytes, dropped: int) -> str:
        text = readable(raw.decode("utf-8", "replace"))
        if dropped:
            return clip(text, LINE_KEEP) + f" ... [{dropped} more bytes cut]"
        return clip(text, LINE_KEEP)

    def tail(self, n: int = 30) -> list[str]:
        pending = self._line(self.partial, self.dropped) if self.partial else ""
        lines = list(self.lines) + ([pending] if pending else [])
        return lines[-n:]


def download_of(bar: Bar) -> Download:
    """A download bar as a `progress` event's download."""
    if bar.is_bytes:
        return Download(file=bar.file, percent=bar.percent, text=describe(bar), bytes=int(bar.n),
                        total_bytes=int(bar.total) if bar.total else None,
                        rate_bytes_s=round(bar.rate) if bar.rate is not None else None)
    return Download(file=bar.file, percent=bar.percent, text=describe(bar), done=bar.n, total=bar.total,
                    unit=bar.unit)


class SlowStart:
    """Warns (once per phase, once for the whole start) when a start runs far beyond its prediction (the rule is
    observe/timeline.py's); does nothing without a prediction."""

    def __init__(self, prediction: Prediction | None, emit: EventSink) -> None:
        self.prediction, self.emit = prediction, emit
        self.marks: list[tuple[TimelinePhase, float]] = [(TimelinePhase.START, 0.0)]
        self.warned: set[TimelinePhase | None] = set()

    def entered(self, phase: str, elapsed: float) -> None:
        mapped = phase_of_watch(phase)
        if mapped is not None and mapped is not TimelinePhase.READY and mapped is not self.marks[-1][0]:
            self.marks.append((mapped, elapsed))

    def check(self, elapsed: float) -> None:
        if self.prediction is None:
            return
        for overrun in self.prediction.overruns(Timeline.from_marks(self.marks, elapsed)):
            if overrun.phase in self.warned:
                continue
            self.warned.add(overrun.phase)
            self.emit(StartSlow(elapsed=round(elapsed, 3), phase=overrun.phase.value if overrun.phase else None,
                                phase_s=round(overrun.elapsed_s, 3),
                                expected=[overrun.expected.low, overrun.expected.high], message=overrun.message()))


class Watcher:
    """Polls one launch: supervisor state, log, health and a one-token probe (`probe`; None: /health alone).
    `run()` returns the Outcome."""

    def __init__(self, remote: Remote, launch: Launch, port: int, health: Health, engine: Engine,
                 emit: EventSink, clock: Callable[[], float] = time.monotonic, cache: HubCache | None = None,
                 address: str = "127.0.0.1", prediction: Prediction | None = None,
                 probe: TokenProbe | None = None) -> None:
        self.remote, self.launch, self.port, self.health, self.engine = remote, launch, port, health, engine
        self.probe = probe
        self.no_token: str | None = None             # why the last one-token probe failed (None: none failed)
        self.refused: tuple[int, str] | None = None  # the probe's definite 4xx: its status and the answer
        self.address = address  # where the target reaches the engine: its bind address, else loopback
        self.cache = cache
        self.cache_bytes: tuple[float, int] | None = None    # (when, size) of the last look at the hub cache
        self.emit, self.clock = emit, clock
        self.log = LogTail(remote, launch.run.log, launch.log_offset)
        self.phase = "starting"
        self.started = clock()
        self.last_progress = self.started
        self.last_liveness = self.started
        self.screen: str | None = None               # the unfinished line as last seen
        self.last_line = ""
        self.bar: Bar | None = None                  # the last progress bar seen
        self.bars: OrderedDict[str, float] = OrderedDict()   # bar description -> its count when last seen
        self.before_download: str | None = None
        self.orphaned: dict[str, Any] | None = None  # the supervisor's status once it died with the engine alive
        self.fatal: tuple[float, str] | None = None  # (when, line): the first fatal line seen (watch/fatal.py)
        self.slow = SlowStart(prediction, emit)

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
        if dead is None:
            self._look_at_cache(now, elapsed)
            self.slow.check(elapsed)
        if dead is not None:
            return self._crashed(dead, elapsed)
        if self.orphaned is not None:
            return self._unsupervised(self.orphaned, elapsed)
        if self._healthy():
            owner = listener(self.remote, self.launch.run, self.port)
            if owner.ours is False:
                self.emit(PortTakenSeen(elapsed=round(elapsed, 3), port=self.port, holders=owner.holders))
                return PortTaken(elapsed, self.port, owner.describe(), self.log.tail())
            if owner.ours:
                self.last_progress = now  # its server is up: the startup deadline bounds the wait for a token
                if self._token(elapsed):
                    return self._ready(elapsed)
                if self.refused is not None:
                    return self._refused(elapsed)
        if self.fatal is not None and now - self.fatal[0] >= FATAL_GRACE_S:
            stuck = Stuck(elapsed, self.fatal[1], now - self.fatal[0], self.log.tail())
            self.emit(EngineHung(elapsed=round(elapsed, 3), stalled_s=round(stuck.waited_s, 3),
                                 message=stuck.describe(), line=stuck.line))
            return stuck
        stalled = now - self.last_progress
        if stalled > self.health.stall_timeout_s:
            self.emit(EngineHung(elapsed=elapsed, stalled_s=stalled))
            return Hung(elapsed, stalled, self.log.tail())
        if elapsed > self.health.startup_deadline_s:
            self.emit(StartupTimedOut(elapsed=elapsed))
            return TimedOut(elapsed, self.log.tail(), self.no_token)
        return None

    def _token(self, elapsed: float) -> bool:
        """A one-token completion came back (always, without a probe); a failure is shown as progress once per
        reason and kept for the diagnosis of a start that runs out of time."""
        if self.probe is None:
            return True
        answer = self.probe.answer(self.remote)
        why = answer.why
        if why is not None and definite_refusal(answer.status):
            assert answer.status is not None
            self.refused = (answer.status, why)
            return False
        if why is not None and why != self.no_token:
            self.emit(Progressed(phase=self.phase, elapsed=round(elapsed, 3),
                                 line=clip(f"/health answers; waiting for a generated token: {why}", 300)))
        self.no_token = why
        return why is None

    def _refused(self, elapsed: float) -> ProbeRefused:
        """The probe's definite 4xx, with what the engine says it serves."""
        assert self.probe is not None and self.refused is not None
        status_code, why = self.refused
        served = self.probe.served_models(self.remote)
        refused = ProbeRefused(elapsed, status_code, self.probe.path, self.probe.model, clip(why, 300), served,
                               self.log.tail())
        self.emit(Progressed(phase=self.phase, elapsed=round(elapsed, 3), line=clip(refused.describe(), 400)))
        return refused

    def _ready(self, elapsed: float) -> Outcome:
        """Health answers from our engine; ready also means supervised (the restart policy covers it)."""
        self._read_log(self.clock(), elapsed)  # what it printed since the last read (its phases) comes first
        live = status(self.remote, self.launch.run)
        if live.get("status") in DEAD_STATES:
            return self._crashed(live, elapsed)
        if not live.get("supervisor_alive"):
            return self._unsupervised(live, elapsed)
        self.emit(BecameReady(elapsed=round(elapsed, 3)))
        return Ready(elapsed)

    def _unsupervised(self, live: dict[str, Any], elapsed: float) -> Unsupervised:
        pid = live.get("supervisor_pid")
        outcome = Unsupervised(elapsed, pid if isinstance(pid, int) else None, self.log.tail())
        self.emit(SupervisorLost(elapsed=round(elapsed, 3), supervisor_pid=outcome.supervisor_pid,
                                  message=outcome.describe()))
        return outcome

    def _read_log(self, now: float, elapsed: float) -> None:
        """Progress is output that moves: a new line, a bar whose count changed, an unfinished line that changed.
        The same text redrawn (a frozen bar) or nothing at all is not, and stall_timeout_s counts on."""
        update = self.log.update()
        if not update.grew:
            return
        moved = False
        for line in update.lines:
            moved = self._saw(line, elapsed) or moved
            if self.bar is not None and self.bar.text == line and self.bar.is_download:
                self._emit_progress(elapsed)  # a bar ended by a newline: that file is done, say so
        if update.screen is not None:
            if update.screen != self.screen:
                moved = self._saw(update.screen, elapsed) or moved
            self.screen = update.screen
        elif update.lines:
            self.screen = None
        if moved:
            self.last_progress = now
            self._emit_progress(elapsed)

    def _saw(self, line: str, elapsed: float) -> bool:
        """Note one line (or redraw); True when it is progress."""
        line = self.engine.masked(line)  # an args dump that prints secret values in clear (Engine.masked)
        if self.fatal is None and fatal_line(line):
            self.fatal = (self.clock(), line)
        bar = parse(line)
        if bar is None:
            self.last_line = line
            self._enter(self.engine.log.phase_of(line), elapsed, line)
            return True
        self.last_line, self.bar = line, bar
        if bar.is_download and self.phase != "downloading":
            self.before_download = self.phase
            self._enter("downloading", elapsed, line)
        elif not bar.is_download and self.phase == "downloading" and self.before_download is not None:
            self._enter(self.before_download, elapsed, line)  # the download is over: back to what it was doing
        before = self.bars.pop(bar.desc, None)
        self.bars[bar.desc] = bar.n
        while len(self.bars) > BARS_KEPT:
            self.bars.popitem(last=False)
        return before is None or before != bar.n

    def _look_at_cache(self, now: float, elapsed: float) -> None:
        """A log quiet for a while: bytes growing in the model's hub cache are a download (whose bars are off)."""
        every = min(CACHE_EVERY_S, self.health.stall_timeout_s / 3)
        if self.cache is None or now - self.last_progress < every:
            return
        if self.cache_bytes is not None and now - self.cache_bytes[0] < every:
            return
        size = self.cache.size(self.remote)
        if size is None:
            return
        before, self.cache_bytes = self.cache_bytes, (now, size)
        if before is None or size <= before[1]:
            return
        self.last_progress = now
        if self.phase != "downloading":
            self.before_download = self.phase
        rate = (size - before[1]) / max(now - before[0], 1e-3)
        text = f"{self.cache.folder_name} in the hub cache: {human_bytes(size)}, {human_bytes(rate)}/s"
        self._enter("downloading", elapsed, text)
        self.last_line = text
        self.emit(Progressed(phase=self.phase, elapsed=round(elapsed, 3), line=text,
                             download=Download(file=self.cache.repo_id, bytes=size, rate_bytes_s=round(rate),
                                               text=text, source="hub cache")))

    def _enter(self, phase: str | None, elapsed: float, line: str) -> None:
        if phase and phase != self.phase:
            self.phase = phase
            self.slow.entered(phase, elapsed)
            self.emit(PhaseEntered(phase=phase, elapsed=round(elapsed, 3), line=clip(line, 300)))

    def _emit_progress(self, elapsed: float) -> None:
        bar = self.bar if self.phase == "downloading" and self.bar is not None and self.bar.is_download else None
        self.emit(Progressed(phase=self.phase, elapsed=round(elapsed, 3), line=clip(self.last_line, 300),
                             download=download_of(bar) if bar is not None else None))

    def _dead_state(self, now: float) -> dict[str, Any] | None:
        state = self._state_file()
        if state.get("status") in DEAD_STATES:
            return state
        if state.get("status") == "ready":
            # The engine printed its ready line and went quiet, as it should: not a hang while health catches up
            # (a /health that runs a one-token generation can be slow the first time).
            self.last_progress = now
        if now - self.last_liveness >= LIVENESS_EVERY_S:
            self.last_liveness = now
            live = status(self.remote, self.launch.run)
            if live.get("status") in DEAD_STATES:
                return live
            if live.get("alive") and not live.get("supervisor_alive"):
                self.orphaned = live
        return None

    def _state_file(self) -> dict[str, Any]:
        try:
            data = json.loads(self.remote.read(self.launch.run.state, 0, 1 << 16) or b"{}")
        except (NotFound, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _healthy(self) -> bool:
        try:
            reply = self.remote.request("GET", self.port, self.health.path, timeout=self.health.request_timeout_s,
                                        address=self.address)
        except EndpointUnreachable:
            return False
        return reply.status == 200

    def _crashed(self, state: dict[str, Any], elapsed: float) -> Crashed:
        outcome = Crashed(elapsed, state.get("exit_code"), state.get("signal"), state.get("signal_name"),
                          self.log.tail(), state.get("traceback_offset"))
        self.emit(EngineExited(elapsed=round(elapsed, 3), exit_code=outcome.exit_code, signal=outcome.signal,
                               signal_name=outcome.signal_name, status=state.get("status")))
        return outcome
