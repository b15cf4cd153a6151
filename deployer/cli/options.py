"""Options and helpers shared by the commands: profile and target options, loading a profile, JSON output."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

if TYPE_CHECKING:
    from deployer.profile.model import Profile

F = TypeVar("F", bound=Callable[..., Any])


def _profile_options(func: F) -> F:
    func = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                        help="Override a profile field, e.g. engine.args.tp_size=2 (repeatable).")(func)
    func = click.option("--host", default=None, metavar="[USER@]HOST[:PORT]",
                        help="Deploy to this host instead of the profile's target.host.")(func)
    return func


def _target_options(func: F) -> F:
    func = click.option("--trust-new-host", is_flag=True,
                        help="Record the key of a host not yet in known_hosts (never a changed key).")(func)
    return func


def _load(path: str, overrides: tuple[str, ...], host: str | None, allow_unset: bool = False) -> Profile:
    """allow_unset (validate, render): an unset `${VAR}` is a warning on stderr; secret values are never needed."""
    from deployer.profile.loader import load_profile

    prof = load_profile(path, overrides=list(overrides), host=host, allow_unset=allow_unset)
    for unset in prof.unset:
        click.echo(f"warning: {unset.warning()}", err=True)
    return prof


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
