"""Options and helpers shared by the commands: profile and target options, JSON output (loading a profile is
deployer.cli.load: the commands on a name never import the profile loader)."""

from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


# The help of an option many commands share, where a command gives none of its own (filled in as the command is
# loaded: deployer.cli.main.LazyGroup); `{cmd}` is the command's name.
STANDARD_HELP: dict[str, str] = {
    "host": "The target box: [USER@]HOST[:PORT] or an ~/.ssh/config alias.",
    "workdir": "deployer's folder on the target (default: the profile's target.workdir, else /workspace/deployer).",
    "lines": "How many lines from the end of the log.",
    "as_json": "Print JSON instead of text: its shape for `deploy {cmd}` is in docs/json.md.",
}


def fill_help(command: click.Command, name: str) -> None:
    """Give every shared option without help its standard text (for `deploy CMD --help`)."""
    for param in command.params:
        if isinstance(param, click.Option) and not param.help and param.name in STANDARD_HELP:
            param.help = STANDARD_HELP[param.name].format(cmd=name)


def with_examples(command: click.Command, lines: list[str]) -> None:
    """End the command's --help with its examples (each kept on its own line)."""
    if lines and not command.epilog:
        command.epilog = "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


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


NODE = click.option("--node", type=click.IntRange(0, 4096), default=None,
                    help="One node of a multi-node (nodes:) profile: its node_rank.")


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
