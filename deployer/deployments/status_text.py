"""How `status` reads to people, whatever the kind: a host's rows (a block per deployment), a node group's (a block
per node), a fleet's table (a line per replica and the router), and what each block is made of: the last crash, why
the engine is unhealthy, its serving figures, a time as a local date and as "how long ago". Rows in, lines out: the
reports' `lines()` (deployments.reports) call these and deployer.output.text prints them."""

from __future__ import annotations

import time
from typing import Any

from deployer.diagnose.hangkinds import hung_summary, hung_text
from deployer.logtext import shown
from deployer.operate.rows import StatusRow


def row_lines(rows: list[StatusRow]) -> list[str]:
    """A block per deployment: its state, run dir, engine, why it is unhealthy, its last crash and diagnosis, the
    lock, drift and serving figures."""
    if not rows:
        return ["no deployments"]
    lines: list[str] = []
    for row in rows:
        health = "healthy" if row.healthy else "not healthy"
        uptime = f", up {row.uptime_s:.0f}s" if row.uptime_s is not None else ""
        lines.append(f"{row.name}: {row.status} ({health}{uptime}) pid {row.pid} port {row.port} "
                     f"attempt {row.attempt} content {row.content_hash[:12]} restarts {row.restarts}")
        lines.append(f"  run dir {row.run_dir} on {row.host}")
        if row.engine is not None:
            lines.append(f"  engine {row.engine} {row.engine_version or '(version not named)'}, model {row.model}")
        if row.unhealthy is not None:
            lines.append(f"  unhealthy: {unhealthy_text(row.unhealthy)}")
        if row.last_crash is not None and row.last_crash.raw:
            lines.append(f"  last crash: {describe_crash(row.last_crash.to_json())}")
        lines += _diagnosis_lines(row)
        if row.lock:
            lines.append(f"  lock: {row.lock['text']}")
        lines += [f"  drift: {line}" for line in row.drift]
        lines += [f"  {line}" for line in serving_lines(row.metrics)]
    return lines


def _diagnosis_lines(row: StatusRow) -> list[str]:
    diagnosis = row.shown_diagnosis
    if diagnosis is None:
        return []
    lines = [f"  diagnosis: {diagnosis.signature or 'unknown failure'}: {diagnosis.summary}"]
    if diagnosis.hint:
        lines.append(f"  next: {diagnosis.hint}")
    return lines


def node_lines(rows: list[StatusRow]) -> list[str]:
    """A block per node of a group, headed by its rank and role (and whether its crash brought the group down)."""
    lines: list[str] = []
    for row in rows:
        assert row.node is not None
        first = ": its crash came first, the group fell with it" if row.node.first_crash else ""
        lines.append(f"node {row.node.rank} ({row.node.role}){first}:")
        lines += row_lines([row])
        crash = row.node.last_crash_diagnosis
        if crash and crash.raw and not (row.diagnosis and row.diagnosis.raw):
            lines.append(f"  last crash diagnosis: {crash.signature}: {crash.summary}")
    return lines


def fleet_lines(data: dict[str, Any]) -> list[str]:
    """A fleet's table: whether it serves, then a line per replica and the router with its serving figures."""
    lines = [f"{data['name']}: {'serving' if data['serving'] else 'not fully serving'}"]
    rows = [*data["replicas"], *([data["router"]] if data.get("router") else [])]
    for row in rows:
        where = f"{row['member']}@{row.get('alias') or row['host']}"
        health = "healthy" if row.get("healthy") else "not healthy"
        line = f"  {where:<20} {row['status']:<12} {health:<12} {row['url']}"
        if row.get("pid"):
            line += f"  pid {row['pid']} content {str(row.get('content_hash'))[:12]} restarts {row.get('restarts')}"
        if row.get("error"):
            line += f"  {shown(row['error'], 300)}"
        if row.get("in_router") is False and isinstance(row.get("pulled"), dict):
            line += f"  router: {row.get('router_health')}: {_pulled(row['pulled'])}"
        elif row.get("in_router") is False:
            line += f"  router: {row.get('router_health') or 'not healthy'} (not serving through the router; run " \
                    "`deploy up` or `deploy restart` of the fleet to add it back)"
        lines.append(line)
        for url in row.get("foreign_workers") or []:
            lines.append(f"  {'':<20} ALARM: the router routes to {shown(url, 200)}, which is not a replica of this fleet "
                         "(registered by someone else: it receives prompts)")
        lines += [f"  {'':<20} {text}" for text in serving_lines(row.get("metrics"))]
        ready = row.get("readiness")
        if ready:
            lines.append(f"  {'':<20} readiness: {ready.get('healthy_workers')} of {ready.get('total_workers')} "
                         f"workers healthy")
    return lines


def _pulled(pulled: dict[str, Any]) -> str:
    """Why the router's watch holds a replica out, and what comes next."""
    why = shown(pulled.get("reason") or "no engine step", 200)
    if pulled.get("not_back"):
        return f"{why}; {shown(pulled['not_back'])}: `deploy up` or `deploy restart` of the fleet adds it back"
    return f"{why}; added back once it serves again (its supervisor restarts it)"


def serving_lines(metrics: dict[str, Any] | None) -> list[str]:
    """"serving: 2 running, 0 waiting, KV 3.1%; ..." and "gpu memory: 0 70123/143771 MiB" (a status row's serving
    metrics, deployer.operate.serving); nothing when the row has no metrics (not alive, or a node whose engine does
    not serve the API)."""
    if not metrics:
        return []
    lines = [f"serving: {metrics['summary']}" if metrics.get("summary") else
             f"serving: {metrics['error']}" if metrics.get("off") else
             f"serving: no metrics ({metrics.get('error') or 'none read'})"]
    gpus = metrics.get("gpu_memory")
    if gpus:
        lines.append("gpu memory: " + ", ".join(f"GPU {g['index']} {g['used_mib']}/{g['total_mib']} MiB" for g in gpus))
    return lines


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
    ago_s = max((time.time() if now is None else now) - at, 0)
    return f"{how} at {when(at)} ({ago(ago_s)} ago)"


def when(at: float) -> str:
    """A time as a local date: "2026-12-06 03:02:07 UTC"."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))


def ago(seconds: float) -> str:
    """A duration in its largest whole unit: "45s", "12m", "5h", "3d"."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
