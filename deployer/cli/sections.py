"""`deploy --help` grouped by what a person is doing: the sections, each command's one-line summary, and the click
group that lists its commands under them (help formatting only: no command behaves differently).

Every command the group registers is in exactly one section, and every summary is shown whole on an 80-column
terminal, never cut with "..." (tests/unit/test_cli_sections.py). The summaries are short on purpose: the whole
first paragraph of a command's help stays in `deploy CMD --help` (deployer.cli.main.COMMANDS).
"""

from __future__ import annotations

import click

# The narrowest terminal a summary must fit on one line of, beside the longest command name (click's help is at
# most 80 columns wide): 2 spaces of indent, the name, 2 spaces, the summary.
HELP_WIDTH = 80

# section title -> (command, its one-line summary), in the order a person meets them
SECTIONS: dict[str, list[tuple[str, str]]] = {
    "Deploy": [
        ("validate", "Check a profile offline; list every problem at once."),
        ("render", "Print the launch script a profile renders to."),
        ("plan", "Preflight on the box, launching nothing: GPUs, flags, memory."),
        ("prepare", "Build the engine's environment and fetch weights, no launch."),
        ("up", "Render, push, start and watch; heal known failures and retry."),
        ("down", "Stop a deployment gracefully."),
        ("upgrade", "Move a profile to another engine release: what changes, why."),
    ],
    "Observe": [
        ("status", "State, health and serving; exit 0 only while it serves."),
        ("top", "A live view per engine: requests, tokens/s, KV cache, p99."),
        ("logs", "The engine log of the current (or previous) attempt."),
        ("history", "Every attempt: when, version, outcome, diagnosis, change."),
        ("dashboard", "A local web page of deployments: state, attempts, log."),
        ("ls", "The deployments this machine knows, across hosts."),
    ],
    "On call": [
        ("diagnose", "The first traceback of a failure, what it is, the fix."),
        ("restart", "Stop and start the last good version, watched and healed."),
        ("rollback", "Back to the newest other version that reached ready."),
        ("smoke", "CI check: deploy, one real chat completion, stop."),
        ("prune", "Delete old run dirs and the env files no rollback needs."),
    ],
    "Export": [
        ("export", "Kubernetes manifests or Prometheus targets from a profile."),
    ],
    "Setup": [
        ("config", "The effective default host, workdir and engine python."),
        ("schema", "Print the profile JSON Schema (for editors)."),
    ],
}


def summaries() -> dict[str, str]:
    """Command -> its one-line summary, over every section."""
    return {name: line for rows in SECTIONS.values() for name, line in rows}


class SectionedGroup(click.Group):
    """A click group whose `--help` lists its commands under SECTIONS, each with its whole summary. A command no
    section names is still listed, under "Other", so a missing entry shows instead of hiding a command."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        listed = summaries()
        width = max(len(name) for name in [*names, *listed])  # one column for every section
        for title, rows in SECTIONS.items():
            present = [(name.ljust(width), line) for name, line in rows if name in names]
            if present:
                with formatter.section(title):
                    formatter.write_dl(present, col_max=width)
        others = [(name, "") for name in names if name not in listed]
        if others:
            with formatter.section("Other"):
                formatter.write_dl(others)
