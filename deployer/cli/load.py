"""Loading a profile file for a command: unset `${VAR}`s become warnings on stderr where allowed, and a value the
environment's defaults (DEPLOYER_HOST, ...) set is said."""

from __future__ import annotations

import click

from deployer.profile.loader import load_profile
from deployer.profile.model import Profile
from deployer.local.settings import KEYS


def _load(path: str, overrides: tuple[str, ...], host: str | None, allow_unset: bool = False) -> Profile:
    """allow_unset (validate, render): an unset `${VAR}` is a warning on stderr; secret values are never needed."""
    prof = load_profile(path, overrides=list(overrides), host=host, allow_unset=allow_unset)
    for unset in prof.unset:
        click.echo(f"warning: {unset.warning()}", err=True)
    for key in KEYS:  # a default from the environment outranks the profile's own value: never silently
        source, _ = prof.written(key.field)
        if source is not None and source.startswith("env "):
            click.echo(f"note: {key.field} from {source[4:]} (the environment outranks the profile)", err=True)
    return prof
