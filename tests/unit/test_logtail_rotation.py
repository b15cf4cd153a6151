"""`deploy logs -f` (watch.watcher.LogTail) across the supervisor's rotation of engine.log: it goes on after the
marker line the rotation leaves, instead of printing the startup part again (issue 22, 9)."""

from __future__ import annotations

from typing import Any

from deployer.errors import NotFound
from deployer.supervisor.protocol import ROTATION_MARK
from deployer.watch.watcher import LogTail


class Log:
    """One remote file and the helper's find_bytes over it (what LogTail asks of a target)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.helper = self

    def size(self, path: str) -> int | None:
        return len(self.data)

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        if path != "engine.log":
            raise NotFound(path)
        return self.data[offset:offset + limit]

    def find_bytes(self, path: str, needle: bytes, offset: int = 0) -> int | None:
        at = self.data.find(needle, offset)
        return None if at < 0 else at


STARTUP = b"".join(b"startup line %d\n" % i for i in range(50))


def test_a_rotated_log_is_followed_from_its_marker_not_from_the_start() -> None:
    log = Log(STARTUP + b"".join(b"request %d\n" % i for i in range(400)))
    tail: Any = LogTail(log, "engine.log")   # type: ignore[arg-type]
    assert tail.poll()[-1] == "request 399"
    marker = f"\n{ROTATION_MARK}2026-12-02T05:00:00+0000: 5000 bytes after the startup part moved to engine.log.1 ====\n"
    log.data = STARTUP + marker.encode() + b"request 400\n"
    shown = tail.poll()
    assert shown == [marker.strip(), "request 400"], shown
    log.data += b"request 401\n"
    assert tail.poll() == ["request 401"]


def test_a_log_replaced_otherwise_is_read_from_its_start() -> None:
    log = Log(STARTUP)
    tail: Any = LogTail(log, "engine.log")   # type: ignore[arg-type]
    tail.poll()
    log.data = b"a new log\n"
    assert tail.poll() == ["a new log"]
