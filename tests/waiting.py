"""Bounded waiting for the integration tests: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, deadline_s: float = 30.0, poll_s: float = 0.1) -> T:
    """The predicate's first truthy value (asked every `poll_s`); AssertionError naming `what` after `deadline_s`
    seconds."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")
