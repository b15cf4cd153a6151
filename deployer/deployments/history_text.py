"""How `history` and `diagnose` read to people: an attempt per line (with its phases and what the hang rule saw), a
recorded timeline as one line, a diagnosis with the run it is of and the remedy it proposes. Records in, lines out:
the reports' `lines()` (deployments.reports) call these and deployer.output.text prints them."""

from __future__ import annotations

import json
import time
from typing import Any

from deployer.deployments.status_text import ago, when
from deployer.diagnose.hangkinds import hung_text
from deployer.operate.rows import HistoryEntry


def history_lines(entries: list[HistoryEntry]) -> list[str]:
    """An attempt (or lock event) per line, newest first: the current one starred."""
    lines: list[str] = []
    for row in entries:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started_at)) if row.started_at else "?"
        if row.lock:
            lines.append(f"  {at}  {row.outcome:<34} {row.detail}")
            continue
        current = "*" if row.current else " "
        outcome = row.outcome or "unfinished"  # an `up` interrupted (or still running) never recorded one
        change = f"  -> {row.change}" if row.change else ""
        where = f"{row.where}  " if row.where else ""
        lines.append(f"{current} {at}  {where}{row.run_id:<34} {row.content_hash[:12]}  "
                     f"attempt {row.attempt}  {outcome:<10} {row.signature}{change}")
        phases = timeline_text(row.raw.get("timeline"))
        if phases:
            lines.append(f"    phases: {phases}")
        if isinstance(row.raw.get("hung"), dict):
            lines.append(f"    {hung_text(row.raw['hung'])}")
            lines += [f"      {line}" for line in row.raw["hung"].get("top") or []]
    return lines


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


def diagnosis_lines(data: dict[str, Any]) -> list[str]:
    """A diagnosis for people: the run it is of, the engine, signature, summary, evidence, what to do next, the
    remedy (or what a retry would change) and the traceback."""
    lines = run_lines(data)
    engine = data.get("engine")
    if isinstance(engine, dict):
        lines.append(f"engine:    {engine.get('kind') or 'unknown'} ({engine.get('how')})")
    lines.append(f"signature: {data.get('signature') or 'none (unknown failure)'}")
    lines.append(f"summary:   {data.get('summary')}")
    lines.append(f"transient: {'yes' if data.get('transient') else 'no (retrying unchanged is pointless)'}")
    lines += [f"evidence:  {line}" for line in data.get("evidence") or []]
    if data.get("hint"):
        lines.append(f"next:      {data['hint']}")
    for label, change in (("remedy:   ", data.get("remedy")), ("would do:", data.get("would_change"))):
        lines += [f"{label} {line}" for line in change_lines(change)]
    if data.get("traceback"):
        lines += ["traceback:", str(data["traceback"])]
    return lines


def run_lines(data: dict[str, Any]) -> list[str]:
    """Which run a deployment's diagnosis is of, when it failed, and how the deployment is now (the failure may
    be an old run's while the current one serves)."""
    if not data.get("run_id"):
        return []
    at = data.get("failed_at")
    failed = f" at {when(at)} ({ago(max(time.time() - at, 0))} ago)" if isinstance(at, (int, float)) else ""
    lines = [f"run:       {data['run_id']} failed{failed}"]
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
