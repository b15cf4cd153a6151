"""`deploy --help` grouped by what a person is doing (issue 36): every command the group registers is listed in
exactly one section, and every summary is shown whole on its command's line on an 80-column terminal (never cut
with "...")."""

from __future__ import annotations

from collections import Counter

import click
from click.testing import CliRunner

from deployer.cli.main import cli
from deployer.cli.sections import HELP_WIDTH, SECTIONS, summaries


def registered() -> list[str]:
    return cli.list_commands(click.Context(cli))


def shown_help() -> str:
    result = CliRunner().invoke(cli, ["--help"], prog_name="deploy", terminal_width=HELP_WIDTH)
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_in_exactly_one_section() -> None:
    counts = Counter(name for rows in SECTIONS.values() for name, _ in rows)
    twice = sorted(name for name, n in counts.items() if n > 1)
    missing = sorted(set(registered()) - set(counts))
    unknown = sorted(set(counts) - set(registered()))
    assert twice == [] and missing == [] and unknown == [], (
        f"deployer/cli/sections.py SECTIONS: listed twice {twice}, in no section {missing}, not a command {unknown}")


def test_help_lists_each_command_under_its_section_with_its_whole_summary() -> None:
    out = shown_help()
    lines = out.splitlines()
    assert "Other:" not in lines and "Commands:" not in lines, out
    for title, rows in SECTIONS.items():
        start = lines.index(f"{title}:")
        block = lines[start + 1:start + 1 + len(rows)]
        for (name, summary), line in zip(rows, block):
            words = line.split(None, 1)
            assert words == [name, summary], f"{title}: {line!r} is not {name} and its whole summary {summary!r}"


def test_no_summary_is_cut_or_wrapped_on_an_80_column_terminal() -> None:
    out = shown_help()
    width = max(len(name) for name in summaries())
    for name, summary in summaries().items():
        assert "\n" not in summary and not summary.endswith(("...", "\u2026")), name
        assert len(f"  {name.ljust(width)}  {summary}") <= HELP_WIDTH, f"{name}: summary too long for one line"
        assert f"  {name.ljust(width)}  {summary}\n" in out, f"{name}: its summary is not shown whole on one line"
    assert "..." not in out.split("Options:", 1)[1] and "\u2026" not in out
