"""Commands on a running deployment (logs, down; status: deployer.cli.status): options and output only. Each
resolves its deployment (deployer.deployments) and calls one method of it; deployer.cli.show prints the report."""

from __future__ import annotations

import re

import click

from deployer.cli import show
from deployer.cli.options import NODE, _target_options
from deployer.deployments.status_text import describe_crash
from deployer.deployments.base import DownOptions, LogOptions, Select
from deployer.deployments.resolve import READ, STOP, resolve
from deployer.errors import PartlyFailed
from deployer.logtext import parse_since

__all__ = ["describe_crash", "down", "logs"]

LINES, FILTERED_LINES = 50, 2000


def _regex(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise click.BadParameter(f"not a regular expression: {exc}") from None
    return value


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_since(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.argument("target")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", default=None, type=click.IntRange(1, 100000),
              help=f"Lines from the log's end to show or to filter [default: {LINES}; {FILTERED_LINES} with "
                   "--grep or --since].")
@click.option("--previous", is_flag=True, help="The log of the attempt before the current one.")
@click.option("--replica", type=click.IntRange(0, 10000), default=None,
              help="Fleet profile: the log of replica N (0-based, the order of `replicas:`).")
@click.option("--router", "router", is_flag=True, help="Fleet profile: the router's log.")
@click.option("--grep", default=None, metavar="REGEX", callback=_regex,
              help="Only the lines this regular expression matches (after secrets are masked).")
@click.option("--since", default=None, metavar="WHEN", callback=_since,
              help="Only the lines logged since: a duration back (90s, 10m, 2h, 1d) or a local time "
                   "(2026-12-01 04:02); a line with no time of its own goes with the line before it.")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object per line: {"line": ..., "time": ISO time or null}.')
@NODE
def logs(target: str, host: str | None, workdir: str | None, trust_new_host: bool, follow: bool,
         lines: int | None, previous: bool, replica: int | None, router: bool, grep: str | None,
         since: float | None, as_json: bool, node: int | None) -> None:
    """Print the engine log of the current (or previous) attempt (a fleet: of --replica N, --host H or --router;
    a multi-node profile: of --node N)."""
    deployment = resolve(target, host, workdir, trust_new_host=trust_new_host,
                         select=Select(node=node, replica=replica, router=router), mode=READ)
    window = lines or (FILTERED_LINES if grep is not None or since is not None else LINES)
    opts = LogOptions(lines=window, follow=follow, previous=previous, grep=grep, since=since)
    deployment.logs(opts, show.log_line_json if as_json else click.echo)


@click.command()
@click.argument("target")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--grace", type=float, default=None, help="Seconds between SIGTERM and SIGKILL.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--break-lock", is_flag=True,
              help="Take the deployment lock even if another operation holds it (recorded in the history).")
@NODE
def down(target: str, host: str | None, workdir: str | None, trust_new_host: bool, grace: float | None,
         as_json: bool, break_lock: bool, node: int | None) -> None:
    """Stop a deployment gracefully (idempotent: 'not running' is success)."""
    deployment = resolve(target, host, workdir, trust_new_host=trust_new_host, select=Select(node=node), mode=STOP)
    opts = DownOptions(grace=grace, break_lock=break_lock, notify=lambda m: click.echo(f"warning: {m}", err=True),
                       emit=show.fan_out_progress(as_json))
    try:
        report = deployment.down(opts)
    except PartlyFailed as exc:
        if as_json and isinstance(exc.outcome, dict):
            show.emit_json(exc.outcome)
        raise
    if as_json:
        show.emit_json(report.to_json())
    else:
        show.text(report)
