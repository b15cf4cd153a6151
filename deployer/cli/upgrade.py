"""`deploy upgrade`: options and output only (deployer.operate.upgrade holds the logic)."""

from __future__ import annotations

from pathlib import Path

import click

from deployer.cli import show
from deployer.cli.load import _load
from deployer.cli.options import _profile_options, _target_options
from deployer.deployments.resolve import for_profile
from deployer.deployments.single.deployment import Origin
from deployer.operate.upgrade.plan import UpgradeOptions
from deployer.operate.upgrade.release import parse_release
from deployer.secrets import mask_data

__all__ = ["upgrade"]


@click.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@_target_options
@click.option("--engine", "release", required=True, default=None, metavar="KIND==VERSION",
              help="The release to move to.")
@click.option("--python", default=None, help="That release's engine python on the target (default: a managed "
                                             "environment, engine.install with the release, built beside the old).")
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the upgraded profile to this file.")
@click.option("--apply", "apply_it", is_flag=True,
              help="Switch the host to the new release, load-check it against the old, switch back when a gate "
                   "(upgrade.gates) fails; a fleet: the canary rollout (rollout.canary) promotes it or rolls back.")
@click.option("--model-config", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A local folder with the model's config.json (else read on the target).")
@click.option("--json", "as_json", is_flag=True)
def upgrade(profile: str, overrides: tuple[str, ...], host: str | None, trust_new_host: bool, release: str,
            python: str | None, save: Path | None, apply_it: bool, model_config: Path | None, as_json: bool) -> None:
    """Move a profile to another release of its engine: flags renamed or dropped, values it resolves differently,
    new follow-on checks and the memory plan on both, each with its source; nothing stops.

    A fleet profile is planned on its first replica's host and its changes carried to the fleet profile.

    Exit 2 when the new release refuses a flag no table explains (never dropped silently). With --apply, exit 6
    when the new release failed a gate and the old one serves again (a fleet: exits as `deploy up --canary`)."""
    prof = _load(profile, overrides, host)
    opts = UpgradeOptions(parse_release(release, prof.engine.kind), python, model_config)
    deployment = for_profile(prof, Origin(profile, host, None, trust_new_host, overrides))
    sink = show.progress(deployment, as_json)
    try:
        done = deployment.upgrade(opts, apply_it, sink)
    finally:
        sink.close()
    if as_json:
        show.report_event(mask_data(done.to_json()))
    else:
        click.echo(done.text(), nl=False)
    if save is not None:   # refused flags: not saved (ProfileError)
        done.save(save)
        click.echo(f"saved the upgraded profile to {save}", err=True)
    done.check(str(opts.release), apply_it)
