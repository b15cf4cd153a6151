"""Ctrl-C and SIGTERM: how long the clean-up after an interrupt may take before deployer leaves anyway.

cli/main.py starts the clock when the interrupt arrives (`begin`) and leaves when it runs out (`expired`); the
usual clean-up (releasing the lock, the report) gets GRACE_S. A step that must not be left half done (bringing
back the version an interrupted replace stopped, adding a drained replica back to its router) asks for the time
it needs (`allow`), itself bounded by the stop's grace and the start it waits for.
"""

from __future__ import annotations

import threading
import time

GRACE_S = 20.0
_lock = threading.Lock()
_deadline: list[float] = []  # empty while no interrupt is being cleaned up after


def begin(grace_s: float = GRACE_S) -> None:
    with _lock:
        _deadline[:] = [time.monotonic() + grace_s]


def allow(seconds: float) -> None:
    """Give the clean-up of the interrupt in progress at least `seconds` more (no-op without one)."""
    with _lock:
        if _deadline:
            _deadline[0] = max(_deadline[0], time.monotonic() + seconds)


def left() -> float | None:
    """Seconds the clean-up may still take; None when no interrupt is in progress."""
    with _lock:
        return _deadline[0] - time.monotonic() if _deadline else None


def end() -> None:
    with _lock:
        _deadline.clear()
