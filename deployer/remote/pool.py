"""Connections kept open across commands: `kept_open()` makes every `conversing(spec)` inside it reuse one
connection per target (the dashboard asks the same hosts every few seconds; a new SSH handshake each time would
cost ~0.3 s and a login per refresh). Outside `kept_open()` nothing is pooled: each command opens and closes its own.

One thread at a time uses a host's connection (a re-entrant lock per target: the same thread may nest), and a
connection that failed is closed and dropped, so the next request opens a new one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from deployer.errors import DeployError, RemoteError
from deployer.remote.base import TargetSpec, Transport


@dataclass
class _Slot:
    lock: threading.RLock = field(default_factory=threading.RLock)
    transport: Transport | None = None


class Pool:
    """One open connection per TargetSpec, made by `connect` when first asked for."""

    def __init__(self, connect: Callable[[TargetSpec], Transport]) -> None:
        self._connect = connect
        self._slots: dict[TargetSpec, _Slot] = {}
        self._guard = threading.Lock()

    @contextmanager
    def use(self, spec: TargetSpec) -> Iterator[Transport]:
        """The target's connection, for this thread alone until the block ends; dropped when the block fails."""
        with self._guard:
            slot = self._slots.setdefault(spec, _Slot())
        with slot.lock:
            if slot.transport is None:
                slot.transport = self._connect(spec)
            try:
                yield slot.transport
            except BaseException as exc:
                if not isinstance(exc, DeployError) or isinstance(exc, RemoteError):
                    self._drop(slot)  # the connection may be broken; a NotFound or a refusal leaves it sound
                raise

    def close(self) -> None:
        with self._guard:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            with slot.lock:
                self._drop(slot)

    @staticmethod
    def _drop(slot: _Slot) -> None:
        transport, slot.transport = slot.transport, None
        if transport is not None:
            try:
                transport.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is gone either way
                pass


_active: Pool | None = None


def active() -> Pool | None:
    """The pool of the innermost `kept_open()`, if any."""
    return _active


@contextmanager
def kept_open(connect: Callable[[TargetSpec], Transport]) -> Iterator[Pool]:
    """Every `conversing(spec)` in this block (any thread) reuses one connection per target; all closed at the end."""
    global _active
    previous, _active = _active, Pool(connect)
    try:
        yield _active
    finally:
        pool, _active = _active, previous
        pool.close()
