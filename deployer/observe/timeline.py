"""A start's phase timeline, the prediction of the next start from earlier ones, the check that a running start
is far beyond that prediction, and the rule behind `startup_timeout_s: auto`. Pure: records in, values out; the
watcher supplies the phase marks, history stores the timelines.

Phases, in startup order (`Phase`): start (launch to the engine's first phase line: imports, argument parsing),
download, load (weights), compile (after the weights until the KV cache is sized: torch.compile, the profile
run), KV allocation, graph capture, http up (the API server listening, until /health answers 200) and first
token (/health 200 until the readiness probe's generated token); `ready` is the mark that ends the start. A
phase lasts from its mark to the next one.

A prediction comes from the last 3 starts that reached ready with the same StartKey (model, revision, engine
version, host, hash of the engine arguments), and needs at least 3 of them. Per phase it is the range (fastest,
slowest) those starts took, and so is ready. "Far beyond" is `1.5 x slowest + 60 s`, per phase and for the whole
start (the whole start less the time spent downloading: a download the earlier starts did not need is not
predicted from them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Phase(str, Enum):
    """A startup phase, in startup order."""

    START = "start"
    DOWNLOAD = "download"
    LOAD = "load"
    COMPILE = "compile"
    KV_ALLOCATION = "kv_allocation"
    GRAPH_CAPTURE = "graph_capture"
    HTTP_UP = "http_up"
    FIRST_TOKEN = "first_token"
    READY = "ready"            # the mark that ends a start, not a phase with a duration

    @property
    def label(self) -> str:
        """The phase's name for people ("kv allocation")."""
        return self.value.replace("_", " ")


WATCH_PHASES: Mapping[str, Phase] = {
    "starting": Phase.START,
    "args": Phase.START,
    "downloading": Phase.DOWNLOAD,
    "loading weights": Phase.LOAD,
    "weights loaded": Phase.COMPILE,
    "allocating cache": Phase.KV_ALLOCATION,
    "capturing cuda graphs": Phase.GRAPH_CAPTURE,
    "http up": Phase.HTTP_UP,
    "ready": Phase.READY,
}
"""The watcher's phase names (the engines' log phases, deployer/engines/*/spec.py) -> timeline phases. The
watcher has no mark for /health 200 yet (first token): until it has, http up lasts until ready."""


def phase_of_watch(name: str) -> Phase | None:
    """The timeline phase of one of the watcher's phase names; None for a name it does not know."""
    return WATCH_PHASES.get(name)


@dataclass(frozen=True)
class PhaseRecord:
    """One phase of one start: when it began (seconds after launch) and how long it lasted."""

    phase: Phase
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class Timeline:
    """One start's phases in order; `ready_s` seconds from launch to ready (None: it never got there);
    `download_bytes` what it downloaded (None: unknown)."""

    phases: tuple[PhaseRecord, ...]
    ready_s: float | None = None
    download_bytes: int | None = None

    @classmethod
    def from_marks(cls, marks: Sequence[tuple[Phase, float]], ended_s: float,
                   download_bytes: int | None = None) -> Timeline:
        """From the phase marks (phase entered, seconds after launch, in order) and the end (now, for a running
        start): each phase lasts until the next mark; the ready mark ends the start."""
        records: list[PhaseRecord] = []
        ready_s = None
        for index, (phase, at) in enumerate(marks):
            if phase is Phase.READY:
                ready_s = at
                break
            until = marks[index + 1][1] if index + 1 < len(marks) else ended_s
            records.append(PhaseRecord(phase, at, max(0.0, until - at)))
        return cls(tuple(records), ready_s, download_bytes)

    def duration(self, phase: Phase) -> float:
        """Seconds spent in a phase (0 when never entered; a phase entered twice counts both times)."""
        return sum(r.duration_s for r in self.phases if r.phase is phase)

    @property
    def current(self) -> PhaseRecord | None:
        """The last phase entered (for a running start: the one it is in)."""
        return self.phases[-1] if self.phases else None

    def elapsed(self) -> float:
        """Seconds from launch to ready, or to the end of its last phase."""
        if self.ready_s is not None:
            return self.ready_s
        last = self.current
        return last.start_s + last.duration_s if last else 0.0

    def download_rate(self) -> float | None:
        """Bytes per second of this start's download (None: nothing downloaded or size unknown)."""
        seconds = self.duration(Phase.DOWNLOAD)
        return self.download_bytes / seconds if self.download_bytes and seconds > 0 else None

    def to_json(self) -> dict[str, Any]:
        """The record kept on the target (outcome.json) and in local history."""
        return {"phases": [{"phase": r.phase.value, "start_s": round(r.start_s, 3),
                            "duration_s": round(r.duration_s, 3)} for r in self.phases],
                "ready_s": None if self.ready_s is None else round(self.ready_s, 3),
                "download_bytes": self.download_bytes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timeline:
        """Reads a record written by to_json()."""
        phases = tuple(PhaseRecord(Phase(p["phase"]), float(p["start_s"]), float(p["duration_s"]))
                       for p in data.get("phases", []))
        ready = data.get("ready_s")
        size = data.get("download_bytes")
        return cls(phases, None if ready is None else float(ready), None if size is None else int(size))


@dataclass(frozen=True)
class StartKey:
    """What makes two starts comparable: same model and revision, engine version, host and engine arguments."""

    model: str
    revision: str
    engine_version: str
    host: str
    args_hash: str

    @staticmethod
    def hash_args(args: Mapping[str, Any]) -> str:
        """A short stable hash of the engine arguments (key order does not matter)."""
        text = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PastStart:
    """One earlier start: its key, when it began (Unix seconds) and its timeline."""

    key: StartKey
    started_at: float
    timeline: Timeline


@dataclass(frozen=True)
class Range:
    """The fastest and slowest of several starts, in seconds."""

    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Range:
        """The range of some values (callers never pass none)."""
        seen = list(values)
        return cls(min(seen), max(seen))

    def text(self) -> str:
        """"7m40s-8m10s", or one value when both ends print alike, "0" for nothing."""
        low, high = duration_text(self.low), duration_text(self.high)
        return low if low == high else f"{low}-{high}"


PREDICTION_STARTS = 3
FAR_FACTOR = 1.5
FAR_SLACK_S = 60.0


def far_beyond(high_s: float) -> float:
    """The elapsed time past which a phase (or start) whose slowest earlier run took `high_s` is far beyond."""
    return FAR_FACTOR * high_s + FAR_SLACK_S


@dataclass(frozen=True)
class Overrun:
    """A running start (phase None: the whole of it) far beyond its prediction."""

    phase: Phase | None
    elapsed_s: float
    expected: Range
    starts: int

    def message(self) -> str:
        """One line for the watcher's warning."""
        what = f"{self.phase.label} has run" if self.phase else "the start has run"
        earlier = f"the last {self.starts} starts took {self.expected.text()}"
        limit = duration_text(far_beyond(self.expected.high))
        return f"{what} {duration_text(self.elapsed_s)}; {earlier} (far beyond: over {limit})"


@dataclass(frozen=True)
class Prediction:
    """What the next start should take, from the last `starts` ready starts with its key."""

    starts: int
    ready: Range
    ready_without_download: Range
    phases: Mapping[Phase, Range] = field(default_factory=dict)
    download_rate: float | None = None     # the slowest download seen, bytes/s (None: none measured)

    def summary(self) -> str:
        """ "last 3 starts: ready in 7m40s-8m10s; download 0; load 1m2s-1m5s; ..." (phases in order)."""
        parts = [f"last {self.starts} starts: ready in {self.ready.text()}"]
        parts += [f"{phase.label} {span.text()}" for phase, span in self.phases.items()]
        return "; ".join(parts)

    def check(self, running: Timeline) -> Overrun | None:
        """Whether a running start is far beyond this prediction: its current phase first, then the whole."""
        found = self.overruns(running)
        return found[0] if found else None

    def overruns(self, running: Timeline) -> list[Overrun]:
        """Every way a running start is far beyond this prediction: its current phase, then the whole of it."""
        found = []
        current = running.current
        if current is not None and current.phase in self.phases:
            expected = self.phases[current.phase]
            unpredicted = current.phase is Phase.DOWNLOAD and expected.high == 0
            if not unpredicted and current.duration_s > far_beyond(expected.high):
                found.append(Overrun(current.phase, current.duration_s, expected, self.starts))
        elapsed = running.elapsed() - running.duration(Phase.DOWNLOAD)
        if elapsed > far_beyond(self.ready_without_download.high):
            found.append(Overrun(None, elapsed, self.ready_without_download, self.starts))
        return found


def predict(history: Iterable[PastStart], key: StartKey, last: int = PREDICTION_STARTS) -> Prediction | None:
    """The prediction from the last `last` starts with this key that reached ready; None with fewer than 3."""
    same = sorted((s for s in history if s.key == key and s.timeline.ready_s is not None),
                  key=lambda s: s.started_at)[-last:]
    if len(same) < PREDICTION_STARTS:
        return None
    timelines = [s.timeline for s in same]
    ready = Range.of(t.elapsed() for t in timelines)
    without = Range.of(t.elapsed() - t.duration(Phase.DOWNLOAD) for t in timelines)
    seen = {r.phase for t in timelines for r in t.phases} | {Phase.DOWNLOAD}
    phases = {p: Range.of(t.duration(p) for t in timelines) for p in Phase if p in seen}
    rates = [r for t in timelines if (r := t.download_rate()) is not None]
    return Prediction(len(same), ready, without, phases, min(rates) if rates else None)


# -- startup_timeout_s: auto -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeoutRule:
    """The numbers of the `startup_timeout_s: auto` rule (see auto_startup_timeout)."""

    factor: float = 2.0
    slack_s: float = 120.0
    floor_s: float = 300.0
    no_history_s: float = 1800.0                 # the profile's fixed default
    assumed_bytes_per_s: float = 20 * 2 ** 20    # a download's speed when no earlier one was measured


@dataclass(frozen=True)
class AutoTimeout:
    """The derived deadline and how it was derived (shown to the user)."""

    seconds: float
    why: str


def auto_startup_timeout(prediction: Prediction | None, download_bytes: int | None,
                         rule: TimeoutRule = TimeoutRule()) -> AutoTimeout:
    """The startup deadline for `startup_timeout_s: auto`:

    - with a prediction (>= 3 earlier starts with the same key): `factor x` the slowest of them without its
      download `+ slack`, and never below `floor` (defaults: 2 x slowest + 120 s, at least 300 s);
    - without one: the fixed default (1800 s, the profile's default);
    - plus the download still to do: `download_bytes` at the slowest speed the history measured divided by
      `factor` (or at the assumed 20 MiB/s when none was measured); nothing when `download_bytes` is 0 (cached);
      when it is unknown (None), `factor x` the slowest download of the history (0 without history).
    """
    if prediction is None:
        base, why = rule.no_history_s, f"no 3 earlier starts: the default {duration_text(rule.no_history_s)}"
    else:
        slowest = prediction.ready_without_download.high
        base = max(rule.floor_s, rule.factor * slowest + rule.slack_s)
        why = (f"{rule.factor:g} x the slowest of the last {prediction.starts} starts ({duration_text(slowest)}) "
               f"+ {duration_text(rule.slack_s)}, at least {duration_text(rule.floor_s)}")
    extra, extra_why = _download_allowance(prediction, download_bytes, rule)
    total = base + extra
    return AutoTimeout(total, f"{why}{extra_why} = {duration_text(total)}")


def _download_allowance(prediction: Prediction | None, download_bytes: int | None,
                        rule: TimeoutRule) -> tuple[float, str]:
    if download_bytes == 0:
        return 0.0, ""
    if download_bytes is None:
        slowest = prediction.phases.get(Phase.DOWNLOAD, Range(0, 0)).high if prediction else 0.0
        seconds = rule.factor * slowest
        return seconds, (f" + {rule.factor:g} x the slowest earlier download ({duration_text(slowest)})"
                         if seconds else "")
    measured = prediction.download_rate if prediction else None
    speed = measured / rule.factor if measured else rule.assumed_bytes_per_s
    seconds = download_bytes / speed
    how = f"the slowest measured speed / {rule.factor:g}" if measured else "an assumed speed"
    return seconds, f" + {_size(download_bytes)} to download at {_size(int(speed))}/s ({how}): {duration_text(seconds)}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def duration_text(seconds: float) -> str:
    """A duration for people: "0", "0.4s", "42s", "7m40s", "1h05m"."""
    if seconds <= 0:
        return "0"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s" if whole % 60 else f"{whole // 60}m"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
