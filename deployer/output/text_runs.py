"""The text forms of the reports of the commands that change engines (up, restart, rollback, smoke), added to
deployer.output.text.text by report type; `UP_RESULTS`: the reports an up-like command's failure carries."""

from __future__ import annotations

from typing import Any

import click

from deployer.deployments.fleet.report import FleetReport
from deployer.deployments.fleet.smoke import FleetSmokeReport
from deployer.output.console import print_up_report
from deployer.output.fleet import report_lines
from deployer.output.text import text
from deployer.runner.up import UpReport
from deployer.smoke import SmokeReport

UP_RESULTS = (UpReport, FleetReport)   # what LaunchFailed/PartlyFailed/DiskFull of an up-like command carry


@text.register
def _(report: UpReport, sink: Any = None) -> None:
    print_up_report(report, sink)
    if report.reach is not None and report.status in ("ready", "already-running"):
        for line in report.reach.lines():
            click.echo(line, err=True)


@text.register
def _(report: FleetReport, sink: Any = None) -> None:
    for line in report_lines(report.to_json()):
        click.echo(line, err=True)


@text.register
def _(report: SmokeReport, sink: Any = None) -> None:
    verdict = "ok" if report.ok else f"FAILED (exit {report.exit_code})"
    click.echo(f"smoke {report.name} on {report.host}: {verdict}")
    for p in report.phases.values():
        took = f"{p.duration_s:6.2f}s" if p.status != "skipped" else " " * 7
        click.echo(f"  {p.name:<9} {p.status:<7} {took}  {p.details}")
    if report.answer is not None:
        a = report.answer
        click.echo(f"  answer ({a.model}, {a.latency_ms:.0f} ms): {a.text[:120]!r}")


@text.register
def _(report: FleetSmokeReport, sink: Any = None) -> None:
    verdict = "ok" if report.ok else f"FAILED (exit {report.exit_code})"
    click.echo(f"smoke {report.name} (fleet): {verdict}")
    for c in report.cases:
        took = f"{c.duration_s:6.2f}s" if c.status != "skipped" else " " * 7
        click.echo(f"  {c.phase:<8} {c.member + '@' + c.host:<20} {c.status:<7} {took}  {c.details}")
