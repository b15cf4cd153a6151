"""On-call commands (history, ...): options and output only; the work is in ops_more."""

from __future__ import annotations

import time

import click

from deployer.cli import _emit_json, _target_options


@click.command()
@click.argument("target")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--json", "as_json", is_flag=True)
def history(target: str, host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool) -> None:
    """Every attempt of a deployment: when, content hash, outcome, diagnosis, change made."""
    from deployer import ops_more

    rows = ops_more.history(ops_more.make_ref(target, host, workdir, trust_new_host))
    if as_json:
        _emit_json(rows)
        return
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started_at"])) if row["started_at"] else "?"
        diag = (row.get("diagnosis") or {}).get("signature") or ""
        change = (row.get("change") or {}).get("reason") or ""
        current = "*" if row.get("current") else " "
        click.echo(f"{current} {when}  {row['run_id']:<34} {row['content_hash'][:12]}  attempt {row['attempt']}  "
                   f"{row['outcome']:<9} {diag}{'  -> ' + change if change else ''}")


def register(group: click.Group) -> None:
    for command in (history,):
        group.add_command(command)
