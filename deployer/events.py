"""Every event deployer emits while it works, as a frozen dataclass; JSON only at the NDJSON edge.

Steps emit events to an `EventSink` (a plain callable); consumers (the console, the fleet's prefixed lines, the
smoke's phase clock) tell them apart with isinstance and read their typed fields. Each event also carries optional
context: the node (rank) and host of a node group, the member (replica tag) and host of a fleet.

`to_json()` is the NDJSON line of `--json` (output/console.py JsonEvents) and nothing else: `{"event": kind, "at":
..., payload..., context...}`, the same names and keys users and tests parse. `kind` is that name; several classes
may share one (`exited` from an engine's supervisor and from a follower node).

    Event ─┬─ PhaseEntered, Progressed (Download), BecameReady, EngineExited, FollowerExited, EngineHung,
           │  StartupTimedOut, PortTakenSeen, SupervisorLost, StartSlow                        (watching)
           ├─ AttemptStarted, RunPushed, StartPredicted, Diagnosed, Changed, RollingBack, Restored
           │                                                                                  (the attempts)
           ├─ Note ─ Info, Warn, Problem, Suggestion, Override, Drift                      (a message)
           └─ SmokePhase                                                                      (smoke)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

CONTEXT = ("node", "host", "member")
BASE = ("at", *CONTEXT)


@dataclass(frozen=True, kw_only=True)
class Event:
    """One thing that happened; `at` is when (epoch seconds)."""

    kind: ClassVar[str] = "event"
    omit_none: ClassVar[frozenset[str]] = frozenset()   # payload fields left out of the JSON while None

    at: float = field(default_factory=time.time)
    node: int | None = None          # a node group's rank
    host: str | None = None          # the host it happened on (a node's, a fleet member's)
    member: str | None = None        # a fleet member's tag (r0, router)

    def payload(self) -> dict[str, Any]:
        """The event's own fields as JSON values (no name, time or context)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in BASE:
                continue
            value = getattr(self, f.name)
            if value is None and f.name in self.omit_none:
                continue
            out[f.name] = _json_value(value)
        return out

    @property
    def data(self) -> dict[str, Any]:
        """The payload and the context, as the NDJSON line has them (tests read events this way)."""
        context = {name: getattr(self, name) for name in CONTEXT if getattr(self, name) is not None}
        return {**self.payload(), **context}

    def to_json(self) -> dict[str, Any]:
        """The NDJSON line of `--json`: the only place an event becomes a dict."""
        return {"event": self.kind, "at": round(self.at, 3), **self.data}


EventSink = Callable[[Event], None]


def _json_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_json = getattr(value, "to_json", None)
        return to_json() if callable(to_json) else dataclasses.asdict(value)
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


# --- watching one engine --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class PhaseEntered(Event):
    """The engine's log shows a new phase (loading weights, capturing graphs, http up)."""

    kind: ClassVar[str] = "phase"
    phase: str
    elapsed: float
    line: str = ""


@dataclass(frozen=True, kw_only=True)
class Download:
    """What a progress line says about a download: a byte bar, a counted bar (files), or the hub cache's growth."""

    file: str | None
    percent: float | None = None
    text: str = ""
    bytes: int | None = None
    total_bytes: int | None = None
    rate_bytes_s: int | None = None
    done: float | None = None           # a counted bar (not bytes)
    total: float | None = None
    unit: str | None = None
    source: str | None = None           # "hub cache": measured from the cache folder, not the log

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "percent": self.percent}
        if self.source is not None:
            return {**out, "bytes": self.bytes, "total_bytes": self.total_bytes, "rate_bytes_s": self.rate_bytes_s,
                    "text": self.text, "source": self.source}
        out["text"] = self.text
        if self.done is None:
            return {**out, "bytes": self.bytes, "total_bytes": self.total_bytes, "rate_bytes_s": self.rate_bytes_s}
        return {**out, "done": self.done, "total": self.total, "unit": self.unit}


@dataclass(frozen=True, kw_only=True)
class Progressed(Event):
    """Output that moved (a new line, a bar whose count changed); `download` while weights are fetched."""

    kind: ClassVar[str] = "progress"
    phase: str
    elapsed: float
    line: str = ""
    download: Download | None = None

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.phase, "elapsed": self.elapsed, "line": self.line}
        return {**out, **self.download.to_json()} if self.download is not None else out


@dataclass(frozen=True, kw_only=True)
class BecameReady(Event):
    """Health answered from our engine (or the router came up with its workers)."""

    kind: ClassVar[str] = "ready"
    omit_none: ClassVar[frozenset[str]] = frozenset({"phase", "message"})
    elapsed: float
    phase: str | None = "ready"
    message: str | None = None


@dataclass(frozen=True, kw_only=True)
class EngineExited(Event):
    """The engine's process ended (its supervisor's final state)."""

    kind: ClassVar[str] = "exited"
    elapsed: float
    exit_code: int | None
    signal: int | None
    signal_name: str | None
    status: str | None

    def how(self) -> str:
        return f"killed by {self.signal_name or self.signal}" if self.signal else f"exit code {self.exit_code}"


@dataclass(frozen=True, kw_only=True)
class FollowerExited(Event):
    """A node group's follower ended while rank 0 was starting (node: its rank)."""

    kind: ClassVar[str] = "exited"
    message: str

    def payload(self) -> dict[str, Any]:
        return {"message": self.message}


@dataclass(frozen=True, kw_only=True)
class EngineHung(Event):
    """No progress for the stall timeout, or a fatal line the engine did not exit after (message, line)."""

    kind: ClassVar[str] = "hung"
    omit_none: ClassVar[frozenset[str]] = frozenset({"message", "line"})
    elapsed: float
    stalled_s: float
    message: str | None = None
    line: str | None = None


@dataclass(frozen=True, kw_only=True)
class StartupTimedOut(Event):
    kind: ClassVar[str] = "timeout"
    elapsed: float


@dataclass(frozen=True, kw_only=True)
class PortTakenSeen(Event):
    """The health answer came from a server that is not this run's engine."""

    kind: ClassVar[str] = "port-taken"
    elapsed: float
    port: int
    holders: list[str]


@dataclass(frozen=True, kw_only=True)
class SupervisorLost(Event):
    kind: ClassVar[str] = "supervisor-lost"
    elapsed: float
    supervisor_pid: int | None
    message: str


@dataclass(frozen=True, kw_only=True)
class StartSlow(Event):
    """A running start far beyond its prediction (observe/timeline.py's rule): `phase` the phase that is (None: the
    start as a whole, its download left out), `expected` the [fastest, slowest] of the earlier starts."""

    kind: ClassVar[str] = "slow-start"
    elapsed: float
    phase: str | None
    phase_s: float
    expected: list[float]
    message: str


# --- the attempts -----------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class AttemptStarted(Event):
    kind: ClassVar[str] = "attempt"
    attempt: int
    content_hash: str


@dataclass(frozen=True, kw_only=True)
class StartPredicted(Event):
    """What this start should take, from the last `starts` ready starts with its key (model, revision, engine
    version, host, engine arguments) in the target's records: `ready` and each phase's [fastest, slowest] seconds;
    `startup_timeout_s` the deadline `startup_timeout_s: auto` derived (None: the profile's fixed one)."""

    kind: ClassVar[str] = "prediction"
    attempt: int
    starts: int
    ready: list[float]
    phases: dict[str, list[float]]
    summary: str
    startup_timeout_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class RunPushed(Event):
    kind: ClassVar[str] = "pushed"
    run_id: str
    run_dir: str


@dataclass(frozen=True, kw_only=True)
class Diagnosed(Event):
    """An attempt's diagnosis (attempt 0, stage "preflight": the engine rejected the arguments before launch).
    The texts are as bounded as the report's."""

    kind: ClassVar[str] = "diagnosis"
    omit_none: ClassVar[frozenset[str]] = frozenset({"stage"})
    attempt: int
    stage: str | None = None
    signature: str | None
    summary: str
    transient: bool
    evidence: list[str]
    traceback: str | None
    remedy: dict[str, Any] | None      # the remedy's preview (args, env, reason) as the diagnosis shows it
    hint: str | None


@dataclass(frozen=True, kw_only=True)
class Changed(Event):
    """The change made for the next attempt (before_launch: to the arguments preflight found rejected)."""

    kind: ClassVar[str] = "change"
    omit_none: ClassVar[frozenset[str]] = frozenset({"before_launch"})
    attempt: int
    before_launch: bool | None = None
    args: dict[str, Any]
    env: dict[str, str | None]
    reason: str
    basis: dict[str, str]

    def text(self) -> str:
        """The reason, else the change itself."""
        parts = [f"{k}={v}" for k, v in self.args.items()] + [f"env {k}={v}" for k, v in self.env.items()]
        return self.reason or ", ".join(parts)


@dataclass(frozen=True, kw_only=True)
class RollingBack(Event):
    """Bringing back the version that served before a failed replace."""

    kind: ClassVar[str] = "rollback"
    message: str
    run_id: str
    content_hash: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Restored(Event):
    kind: ClassVar[str] = "restored"
    message: str
    run_id: str
    content_hash: str


# --- messages ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Note(Event):
    """A line for the user; the subclass says how much it matters."""

    kind: ClassVar[str] = "info"
    message: str


@dataclass(frozen=True, kw_only=True)
class Info(Note):
    kind: ClassVar[str] = "info"


@dataclass(frozen=True, kw_only=True)
class Warn(Note):
    kind: ClassVar[str] = "warning"


@dataclass(frozen=True, kw_only=True)
class Problem(Note):
    kind: ClassVar[str] = "problem"


@dataclass(frozen=True, kw_only=True)
class Suggestion(Note):
    kind: ClassVar[str] = "suggestion"


@dataclass(frozen=True, kw_only=True)
class Override(Note):
    kind: ClassVar[str] = "override"


@dataclass(frozen=True, kw_only=True)
class Drift(Note):
    kind: ClassVar[str] = "drift"


# --- smoke ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class SmokePhase(Event):
    """One smoke phase finished (passed or failed, with what failed)."""

    kind: ClassVar[str] = "smoke_phase"
    omit_none: ClassVar[frozenset[str]] = frozenset({"details"})
    phase: str
    status: str
    duration_s: float
    details: str | None = None
