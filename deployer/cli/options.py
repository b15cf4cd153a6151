"""Options and helpers shared by the commands: profile and target options, JSON output (loading a profile is
deployer.cli.load: the commands on a name never import the profile loader)."""

from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

import click

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


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
