"""Fan-out: one piece of work per fleet member, hosts concurrently (a bounded pool), members of one host in turn.

Work on one host runs in one thread, so a host is never asked for two changes at once (each member's work takes
that deployment's lock on the target before it changes anything); different hosts proceed side by side. Every
event a member's work emits is tagged with its `host` and `member` (`r0`, `router`) and passed on under a lock,
so the output of several hosts never interleaves inside a line. A member that fails does not stop the others:
its error is kept in its `Done` and the caller reports every member.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from deployer.errors import DeployError
from deployer.watch.watcher import Event, EventSink

M = TypeVar("M")
T = TypeVar("T")
MAX_HOSTS_AT_ONCE = 8


@dataclass
class Done(Generic[M, T]):
    """What the work on one member gave: its value, or the DeployError it raised."""

    member: M
    value: T | None = None
    error: DeployError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class TaggedSink:
    """A thread-safe view of one event sink that adds `host` and `member` to every event."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink
        self.lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self.lock:
            self.sink(event)

    def tagged(self, host: str, member: str) -> EventSink:
        def emit(event: Event) -> None:
            self(Event(event.kind, {**event.data, "host": host, "member": member}, event.at))
        return emit


def fan_out(members: Sequence[M], host_of: Callable[[M], str], tag_of: Callable[[M], str],
            work: Callable[[M, EventSink], T], sink: TaggedSink,
            max_hosts: int = MAX_HOSTS_AT_ONCE) -> list[Done[M, T]]:
    """Run `work` for every member: hosts at once (at most `max_hosts`), a host's members one after another.
    Results come back in the members' order. Only DeployError is caught: anything else is a bug and surfaces."""
    by_host: dict[str, list[int]] = {}
    for i, member in enumerate(members):
        by_host.setdefault(host_of(member), []).append(i)
    results: list[Done[M, T]] = [Done(m) for m in members]

    def one_host(indexes: list[int]) -> None:
        for i in indexes:
            member = members[i]
            try:
                results[i].value = work(member, sink.tagged(host_of(member), tag_of(member)))
            except DeployError as exc:
                results[i].error = exc

    if len(by_host) <= 1:
        for indexes in by_host.values():
            one_host(indexes)
        return results
    with ThreadPoolExecutor(max_workers=max(1, min(max_hosts, len(by_host))),
                            thread_name_prefix="fanout") as pool:
        for future in [pool.submit(one_host, idx) for idx in by_host.values()]:
            future.result()
    return results
