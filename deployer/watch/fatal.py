"""Lines after which a starting server never becomes ready, whatever the engine, even when its process lives on
(the patterns are data: deployer/engines/common/fatal.yaml, each with its source).

A real engine was measured logging uvicorn's bind failure and then hanging forever instead of exiting
(docs/real-engines.md). Waiting for stall_timeout_s or startup_timeout_s (minutes) for it is what a user must never
see: the watcher gives such an engine FATAL_GRACE_S to exit on its own, then stops it, and the log is diagnosed like
a crash's.
"""

from __future__ import annotations

import re
from functools import lru_cache

from deployer.engines.common import FATAL_GRACE_S, fatal_patterns

__all__ = ["FATAL_GRACE_S", "fatal_line"]


@lru_cache(maxsize=1)
def _patterns() -> tuple[re.Pattern[str], ...]:
    return fatal_patterns()


def fatal_line(line: str) -> bool:
    return any(p.search(line) for p in _patterns())
