"""Output of fleet operations for people: every event on its own line, prefixed with the member and host it came
from (`r1@gpu-b`), so hosts working at once read side by side (its status table: deployer.deployments.status_text)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from deployer.logtext import shown
from deployer.events import (
    AttemptStarted, BecameReady, PhaseEntered, Changed, Diagnosed, Drift, EngineExited, EngineHung, Event, FollowerExited, Info,
    PortTakenSeen, Problem, Progressed, Restored, RollingBack, StartPredicted, StartSlow, StartupTimedOut,
    SupervisorLost, Warn,
)

QUIET = (Progressed,)   # download progress would flood a multi-host view: the phase lines say enough


class FleetProgress:
    """Prefixed event lines on stderr (never a live redraw: several hosts write at once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        if isinstance(event, QUIET):
            return
        text = event_text(event)
        if text is None:
            return
        who = f"{event.member or ''}@{event.host}" if event.host else "fleet"
        with self.lock:
            sys.stderr.write(f"{who:<20} {text}\n")
            sys.stderr.flush()

    def close(self) -> None:
        pass




def event_text(event: Event) -> str | None:  # noqa: C901 (one branch per event class)
    if isinstance(event, PhaseEntered):
        return f"{event.phase:<20} {event.elapsed:7.1f}s  {shown(event.line, 110)}"
    if isinstance(event, AttemptStarted):
        return f"attempt {event.attempt} (content {event.content_hash[:12]})"
    if isinstance(event, BecameReady):
        return shown(event.message or f"ready after {event.elapsed:.1f}s")
    if isinstance(event, EngineExited):
        return f"engine died ({event.how()}) after {event.elapsed:.1f}s"
    if isinstance(event, (EngineHung, StartupTimedOut)):
        return f"{event.kind} after {event.elapsed:.1f}s"
    if isinstance(event, Diagnosed):
        return f"diagnosis {event.signature or 'unknown'}: {shown(event.summary)}"
    if isinstance(event, Changed):
        return f"changing: {shown(event.reason)}"
    if isinstance(event, Info):
        return shown(event.message, 300)
    if isinstance(event, FollowerExited):
        return f"engine died ({shown(event.message)})"
    if isinstance(event, (Warn, Drift, Problem, RollingBack, Restored, SupervisorLost)):
        return f"{event.kind}: " + shown(event.message, 300)
    if isinstance(event, PortTakenSeen):
        return f"port {event.port} taken by {shown(', '.join(event.holders))}"
    if isinstance(event, StartPredicted):
        return f"predicted: {shown(event.summary, 300)}"
    if isinstance(event, StartSlow):
        return f"slow start: {shown(event.message, 300)}"
    return None
