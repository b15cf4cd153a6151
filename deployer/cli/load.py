"""Loading a profile file for a command: unset `${VAR}`s become warnings on stderr where allowed."""

from __future__ import annotations

import click

from deployer.profile.loader import load_profile
from deployer.profile.model import Profile


def _load(path: str, overrides: tuple[str, ...], host: str | None, allow_unset: bool = False) -> Profile:
    """allow_unset (validate, render): an unset `${VAR}` is a warning on stderr; secret values are never needed."""
    prof = load_profile(path, overrides=list(overrides), host=host, allow_unset=allow_unset)
    for unset in prof.unset:
        click.echo(f"warning: {unset.warning()}", err=True)
    return prof
