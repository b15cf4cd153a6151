"""The text forms of reports for people (never chosen by the kind of deployment): `text(report)` prints one. A report
that renders itself (`lines()`: down's, prune's, config's, a fleet's up and smoke) prints its lines; the read
commands' other reports have their form here, by type; the reports of the commands that change engines (up, restart,
rollback, smoke) are added by deployer.output.text_runs (imported by those commands only: the on-call reads start
light). `--json` prints `report.to_json()` instead (deployer.cli.show)."""

from __future__ import annotations

import json
import sys
import time
from functools import singledispatch
from typing import Any

import click

from deployer.diagnose.hangkinds import hung_summary, hung_text
from deployer.deployments.known import KnownReport
from deployer.deployments.reports import (DiagnosisReport, FleetStatus, HistoryReport, HostStatus, NodeStatus,
                                          PlanReport, StatusRow)
from deployer.output.edge import terminal_width
from deployer.output.memory import allocated_lines, budget_lines
from deployer.output.fleet_status import status_lines
from deployer.output.serving import serving_lines


@singledispatch
def text(report: Any, sink: Any = None) -> None:
    """Print a report for people: one that renders itself (`lines()`, on stderr when its `text_on_stderr`: a
    fleet's reports, which need no import here) prints its lines; the others their form registered below."""
    lines = getattr(report, "lines", None)
    if not callable(lines):
        raise TypeError(f"no text form for {type(report).__name__}")
    for line in lines():
        click.echo(line, err=bool(getattr(report, "text_on_stderr", False)))


@text.register
def _(report: HostStatus, sink: Any = None) -> None:
    print_status(report.rows)


@text.register
def _(report: NodeStatus, sink: Any = None) -> None:
    for row in report.rows:
        assert row.node is not None
        first = ": its crash came first, the group fell with it" if row.node.first_crash else ""
        click.echo(f"node {row.node.rank} ({row.node.role}){first}:")
        print_status([row])
        crash = row.node.last_crash_diagnosis
        if crash and crash.raw and not (row.diagnosis and row.diagnosis.raw):
            click.echo(f"  last crash diagnosis: {crash.signature}: {crash.summary}")


@text.register
def _(report: FleetStatus, sink: Any = None) -> None:
    for line in status_lines(report.data):
        click.echo(line)


@text.register
def _(report: HistoryReport, sink: Any = None) -> None:
    for row in report.entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started_at)) if row.started_at else "?"
        if row.lock:
            click.echo(f"  {when}  {row.outcome:<34} {row.detail}")
            continue
        current = "*" if row.current else " "
        outcome = row.outcome or "unfinished"  # an `up` interrupted (or still running) never recorded one
        change = f"  -> {row.change}" if row.change else ""
        where = f"{row.where}  " if row.where else ""
        click.echo(f"{current} {when}  {where}{row.run_id:<34} {row.content_hash[:12]}  "
                   f"attempt {row.attempt}  {outcome:<10} {row.signature}{change}")
        phases = timeline_text(row.raw.get("timeline"))
        if phases:
            click.echo(f"    phases: {phases}")
        if isinstance(row.raw.get("hung"), dict):
            click.echo(f"    {hung_text(row.raw['hung'])}")
            for line in row.raw["hung"].get("top") or []:
                click.echo(f"      {line}")


@text.register
def _(report: DiagnosisReport, sink: Any = None) -> None:
    data = report.data
    for line in run_lines(data):
        click.echo(line)
    engine = data.get("engine")
    if isinstance(engine, dict):
        click.echo(f"engine:    {engine.get('kind') or 'unknown'} ({engine.get('how')})")
    click.echo(f"signature: {data.get('signature') or 'none (unknown failure)'}")
    click.echo(f"summary:   {data.get('summary')}")
    click.echo(f"transient: {'yes' if data.get('transient') else 'no (retrying unchanged is pointless)'}")
    for line in data.get("evidence") or []:
        click.echo(f"evidence:  {line}")
    if data.get("hint"):
        click.echo(f"next:      {data['hint']}")
    for label, change in (("remedy:   ", data.get("remedy")), ("would do:", data.get("would_change"))):
        for line in change_lines(change):
            click.echo(f"{label} {line}")
    if data.get("traceback"):
        click.echo("traceback:")
        click.echo(data["traceback"])


def run_lines(data: dict[str, Any]) -> list[str]:
    """Which run a deployment's diagnosis is of, when it failed, and how the deployment is now (the failure may
    be an old run's while the current one serves)."""
    if not data.get("run_id"):
        return []
    at = data.get("failed_at")
    when = f" at {_when(at)} ({_ago(max(time.time() - at, 0))} ago)" if isinstance(at, (int, float)) else ""
    lines = [f"run:       {data['run_id']} failed{when}"]
    now = data.get("now")
    if isinstance(now, dict):
        if now.get("run_id") == data["run_id"]:
            state = "this is the current run"
        else:
            state = f"the current run is {now.get('run_id')}"
        health = "healthy now" if now.get("healthy") else f"{now.get('status')}, not healthy now"
        lines.append(f"now:       {state}: {health}" + (" (the failure above is history)"
                                                           if now.get("healthy") else ""))
    return lines


def change_lines(change: Any) -> list[str]:
    """A remedy (`{"args": ..., "env": ..., "reason": ...}`) as lines for people: why, then each profile
    change with the engine flag it becomes."""
    if not isinstance(change, dict):
        return []
    lines = [str(change["reason"])] if change.get("reason") else []
    for key, value in (change.get("args") or {}).items():
        flag = "--" + str(key).replace("_", "-")
        if value is None:
            lines.append(f"  remove engine.args.{key} ({flag})")
        elif value is True:
            lines.append(f"  set engine.args.{key}: true ({flag})")
        else:
            lines.append(f"  set engine.args.{key}: {json.dumps(value)} ({flag} {value})")
    for name, value in (change.get("env") or {}).items():
        lines.append(f"  unset engine.env.{name}" if value is None else f"  set engine.env.{name}={value}")
    return lines


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))


@text.register
def _(report: KnownReport, sink: Any = None) -> None:
    if not report.rows:
        if not report.nothing_found:  # `ls --host` said on stderr where it looked
            click.echo("no deployments in the local history (deploy up records them)")
        return
    head = ["NAME", "HOST", "WORKDIR", "VERSION", "STATE", "WHEN"] + (["NOW"] if report.live else [])
    table = [head] + [_known_cells(row, report.live) for row in report.rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for cells in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())


def _known_cells(row: dict[str, Any], live: bool) -> list[str]:
    at = row.get("at")
    when = f"{_when(at)} ({_ago(max(time.time() - at, 0))} ago)" if isinstance(at, (int, float)) else "?"
    cells = [str(row["name"]), str(row["host"]), str(row["workdir"]), str(row.get("version") or "")[:12],
             str(row.get("state")), when]
    if live:
        now = row.get("live") or {}
        cells.append(f"unknown: {now['error']}" if now.get("error") else
                     f"{now.get('status')} ({'healthy' if now.get('healthy') else 'not healthy'})")
    return cells


@text.register
def _(report: PlanReport, sink: Any = None) -> None:
    click.echo(report.text, nl=False)
    picture = report.picture
    if picture is not None:
        width = terminal_width(sys.stdout)
        drawn = budget_lines(picture.gpus, width, sys.stdout.isatty()) if picture.gpus else []
        for line in drawn + allocated_lines(picture.estimate, picture.allocated, picture.run_id):
            click.echo(line)


def timeline_text(data: Any) -> str:
    """An attempt's recorded timeline as one line: "start 2.1s, load 12s, ... -> ready at 1m05s" ("" without one,
    or for a record this release cannot read)."""
    # imported here: the timeline module (an enum and nine frozen dataclasses, ~4 ms, more under load) is read only
    # by `history`'s text, and every on-call read imports this module (tests/unit/test_cli_lazy.py)
    from deployer.observe.timeline import Timeline, duration_text

    if not isinstance(data, dict):
        return ""
    try:
        timeline = Timeline.from_json(data)
    except (KeyError, TypeError, ValueError):
        return ""
    parts = [f"{r.phase.label} {duration_text(r.duration_s)}" for r in timeline.phases]
    end = f" -> ready at {duration_text(timeline.ready_s)}" if timeline.ready_s is not None else ""
    return ", ".join(parts) + end


def print_status(rows: list[StatusRow]) -> None:
    if not rows:
        click.echo("no deployments")
    for row in rows:
        health = "healthy" if row.healthy else "not healthy"
        uptime = f", up {row.uptime_s:.0f}s" if row.uptime_s is not None else ""
        click.echo(f"{row.name}: {row.status} ({health}{uptime}) pid {row.pid} port {row.port} "
                   f"attempt {row.attempt} content {row.content_hash[:12]} restarts {row.restarts}")
        click.echo(f"  run dir {row.run_dir} on {row.host}")
        if row.engine is not None:
            click.echo(f"  engine {row.engine} {row.engine_version or '(version not named)'}, model {row.model}")
        if row.unhealthy is not None:
            click.echo(f"  unhealthy: {unhealthy_text(row.unhealthy)}")
        if row.last_crash is not None and row.last_crash.raw:
            click.echo(f"  last crash: {describe_crash(row.last_crash.to_json())}")
        diagnosis = row.shown_diagnosis
        if diagnosis is not None:
            click.echo(f"  diagnosis: {diagnosis.signature or 'unknown failure'}: {diagnosis.summary}")
            if diagnosis.hint:
                click.echo(f"  next: {diagnosis.hint}")
        if row.lock:
            click.echo(f"  lock: {row.lock['text']}")
        for line in row.drift:
            click.echo(f"  drift: {line}")
        for line in serving_lines(row.metrics):
            click.echo(f"  {line}")


def unhealthy_text(unhealthy: dict[str, Any]) -> str:
    """The supervisor's `unhealthy` record for people: why its last one-token probe failed, and the load then; or
    who answers on the engine's port instead of it (status's squatter record)."""
    if unhealthy.get("holders"):
        return str(unhealthy.get("reason"))
    running, waiting = unhealthy.get("running"), unhealthy.get("waiting")
    if isinstance(running, (int, float)) and isinstance(waiting, (int, float)):
        load = f"{running:g} running, {waiting:g} waiting"
        load += " (under load: not restarted)" if running or waiting else f" ({unhealthy.get('failures')} in a row)"
    else:
        load = f"load unknown ({unhealthy.get('failures')} in a row)"
    return f"no token from the one-token probe: {unhealthy.get('reason')}; {load}"


def describe_crash(crash: Any, now: float | None = None) -> str:
    """The supervisor's last_crash record for people: how the engine ended, when (local time) and how long ago."""
    if not isinstance(crash, dict):
        return str(crash)
    if crash.get("signal"):
        how = f"killed by {crash.get('signal_name') or 'signal ' + str(crash['signal'])}"
    elif crash.get("exit_code") is not None:
        how = f"exited with code {crash['exit_code']}"
    else:
        how = "ended"
    hung = hung_summary(crash)
    if hung is not None:  # ended by the hang rule (issue 37): what it saw and where the stacks say it waits
        how = f"{hung_text(hung)}; then {how}"
    at = crash.get("at")
    if not isinstance(at, (int, float)):
        return how
    ago = max((time.time() if now is None else now) - at, 0)
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))
    return f"{how} at {when} ({_ago(ago)} ago)"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
