"""Lines after which a starting server never becomes ready, whatever the engine, even when its process lives on.

Real SGLang 0.5.23 logs uvicorn's bind failure and then hangs forever instead of exiting (measured here: killed
after 300 s; see shared/real-engines.md). Waiting for stall_timeout_s or startup_timeout_s (minutes) for it is
what a user must never see: the watcher gives such an engine FATAL_GRACE_S to exit on its own, then stops it and
the log is diagnosed like a crash's.
"""

from __future__ import annotations

import re

# uvicorn/config.py's `logger.error(exc)` after `sock.bind` failed (uvicorn 0.3x: "[Errno 98] error while attempting
# to bind on address ('127.0.0.1', 30000): address already in use"); both engines serve HTTP through uvicorn.
FATAL_LINES = (
    re.compile(r"\[Errno \d+\] error while attempting to bind on address"),
)
FATAL_GRACE_S = 5.0  # an engine that exits by itself after such a line does so within a second or two


def fatal_line(line: str) -> bool:
    return any(p.search(line) for p in FATAL_LINES)
