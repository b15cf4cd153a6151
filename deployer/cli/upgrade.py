"""`deploy upgrade`: options and output only (deployer.oncall.upgrade holds the logic)."""

from __future__ import annotations

from pathlib import Path

import click

from deployer.cli.load import _load
from deployer.cli.options import _emit_json, _profile_options, _target_options
from deployer.errors import ProfileError
from deployer.events import Event
from deployer.oncall.upgrade.plan import UpgradeOptions, upgrade_plan
from deployer.oncall.upgrade.release import parse_release
from deployer.oncall.upgrade.save import save_upgraded
from deployer.secrets import mask_data

__all__ = ["upgrade"]


def _quiet(_event: Event) -> None:
    return None


@click.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@_target_options
@click.option("--engine", "release", required=True, default=None, metavar="KIND==VERSION", help="The release to move to.")
@click.option("--python", default=None, help="That release's engine python on the target (default: a managed "
                                             "environment, engine.install with the release, built beside the old).")
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the upgraded profile to this file.")
@click.option("--model-config", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A local folder with the model's config.json (else read on the target).")
@click.option("--json", "as_json", is_flag=True)
def upgrade(profile: str, overrides: tuple[str, ...], host: str | None, trust_new_host: bool, release: str,
            python: str | None, save: Path | None, model_config: Path | None, as_json: bool) -> None:
    """Move a profile to another release of its engine: flags renamed or dropped, values it resolves differently,
    new follow-on checks and the memory plan on both, each with its source; nothing stops.

    Exit 2 when the new release refuses a flag no table explains (never dropped silently)."""
    prof = _load(profile, overrides, host)
    opts = UpgradeOptions(parse_release(release, prof.engine.kind), python, model_config)
    plan = upgrade_plan(prof, opts, trust_new_host, _quiet)
    if as_json:
        _emit_json(mask_data(plan.to_json()))
    else:
        click.echo(plan.text(), nl=False)
    if save is not None:
        save_upgraded(plan, prof, save, python)
        click.echo(f"saved the upgraded profile to {save}", err=True)
    if plan.comparison.refused:
        raise ProfileError(f"the upgrade to {opts.release} is refused: {plan.comparison.refused[0].line()}")
