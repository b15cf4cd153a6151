"""Output of fleet operations for people: every event on its own line, prefixed with the member and host it came
from (`r1@gpu-b`), so hosts working at once read side by side; and the fleet's report table (its status table
is in deployer.output.fleet_status)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from deployer.deployments.fleet.report import serves
from deployer.logtext import clip, printable
from deployer.output.fleet_status import status_lines as status_lines   # the table's home; named here too
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


def _t(value: Any, limit: int = 160) -> str:
    return clip(printable(str(value)), limit)


def event_text(event: Event) -> str | None:  # noqa: C901 (one branch per event class)
    if isinstance(event, PhaseEntered):
        return f"{event.phase:<20} {event.elapsed:7.1f}s  {_t(event.line, 110)}"
    if isinstance(event, AttemptStarted):
        return f"attempt {event.attempt} (content {event.content_hash[:12]})"
    if isinstance(event, BecameReady):
        return _t(event.message or f"ready after {event.elapsed:.1f}s")
    if isinstance(event, EngineExited):
        return f"engine died ({event.how()}) after {event.elapsed:.1f}s"
    if isinstance(event, (EngineHung, StartupTimedOut)):
        return f"{event.kind} after {event.elapsed:.1f}s"
    if isinstance(event, Diagnosed):
        return f"diagnosis {event.signature or 'unknown'}: {_t(event.summary)}"
    if isinstance(event, Changed):
        return f"changing: {_t(event.reason)}"
    if isinstance(event, Info):
        return _t(event.message, 300)
    if isinstance(event, FollowerExited):
        return f"engine died ({_t(event.message)})"
    if isinstance(event, (Warn, Drift, Problem, RollingBack, Restored, SupervisorLost)):
        return f"{event.kind}: " + _t(event.message, 300)
    if isinstance(event, PortTakenSeen):
        return f"port {event.port} taken by {_t(', '.join(event.holders))}"
    if isinstance(event, StartPredicted):
        return f"predicted: {_t(event.summary, 300)}"
    if isinstance(event, StartSlow):
        return f"slow start: {_t(event.message, 300)}"
    return None


def report_lines(report: dict[str, Any]) -> list[str]:
    """The fleet report (FleetReport.to_json()) for people: a line per replica and the router, then the verdict."""
    lines = [f"{report['name']} ({report['mode']}):"]
    for r in report["replicas"]:
        where = f"r{r['index']}@{r['host']}"
        line = f"  {where:<20} {r['status']:<16} {r['url']}"
        if r.get("error"):
            line += f"  {_t(r['error'], 300)}"
        lines.append(line)
        diag = r.get("diagnosis") or {}
        if diag:
            lines.append(f"  {'':<20} diagnosis {diag.get('signature') or 'unknown'}: {_t(diag.get('summary', ''))}")
        restored = r.get("restored") or {}
        if restored:
            lines.append(f"  {'':<20} previous version {str(restored.get('content_hash'))[:12]} brought back: "
                         f"{restored.get('status')}")
    router = report.get("router")
    if router:
        where = f"router@{router['host']}"
        line = f"  {where:<20} {router['status']:<16} {router.get('url') or ''}"
        if router.get("status") == "ready":
            line += f"  {len(router.get('workers') or [])} workers ({router.get('action')})"
        elif router.get("detail"):
            line += f"  {_t(router['detail'], 300)}"
        lines.append(line)
    for note in report.get("notes") or []:
        lines.append(f"  {_t(note, 300)}")
    for check in (report.get("canary") or {}).get("checks") or []:  # a canary's gates (deployments/fleet/canary_judge.py)
        verdict = {True: "ok", False: "FAILED", None: "not compared"}[check.get("passed")]
        lines.append(f"    {check['name']}: {verdict} ({_t(check.get('note') or '', 200)})")
    ready = sum(1 for r in report["replicas"] if serves(r["status"], r.get("restored")))
    lines.append(f"{report['name']}: {report['status']} ({ready} of {len(report['replicas'])} replicas serving)")
    if (report.get("restart") or {}).get("text"):
        lines.append(f"  each replica: {_t(report['restart']['text'], 300)}")
    return lines
