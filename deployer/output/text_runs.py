"""The text form of the report of the commands that change engines (up, restart, rollback), added to
deployer.output.text.text by report type: it draws through the live sink (a smoke's and a fleet's reports render
themselves: `lines()`); `is_up_result`: whether a failure carries an up-like command's report."""

from __future__ import annotations

from typing import Any

import click

from deployer.output.console import print_up_report
from deployer.output.text import text
from deployer.runner.up import UpReport


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
