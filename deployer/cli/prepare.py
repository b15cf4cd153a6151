"""`deploy prepare`: options and output only. Resolves the deployment and calls its `prepare` (deployer.deployments):
the compatibility checks and the managed environment on every host, without launching."""

from __future__ import annotations

import click

from deployer.cli import show
from deployer.cli.load import _load
from deployer.cli.options import _profile_options, _target_options
from deployer.deployments.resolve import for_profile
from deployer.deployments.single.deployment import Origin

__all__ = ["prepare"]


@click.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@_target_options
@click.option("--json", "as_json", is_flag=True, help="NDJSON events on stdout, then the report.")
def prepare(profile: str, overrides: tuple[str, ...], host: str | None, trust_new_host: bool, as_json: bool) -> None:
    """Get every host ready without launching: compatibility checks, then the engine's environment (engine.install)
    built or reused.

    For images and CI: a fleet prepares every replica's host, a node group every node."""
    prof = _load(profile, overrides, host)
    deployment = for_profile(prof, Origin(profile, host, None, trust_new_host, overrides))
    sink = show.progress(deployment, as_json)
    try:
        report = deployment.prepare(sink)
    finally:
        sink.close()
    if as_json:
        show.report_event(report.to_json())
    else:
        click.echo(report.text(), nl=False)
    if report.error is not None:
        raise report.error
