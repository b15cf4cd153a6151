"""Fan-out: one piece of work per fleet member, hosts concurrently (a bounded pool), members of one host in turn.

Work on one host runs in one thread, so a host is never asked for two changes at once (each member's work takes
that deployment's lock on the target before it changes anything); different hosts proceed side by side. Every
event a member's work emits is tagged with its `host` and `member` (`r0`, `router`) and passed on under a lock,
so the output of several hosts never interleaves inside a line. A member that fails does not stop the others:
its error is kept in its `Done` and the caller reports every member.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from deployer.errors import DeployError
from deployer.events import Event, EventSink

M = TypeVar("M")
T = TypeVar("T")
R = TypeVar("R")
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
            self(dataclasses.replace(event, host=host, member=member))
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
    _run_bounded(list(by_host.values()), one_host, max(1, min(max_hosts, len(by_host))))
    return results


def at_once(fn: Callable[[T], R], items: Sequence[T], max_workers: int = MAX_HOSTS_AT_ONCE) -> list[R]:
    """`fn` over `items` concurrently (the same bounded pool), results in order; once every call has ended, the
    first failure (in the items' order) is raised. For steps every host of one group must take (a multi-node
    engine's nodes), where one failure fails the group."""
    results: list[R | None] = [None] * len(items)
    errors: list[BaseException | None] = [None] * len(items)

    def one(group: list[int]) -> None:
        i = group[0]
        try:
            results[i] = fn(items[i])
        except BaseException as exc:  # noqa: BLE001 (raised below, after the others ended)
            errors[i] = exc

    if items:
        _run_bounded([[i] for i in range(len(items))], one, max(1, min(max_workers, len(items))))
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return cast(list[R], results)  # every slot was filled: no call failed


def _run_bounded(groups: list[list[int]], one_host: Callable[[list[int]], None], workers: int) -> None:
    """`workers` daemon threads take host groups from a queue. Daemons, and a wait that Ctrl-C interrupts: an
    interrupted command ends at once (what was started on the targets keeps running there, as after a single-host
    Ctrl-C) instead of waiting for every host's work to finish. A bug in the work is raised here."""
    pending: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
    for group in groups:
        pending.put(group)
    errors: list[BaseException] = []

    def worker() -> None:
        while True:  # bounded: each turn takes one group off a queue nobody adds to
            try:
                group = pending.get_nowait()
            except queue.Empty:
                return
            try:
                one_host(group)
            except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread)
                errors.append(exc)

    threads = [threading.Thread(target=worker, name=f"fanout-{i}", daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():  # bounded by the work's own deadlines (every wait in `up` has one)
            thread.join(timeout=0.2)
    if errors:
        raise errors[0]
