"""The canary's window: every serving replica's /metrics read at its start and at its end, through each host's
helper (the engine's port as its host reaches it), turned into each replica's numbers over the window.

A replica whose /metrics cannot be read (metrics switched off, not Prometheus text, nothing answers) has no
numbers: the canary without numbers cannot be judged (the reason names the fix, e.g. the engine's metrics
switch); another replica without numbers is left out of the baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from deployer.engines import engine_for
from deployer.errors import DeployError
from deployer.deployments.fleet.canary_judge import WindowNumbers
from deployer.deployments.fleet.members import ReplicaMember
from deployer.observe.names import MetricNames, load_metric_names
from deployer.observe.prometheus import Scrape, parse
from deployer.observe.serving import ServingMetrics
from deployer.host import probe_address
from deployer.remote.base import Remote

SCRAPE_TIMEOUT_S = 5.0
Connect = Callable[[ReplicaMember], Remote]


@dataclass(frozen=True)
class Read:
    """One replica's numbers over the window, or why there are none."""

    member: ReplicaMember
    numbers: WindowNumbers | None
    problem: str | None = None


def scrape(remote: Remote, member: ReplicaMember) -> Scrape:
    """The replica's /metrics now; DeployError (one line) when it cannot be read."""
    engine = member.profile.engine
    reply = remote.request("GET", engine.port, "/metrics", timeout=SCRAPE_TIMEOUT_S,
                           address=probe_address(engine.host))
    if reply.status != 200:
        fix = _names(member).switch
        hint = f"; {fix.fix}" if fix is not None and reply.status == 404 else ""
        raise DeployError(f"/metrics of r{member.index} answered HTTP {reply.status}{hint}")
    return Scrape(time.time(), parse(reply.body.decode("utf-8", "replace")))


def _names(member: ReplicaMember) -> MetricNames:
    path = engine_for(member.profile.engine.kind).knowledge.metrics
    if path is None:
        raise DeployError(f"{member.profile.engine.kind}: no metric names known, a canary cannot be judged")
    return load_metric_names(path)


def measure(members: list[ReplicaMember], connect: Connect, window_s: float,
            sleep: Callable[[float], None] = time.sleep) -> list[Read]:
    """Every member's numbers over `window_s` seconds (one scrape before, one after), in the members' order."""
    before = {m.index: _try(connect, m) for m in members}
    sleep(window_s)
    out = []
    for member in members:
        first = before[member.index]
        if isinstance(first, str):
            out.append(Read(member, None, first))
            continue
        second = _try(connect, member)
        if isinstance(second, str):
            out.append(Read(member, None, second))
            continue
        try:
            metrics = ServingMetrics.from_scrapes(_names(member), second, first)
        except DeployError as exc:
            out.append(Read(member, None, exc.message))
            continue
        out.append(Read(member, WindowNumbers.of(member.index, metrics)))
    return out


def _try(connect: Connect, member: ReplicaMember) -> Scrape | str:
    """A scrape of `member`, or why there is none (one line)."""
    try:
        return scrape(connect(member), member)
    except DeployError as exc:
        return exc.message
