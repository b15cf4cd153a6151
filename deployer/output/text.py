"""The text forms of reports for people (never chosen by the kind of deployment): `text(report)` prints one. A report
that renders itself (`lines()`, deployments.reports.Renders: status, history, diagnosis, ls, down, prune, config,
smoke, a fleet's up) prints its lines; what depends on the terminal keeps a form here, by type: plan's memory picture
(its width); up's live report (deployer.output.text_runs, imported by the commands that change engines only: the
on-call reads start light). `--json` prints `report.to_json()` instead (deployer.cli.show)."""

from __future__ import annotations

import sys
from functools import singledispatch
from typing import Any

import click

from deployer.deployments.reports import PlanReport, Renders
from deployer.output.edge import terminal_width
from deployer.output.memory import allocated_lines, budget_lines


@singledispatch
def text(report: Any, sink: Any = None) -> None:
    """Print a report for people: one that renders itself (`lines()`, on stderr when its `text_on_stderr`: a
    fleet's reports, which need no import here) prints its lines; the others their form registered below."""
    if not callable(getattr(report, "lines", None)):
        raise TypeError(f"no text form for {type(report).__name__}")
    rendered: Renders = report
    for line in rendered.lines():
        click.echo(line, err=bool(getattr(report, "text_on_stderr", False)))


@text.register
def _(report: PlanReport, sink: Any = None) -> None:
    click.echo(report.text, nl=False)
    picture = report.picture
    if picture is not None:
        width = terminal_width(sys.stdout)
        drawn = budget_lines(picture.gpus, width, sys.stdout.isatty()) if picture.gpus else []
        for line in drawn + allocated_lines(picture.estimate, picture.allocated, picture.run_id):
            click.echo(line)
