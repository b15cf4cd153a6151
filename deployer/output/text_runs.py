"""The text forms of the reports of the commands that change engines (up, restart, rollback, smoke), added to
deployer.output.text.text by report type (a fleet's reports render themselves: FleetReport.lines()); `is_up_result`:
whether a failure carries an up-like command's report."""

from __future__ import annotations

from typing import Any

import click

from deployer.output.console import print_up_report
from deployer.output.text import text
from deployer.runner.up import UpReport
from deployer.smoke import SmokeReport


def is_up_result(outcome: Any) -> bool:
    """Whether what LaunchFailed/PartlyFailed/DiskFull carry is an up-like command's report (a host's or a node
    group's UpReport, a fleet's FleetReport: imported only then, a single host's `up` never loads the fleet's)."""
    if isinstance(outcome, UpReport):
        return True
    from deployer.deployments.fleet.report import FleetReport

    return isinstance(outcome, FleetReport)


@text.register
def _(report: UpReport, sink: Any = None) -> None:
    print_up_report(report, sink)
    if report.reach is not None and report.status in ("ready", "already-running"):
        for line in report.reach.lines():
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
