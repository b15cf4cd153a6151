"""A fleet's status table for people (`deploy status` of a fleet): one line per replica and the router, with its
serving figures. Apart from deployer.output.fleet (the live event lines) so that the on-call reads do not import
the event classes (tests/unit/test_cli_lazy.py)."""

from __future__ import annotations

from typing import Any

from deployer.logtext import shown
from deployer.output.serving import serving_lines




def status_lines(data: dict[str, Any]) -> list[str]:
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
