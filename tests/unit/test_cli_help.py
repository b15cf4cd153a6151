"""`deploy CMD --help` (issue 24): every option of every command has help text, and every command ends its help
with example lines that name only options it has."""

from __future__ import annotations

import shlex

import click
import pytest
from click.testing import CliRunner

from deployer.cli.main import COMMANDS, EXAMPLES, cli


def commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(cli)
    out: list[tuple[str, click.Command]] = []

    def walk(group: click.Group, prefix: str) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            path = f"{prefix}{name}"
            out.append((path, command))
            if isinstance(command, click.Group):
                walk(command, path + " ")

    walk(cli, "")
    return out


ALL = commands()


@pytest.mark.parametrize("path,command", ALL, ids=[p for p, _ in ALL])
def test_every_option_has_help(path: str, command: click.Command) -> None:
    missing = [p.opts[0] for p in command.params if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert missing == [], f"deploy {path}: options without help: {missing}"


@pytest.mark.parametrize("path,command", ALL, ids=[p for p, _ in ALL])
def test_every_command_shows_examples_it_can_run(path: str, command: click.Command) -> None:
    shown = CliRunner().invoke(cli, [*path.split(), "--help"], prog_name="deploy")
    assert shown.exit_code == 0, shown.output
    assert "Examples:" in shown.output, f"deploy {path} --help shows no example"
    lines = EXAMPLES[path]
    assert lines and all(f"    {line}" in shown.output for line in lines)
    for line in lines:
        words = shlex.split(line.split(">")[0])
        assert words[:1 + len(path.split())] == ["deploy", *path.split()] or isinstance(command, click.Group), line
        if isinstance(command, click.Group):
            continue
        known = {opt for p in command.params for opt in p.opts} | set(getattr(command, "pair_options", ()))
        unknown = [w for w in words if w.startswith("-") and w not in known]
        assert unknown == [], f"{line}: deploy {path} has no {unknown}"


def test_every_command_is_covered() -> None:
    assert set(COMMANDS) <= {p for p, _ in ALL} and set(EXAMPLES) == {p for p, _ in ALL}
