"""Where the dashboard's data comes from: the `DashboardSource` protocol, `StaticSource`, and `Throttled`.

The integrator implements `DashboardSource` over the Deployment interface (one helper conversation per host,
kept open); the page only ever sees the typed values of dashboard/model.py. `StaticSource` serves fixed values
(from dicts, or a directory of JSON files: the tests and `python -m deployer.dashboard --demo`), with logs that
grow when lines are appended (`append_log`, or a writer appending to the directory's `logs/<key>.log`).
`Throttled` puts a floor under how often the targets are asked, whatever the number of open pages. A source that
cannot answer in time raises `NoAnswer` (the server's one-line 504).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from deployer.dashboard.model import DeploymentDetail, LogChunk, LogRequest, OverviewRow

KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")
MAX_LOG_BYTES = 256 << 10          # the most one log request reads, whatever the page asks

T = TypeVar("T")


class NoAnswer(Exception):
    """A source's answer did not come in time (a host that does not answer); `str()` is one line (the server's
    504). A source may raise it from any call."""


class DashboardSource(Protocol):
    """What the dashboard asks. Every call may be slow (a trip to a target) and is made from a server thread;
    one that cannot answer in time raises NoAnswer."""

    def overview(self) -> Sequence[OverviewRow]:
        """Every deployment, fleet member and node, in the order to list them."""
        ...

    def detail(self, key: str) -> DeploymentDetail | None:
        """One row's deployment page (None: no such key)."""
        ...

    def log(self, key: str, request: LogRequest) -> LogChunk | None:
        """Complete lines of the row's current engine log (None: no such key or no log yet)."""
        ...


def valid_key(key: str) -> bool:
    """A key as the page may put it in an address (and StaticSource in a file name)."""
    return bool(KEY_RE.match(key)) and ".." not in key


def chunk_of(data: bytes, request: LogRequest, run_id: str | None = None) -> LogChunk:
    """The complete lines of a log's bytes that `request` asks for: from its offset on (a partial last line waits
    for the next call), or the tail (a partial first line dropped)."""
    size, limit = len(data), max(1, min(request.max_bytes, MAX_LOG_BYTES))
    if request.offset is None:
        start = max(0, size - limit)
        if start > 0:
            cut = data.find(b"\n", start - 1)
            start = size if cut < 0 else cut + 1
    else:
        start = min(max(0, request.offset), size)
    window = data[start:start + limit]
    last = window.rfind(b"\n")
    if last < 0:  # no complete line yet, or one longer than the window: hand on the window rather than stall
        last = len(window) - 1 if len(window) == limit else -1
    body = window[:last + 1]
    text = body.decode("utf-8", "replace")
    lines = tuple(text[:-1].split("\n") if text.endswith("\n") else [text] if text else [])  # not at \r: a redraw
    return LogChunk(lines=lines, start=start, end=start + len(body), size=size, run_id=run_id)


class StaticSource:
    """Fixed rows and details, and logs that only grow: a source with no target behind it."""

    def __init__(self, rows: Sequence[OverviewRow], details: Mapping[str, DeploymentDetail] | None = None,
                 logs: Mapping[str, str] | None = None, log_dir: Path | None = None) -> None:
        self._rows = list(rows)
        self._details = dict(details or {})
        self._logs = {k: v.encode() for k, v in (logs or {}).items()}
        self._log_dir = log_dir
        self._lock = threading.Lock()

    @classmethod
    def from_json(cls, data: Mapping[str, Any], log_dir: Path | None = None) -> StaticSource:
        """From `{"overview": [row, ...], "deployments": {key: detail}, "logs": {key: text}}`."""
        rows = [OverviewRow.from_json(r) for r in data.get("overview") or ()]
        details = {k: DeploymentDetail.from_json(v) for k, v in (data.get("deployments") or {}).items()}
        return cls(rows, details, dict(data.get("logs") or {}), log_dir)

    @classmethod
    def from_dir(cls, root: Path) -> StaticSource:
        """From `root/overview.json`, `root/deployments/<key>.json` and `root/logs/<key>.log` (read on every call,
        so lines appended to a log file are followed)."""
        overview = json.loads((root / "overview.json").read_text())
        deployments = {p.stem: json.loads(p.read_text()) for p in sorted((root / "deployments").glob("*.json"))}
        return cls.from_json({"overview": overview, "deployments": deployments}, log_dir=root / "logs")

    def overview(self) -> Sequence[OverviewRow]:
        return list(self._rows)

    def detail(self, key: str) -> DeploymentDetail | None:
        return self._details.get(key)

    def log(self, key: str, request: LogRequest) -> LogChunk | None:
        data = self._log_bytes(key)
        if data is None:
            return None
        detail = self._details.get(key)
        current = next((a.run_id for a in detail.attempts if a.current), None) if detail else None
        return chunk_of(data, request, current)

    def append_log(self, key: str, text: str) -> None:
        """More of the engine's output (what a running engine writes between two polls)."""
        with self._lock:
            self._logs[key] = self._logs.get(key, b"") + text.encode()

    def _log_bytes(self, key: str) -> bytes | None:
        with self._lock:
            if key in self._logs:
                return self._logs[key]
        if self._log_dir is None or not valid_key(key):
            return None
        path = self._log_dir / f"{key}.log"
        return path.read_bytes() if path.is_file() else None


class Throttled:
    """A source asked at most once per `min_interval_s` for the overview and for each detail; every page polling in
    between gets the last answer. One ask per slot at a time (a slow target is not asked again meanwhile by the
    next page), slots apart (a slow overview does not hold up a detail). Log reads go through: they are offset
    reads, bounded in size."""

    def __init__(self, inner: DashboardSource, min_interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._inner = inner
        self._interval = min_interval_s
        self._clock = clock
        self._cache: dict[str, tuple[float, Any]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def overview(self) -> Sequence[OverviewRow]:
        return self._cached("overview", self._inner.overview)  # type: ignore[no-any-return]

    def detail(self, key: str) -> DeploymentDetail | None:
        return self._cached(f"detail:{key}", lambda: self._inner.detail(key))  # type: ignore[no-any-return]

    def log(self, key: str, request: LogRequest) -> LogChunk | None:
        return self._inner.log(key, request)

    def _cached(self, slot: str, ask: Callable[[], T]) -> T:
        with self._guard:
            lock = self._locks.setdefault(slot, threading.Lock())
        with lock:
            hit = self._cache.get(slot)
            if hit is not None and self._clock() - hit[0] < self._interval:
                return hit[1]  # type: ignore[no-any-return]
            value = ask()
            if value is not None:  # an unknown key is not remembered: the cache holds only what exists
                self._cache[slot] = (self._clock(), value)
            return value
