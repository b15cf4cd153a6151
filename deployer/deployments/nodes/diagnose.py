"""The diagnosis of a multi-node engine that failed: from the FIRST rank that failed, never from the ranks that
died after it (a rank that lost its peer prints Gloo's "Connection closed by peer", NCCL's watchdog, ...).

Each rank's failure time is the earliest of: its first traceback's log timestamp (the target's local time,
turned into epoch seconds with that node's UTC offset), the moment its supervisor saw it end on its own, the
moment its supervisor broke the group because a peer was gone. Log timestamps have whole seconds, so a rank
whose failure is a consequence (the engine's MultiNode.peer_failures, or a broken group) yields to a rank that
failed on its own within CLOSE_S of it.
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass
from typing import Any

from deployer.diagnose.diagnosis import Diagnosis, diagnose, group_peer_lost
from deployer.engines import Engine

CLOSE_S = 2.0
TRACEBACK = "Traceback (most recent call last)"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?(?: [^\]]*)?\]", re.MULTILINE)
ENDED_ON_ITS_OWN = ("exited", "crashloop", "lost")


@dataclass(frozen=True)
class RankEnd:
    """What one rank's attempt left: its log window, its supervisor's state, its node's UTC offset."""

    rank: int
    log: str
    state: dict[str, Any]
    utc_offset_s: int = 0


@dataclass(frozen=True)
class RankFailure:
    rank: int
    at: float
    diagnosis: Diagnosis
    consequence: bool

    def describe(self) -> str:
        return f"node {self.rank} failed first: {self.diagnosis.summary}"


def first_traceback_at(log: str, utc_offset_s: int) -> float | None:
    """Epoch seconds of the log line that starts the first traceback (or the last stamped line before it)."""
    pos = log.find(TRACEBACK)
    if pos < 0:
        return None
    line_end = log.find("\n", pos)
    stamps = list(STAMP.finditer(log, 0, line_end if line_end >= 0 else len(log)))
    if not stamps:
        return None
    local = time.strptime(stamps[-1].group(1), "%Y-%m-%d %H:%M:%S")
    return calendar.timegm(local) - utc_offset_s


def rank_failure(end: RankEnd, *, version: str | None, engine: Engine) -> RankFailure | None:
    """When and why this rank failed; None when it did not fail on its own (stopped for the group by deployer)."""
    raw = end.state.get("last_crash")
    crash: dict[str, Any] = raw if isinstance(raw, dict) else {}
    peer_lost = end.state.get("peer_lost") if isinstance(end.state.get("peer_lost"), dict) else None
    times: list[float] = []
    tb_at = first_traceback_at(end.log, end.utc_offset_s)
    if tb_at is not None:
        times.append(tb_at)
    if end.state.get("status") in ENDED_ON_ITS_OWN and isinstance(end.state.get("ended_at"), (int, float)):
        times.append(float(end.state["ended_at"]))
    if peer_lost and isinstance(peer_lost.get("at"), (int, float)):
        times.append(float(peer_lost["at"]))
    if not times:
        return None
    diag = diagnose(end.log, engine_version=version, exit_code=crash.get("exit_code", end.state.get("exit_code")),
                    signal=crash.get("signal", end.state.get("signal")), engine=engine)
    multinode = engine.launch.multinode
    peers = multinode.peer_failures if multinode else frozenset()
    consequence = diag.signature in peers
    if peer_lost and (diag.signature is None or diag.signature == "killed-by-signal" or consequence):
        diag = group_peer_lost(str(peer_lost.get("reason")), engine.kind)
        consequence = True
    return RankFailure(rank=end.rank, at=min(times), diagnosis=diag, consequence=consequence)


def first_failure(ends: list[RankEnd], *, version: str | None, engine: Engine) -> RankFailure | None:
    """The rank that failed first (a rank that failed on its own beats a consequence within CLOSE_S)."""
    failures = [f for f in (rank_failure(e, version=version, engine=engine) for e in ends) if f is not None]
    if not failures:
        return None
    failures.sort(key=lambda f: (f.at, f.rank))
    earliest = failures[0]
    if earliest.consequence:
        own = [f for f in failures if not f.consequence and f.at - earliest.at <= CLOSE_S]
        if own:
            return own[0]
    return earliest


GENERATION_S = 120.0  # crashes this close to the latest one belong to the same fall of the group


def first_crash(crashes: dict[int, tuple[dict[str, Any], str | None]], engine: Engine) -> int | None:
    """From the supervisors' records after `up` (`deploy status`): rank -> (last_crash, its diagnosis's signature),
    the rank whose crash came first in the group's latest fall, a rank that ended for its peers yielding to one
    that ended on its own within CLOSE_S."""
    multinode = engine.launch.multinode
    peers = multinode.peer_failures if multinode else frozenset()
    timed = [(float(c["at"]), rank, bool(c.get("peer_lost")) or sig in peers)
             for rank, (c, sig) in crashes.items() if isinstance(c.get("at"), (int, float))]
    if not timed:
        return None
    latest = max(t for t, _, _ in timed)
    timed = sorted(t for t in timed if latest - t[0] <= GENERATION_S)
    earliest = timed[0]
    own = [t for t in timed if not t[2] and t[0] - earliest[0] <= CLOSE_S]
    return (own[0] if earliest[2] and own else earliest)[1]
