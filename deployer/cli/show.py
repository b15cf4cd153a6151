"""How each report is shown: JSON (`--json`), or text for people (`text`: deployer.output.text, chosen by the report's
type, never by the kind of deployment), and the progress sink a command's events go to. The text forms of the
reports of the commands that change engines (up, restart, rollback, smoke) are in deployer.output.text_runs, which
adds them to `text` (imported by those commands only: the on-call reads start light)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from deployer.deployments.base import Deployment
from deployer.logtext import line_time
from deployer.output.text import text
from deployer.secrets import mask_data

__all__ = ["emit_json", "fan_out_progress", "log_line_json", "progress", "report_event", "text"]


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def log_line_json(line: str) -> None:
    """`logs --json`: one object per log line, with the line's own time when it has one (ISO, local time)."""
    at = line_time(line)
    when = None if at is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)) + \
        (f".{int(at % 1 * 1000):03d}" if at % 1 else "")
    sys.stdout.write(json.dumps({"line": line, "time": when}) + "\n")
    sys.stdout.flush()


def report_event(data: dict[str, Any]) -> None:
    """The last NDJSON line of an up-like command: the report, masked before JSON escaping (the stdout guard sees
    only the escaped text)."""
    sys.stdout.write(json.dumps({"event": "report", **mask_data(data)}, default=str) + "\n")
    sys.stdout.flush()


def progress(deployment: Deployment, as_json: bool, *, smoke: bool = False) -> Any:
    """NDJSON on stdout; else one prefixed line per member's event (events tagged by member), else the live
    progress of one engine (with a line per smoke phase for `smoke`)."""
    # The sinks are imported here, not at the top: they draw the event classes (deployer.events, the largest
    # import of an on-call command), and the reads (status, top, logs, history) import this module but never
    # send an event (tests/unit/test_cli_lazy.py).
    from deployer.output.console import JsonEvents, LiveProgress, SmokeProgress
    from deployer.output.fleet import FleetProgress

    if as_json:
        return JsonEvents()
    if deployment.tagged_events:
        return FleetProgress()
    return SmokeProgress() if smoke else LiveProgress()


def fan_out_progress(as_json: bool) -> Any:
    """Where the events of a fan-out over several hosts go (a fleet's `down`): NDJSON, or a prefixed line each."""
    from deployer.output.console import JsonEvents   # imported here: see `progress`
    from deployer.output.fleet import FleetProgress

    return JsonEvents() if as_json else FleetProgress()
