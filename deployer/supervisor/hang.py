"""The hang rule: an engine that holds requests and makes no forward progress is hung, even while /health answers.

Owns `HangRule` (pure: fed timed readings of the engine's /metrics, it says when the engine is hung) and
`HangWatch` (reads /metrics every `poll_s` in its own thread, so a hung engine never stalls the daemon's loop,
and feeds the rule). The series are the engine package's data (engines/<kind>/metrics.yaml): its running and
waiting gauges, and its `progress` counters, which advance on every engine step (each engine package's metrics.yaml
names them, with the release they come from), carried in supervise.json's "probe".

The rule: requests running, or waiting (with none running), and the progress counters unchanged for `hang_s`
-> hung. Idle time never counts (nothing is due); a reading that shows progress, or a one-token probe that got
its token, restarts the clock. When /metrics does not answer at all, the clock keeps running from the last
reading that was busy: an engine process stopped whole (SIGSTOP, a wedged event loop) is hung too.

Data-parallel engines are judged one by one: the engine package's `engine_labels` (e.g. `engine`, `dp_rank`)
split the series, each engine has its own clock, and one that holds requests without a step is hung while
the others step (a sum over engines would hide it).

Gauges can be stale: an engine may set its running/queue gauges only at its stats log, and republish them while
idle only every 30 s (the engine package's metrics.yaml says which release does), so an idle engine can read "2
running" with its counter still. So once half of `hang_s` passed without a step, the watch sends one one-token
completion of its own (the probe's request; a "nudge"): an engine that is alive answers it (its token restarts
the clock, and its step moves the counter); a hung one does not, and the rule ends it at `hang_s` as before.

`hang_s` is the profile's, or derived from the steps seen: 10x the longest wait between two advances while busy
(a long prefill makes a slow step; a full queue of long generations advances every step), bounded to
[HANG_MIN_S, HANG_MAX_S]; before any busy step was seen, HANG_UNSEEN_S. The floor keeps a GPU engine (steps of
milliseconds to a second) well away from a false restart and still catches a hang within about 20 s; the cap
bounds the worst detection at 5 minutes (peers' token heartbeats took ~2 minutes).

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .probe import METRICS_PATH, _SAMPLE, exchange

HANG_MIN_S = 20.0
HANG_MAX_S = 300.0
HANG_UNSEEN_S = 60.0
HANG_FACTOR = 10.0
POLL_S = 1.0
READ_TIMEOUT_S = 5.0

# one reading: (running, waiting, progress); progress None when the engine exposes none of the counters
Reading = Tuple[float, float, Optional[float]]
# the readings of one /metrics text, one per engine ("" when the engine's series carry none of its engine labels)
Readings = Dict[str, Reading]
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def engine_key(labels: Optional[str], engine_labels: List[str]) -> str:
    """Which engine a series belongs to: its values of the engine labels ("engine=1"); "" when it has none."""
    if not engine_labels or not labels:
        return ""
    found = dict(_LABEL.findall(labels))
    return ",".join("%s=%s" % (name, found[name]) for name in engine_labels if name in found)


def readings_of(metrics: str, running: List[str], waiting: List[str], progress: List[str],
                engine_labels: Optional[List[str]] = None) -> Optional[Readings]:
    """Per engine (its `engine_labels` values), the sums of the running and waiting gauges and of the progress
    counters in one /metrics text; an engine without either gauge is left out; None when none has one."""
    sums: Dict[str, Dict[str, float]] = {}
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name = match.group(1)
        which = "running" if name in running else "waiting" if name in waiting else \
            "progress" if name in progress else None
        if which is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        one = sums.setdefault(engine_key(match.group(2), engine_labels or []), {})
        one[which] = one.get(which, 0.0) + value
    found = {key: (one.get("running", 0.0), one.get("waiting", 0.0), one.get("progress"))
             for key, one in sums.items() if "running" in one or "waiting" in one}
    return found or None


def reading_of(metrics: str, running: List[str], waiting: List[str], progress: List[str]) -> Optional[Reading]:
    """The sums over all engines (one reading of the whole server); None when it has neither gauge."""
    found = readings_of(metrics, running, waiting, progress)
    return None if found is None else found[""]


class _Clock:
    """One engine's side of the rule: its progress, when it last moved, whether it holds requests."""

    def __init__(self) -> None:
        self.progress: Optional[float] = None
        self.moved_at: Optional[float] = None
        self.busy = False
        self.load: Tuple[float, float] = (0.0, 0.0)
        self.extended = False          # a token restarted this clock since its last step (several engines)


class HangRule:
    """Fed (time, readings) pairs in order; `feed` returns the hung record once one engine is hung.

    Each data-parallel engine (its engine labels' values) has its own clock: one that holds requests and does not
    step is hung while the others step. A token (the probe's, a nudge's) proves that *an* engine steps: with one
    engine it restarts the clock; with several it restarts each engine's clock at most once per stall, so a stuck
    engine behind live ones is still caught (by 2 x hang_s at worst)."""

    def __init__(self, hang_s: Optional[float] = None) -> None:
        self.fixed = hang_s
        self.longest = 0.0              # the longest busy wait between two advances seen (seconds), any engine
        self.clocks: Dict[str, _Clock] = {}

    @property
    def hang_s(self) -> float:
        if self.fixed:
            return self.fixed
        if self.longest <= 0:
            return HANG_UNSEEN_S
        return min(HANG_MAX_S, max(HANG_MIN_S, HANG_FACTOR * self.longest))

    @property
    def busy(self) -> bool:
        """Some engine holds requests and has a progress counter to judge."""
        return any(c.busy and c.moved_at is not None for c in self.clocks.values())

    @property
    def moved_at(self) -> Optional[float]:
        """When the engine stalled longest last moved (of those busy); None when none is."""
        busy = [c.moved_at for c in self.clocks.values() if c.busy and c.moved_at is not None]
        return min(busy) if busy else None

    def alive(self, now: float) -> None:
        """A token came back (the one-token probe): an engine steps."""
        several = len(self.clocks) > 1
        for clock in self.clocks.values():
            if several and clock.extended:
                continue
            if clock.moved_at is None or now > clock.moved_at:
                clock.moved_at, clock.extended = now, several

    def feed(self, now: float, reading: Union[Reading, Readings, None],
             answered: bool = True) -> Optional[Dict[str, Any]]:
        """`reading`: this poll's, per engine (a bare Reading is one engine); None with `answered` when /metrics
        answered without the gauges (nothing to judge), None without `answered` when it did not answer."""
        if reading is None:
            if answered:
                for clock in self.clocks.values():
                    clock.moved_at, clock.busy = now, False
                return None
            return self._judge(now, "/metrics does not answer")
        readings = {"": reading} if isinstance(reading, tuple) else reading
        self.clocks = {key: self.clocks.get(key) or _Clock() for key in readings}
        for key, one in readings.items():
            self._step(self.clocks[key], now, one)
        return self._judge(now, None)

    def _step(self, clock: _Clock, now: float, reading: Reading) -> None:
        running, waiting, progress = reading
        busy = running > 0 or waiting > 0
        if progress is None:           # no progress counter exposed: nothing to judge
            clock.moved_at, clock.busy = now, busy
            return
        if clock.progress is None or progress != clock.progress or clock.moved_at is None:
            if busy and clock.busy and clock.moved_at is not None and clock.progress is not None:
                self.longest = max(self.longest, now - clock.moved_at)
            clock.progress, clock.moved_at, clock.extended = progress, now, False
        elif not busy:
            clock.moved_at = now       # idle: no step is due
        clock.busy, clock.load = busy, (running, waiting)

    def _judge(self, now: float, why: Optional[str]) -> Optional[Dict[str, Any]]:
        limit = self.hang_s
        stalled_at = [(c.moved_at, key) for key, c in self.clocks.items() if c.busy and c.moved_at is not None]
        if not stalled_at:
            return None
        moved_at, key = min(stalled_at)
        stalled = now - moved_at
        if stalled < limit:
            return None
        clock = self.clocks[key]
        running, waiting = clock.load
        reason = "%g running, %g waiting and no engine step for %.0f s (hang_s %g%s)" % (
            running, waiting, stalled, limit, "" if self.fixed else ", derived")
        several = len(self.clocks) > 1   # one engine (a lone engine="0") is named as before: not at all
        if several:
            reason = "engine %s (of %d): %s" % (key, len(self.clocks), reason)
        if why:
            reason += "; " + why
        record = {"at": time.time(), "reason": reason, "running": running, "waiting": waiting,
                  "progress": clock.progress, "stalled_s": round(stalled, 1), "hang_s": limit,
                  "derived": not self.fixed, "longest_step_s": round(self.longest, 2)}
        if several:
            record["engine"] = key
        return record


class HangWatch:
    """Reads the engine's /metrics every `poll_s` in a thread and judges each reading with a HangRule.

    `due(now)` starts a read when one is due and none is in flight; `result()` feeds a finished read to the rule
    (in the caller's thread) and returns the hung record once it says hung."""

    def __init__(self, cfg: Dict[str, Any], nudge: Optional[Callable[[], Optional[str]]] = None) -> None:
        self.nudge = nudge          # one one-token completion: None when a token came (TokenWatch.once)
        self._nudging: Optional[threading.Thread] = None
        self._nudged_for: Optional[float] = None   # the clock start the last nudge was sent for
        self._token: Optional[Tuple[int, float]] = None
        self.address = str(cfg.get("address") or "127.0.0.1")
        self.port = int(cfg.get("port") or 0)
        self.running = [str(n) for n in cfg.get("running_metrics") or []]
        self.waiting = [str(n) for n in cfg.get("waiting_metrics") or []]
        self.progress = [str(n) for n in cfg.get("progress_metrics") or []]
        self.engine_labels = [str(n) for n in cfg.get("engine_labels") or []]  # data-parallel engines, each judged
        hang_s = cfg.get("hang_s")
        self.hang_s = float(hang_s) if isinstance(hang_s, (int, float)) and hang_s > 0 else None
        self.poll_s = float(cfg.get("hang_poll_s") or POLL_S)
        self.rule = HangRule(self.hang_s)
        self.generation = 0
        self.next_at = 0.0
        self._thread: Optional[threading.Thread] = None
        self._done: Optional[Tuple[int, float, Optional[Readings], bool]] = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.port > 0 and bool(self.progress) and bool(self.running or self.waiting)

    def reset(self, now: float) -> None:
        """A new engine: a new rule (what the one before did says nothing of this one)."""
        with self._lock:
            self.generation += 1
            self.rule = HangRule(self.hang_s)
            self.next_at = now + self.poll_s
            self._done = self._token = self._nudged_for = None

    def alive(self, now: float) -> None:
        self.rule.alive(now)

    def nudge_due(self, now: float) -> bool:
        """Sends the nudge (in a thread) when the engine has been busy with no step for half of hang_s and none
        was sent since the clock last started; True when it did."""
        rule = self.rule
        if self.nudge is None or not rule.busy or rule.moved_at is None or self._nudged_for == rule.moved_at:
            return False
        if now - rule.moved_at < rule.hang_s / 2 or (self._nudging is not None and self._nudging.is_alive()):
            return False
        self._nudged_for = rule.moved_at
        self._nudging = threading.Thread(target=self._nudge, args=(self.generation,), daemon=True)
        self._nudging.start()
        return True

    def _nudge(self, generation: int) -> None:
        assert self.nudge is not None
        if self.nudge() is None:
            with self._lock:
                self._token = (generation, time.monotonic())

    def due(self, now: float) -> bool:
        self.nudge_due(now)
        if not self.enabled or now < self.next_at or (self._thread is not None and self._thread.is_alive()):
            return False
        self.next_at = now + self.poll_s
        self._thread = threading.Thread(target=self._read, args=(self.generation,), daemon=True)
        self._thread.start()
        return True

    def result(self) -> Optional[Dict[str, Any]]:
        with self._lock:
            done, self._done = self._done, None
        if done is None or done[0] != self.generation:
            return None
        _, at, reading, answered = done
        return self.feed(at, reading, answered)

    def feed(self, at: float, reading: Union[Reading, Readings, None],
             answered: bool = True) -> Optional[Dict[str, Any]]:
        """A reading to the rule, after the token of a nudge that came back since (it restarts the clock)."""
        with self._lock:
            token, self._token = self._token, None
        if token is not None and token[0] == self.generation:
            self.rule.alive(token[1])
        return self.rule.feed(at, reading, answered)

    def _read(self, generation: int) -> None:
        import http.client  # on first use (deployer.supervisor.probe.exchange says why)

        reading, answered = None, True
        try:
            status, body = exchange(self.address, self.port, "GET", METRICS_PATH, None, {}, READ_TIMEOUT_S)
            if status == 200:
                reading = readings_of(body.decode("utf-8", "replace"), self.running, self.waiting, self.progress,
                                      self.engine_labels)
        except (OSError, http.client.HTTPException):
            answered = False
        with self._lock:
            self._done = (generation, time.monotonic(), reading, answered)
