"""Commands on what this machine knows (ls, config): options and output only; each calls one function of
deployer.deployments.known and deployer.cli.show prints the report."""

from __future__ import annotations

import click

from deployer.cli import show
from deployer.cli.options import _target_options
from deployer.deployments.known import deployments_on, effective_settings, known_deployments


@click.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="The rows as one JSON list.")
@click.option("--live", is_flag=True, help="Also ask each host for the deployment's state now.")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]",
              help="Ask this host what it has now, under --workdir (or the default) and every workdir the local "
                   "history knows there.")
@click.option("--workdir", default=None, help="With --host: a workdir to look under besides the local history's.")
@_target_options
def ls(as_json: bool, live: bool, host: str | None, workdir: str | None, trust_new_host: bool) -> None:
    """The deployments this machine knows (its local history), across hosts: host, workdir, last version, state.

    \b
    Examples:
      deploy ls
      deploy ls --live --json
      deploy ls --host gpu-box
    """
    if workdir is not None and host is None:
        raise click.UsageError("--workdir needs --host (without it ls lists the local history)")
    report = known_deployments(live=live) if host is None else deployments_on(host, workdir, trust_new_host)
    if report.nothing_found:
        click.echo(f"deploy: {report.nothing_found}", err=True)
    if as_json:
        show.emit_json(report.to_json())
    else:
        show.text(report)


@click.command(name="config")
@click.argument("profile", required=False, type=click.Path(dir_okay=False))
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]", help="As a command given --host would take it.")
@click.option("--workdir", default=None, help="As a command given --workdir would take it.")
@click.option("--json", "as_json", is_flag=True, help="The settings as one JSON object.")
def config(profile: str | None, host: str | None, workdir: str | None, as_json: bool) -> None:
    """The effective default host, workdir and engine python, and where each came from.

    Precedence: command line > environment (DEPLOYER_HOST, DEPLOYER_WORKDIR, DEPLOYER_ENGINE_PYTHON) > profile >
    config file ($XDG_CONFIG_HOME/deployer/config.yaml) > built-in.

    \b
    Examples:
      deploy config
      deploy config profiles/qwen36-mtp.yaml --json
    """
    report = effective_settings(profile, host, workdir)
    if as_json:
        show.emit_json(report.to_json())
    else:
        show.text(report)
