"""Running one step on every node at once: a small bounded thread pool (the fleet's shared fan-out may replace
it: deployer/fleet/fanout.py is written in parallel for replicas)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

MAX_WORKERS = 8
T = TypeVar("T")
R = TypeVar("R")


def fan(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """fn over items concurrently (bounded pool), results in order; the first failure is raised after all ended."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [f.result() for f in futures]
