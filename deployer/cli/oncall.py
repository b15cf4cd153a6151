"""On-call commands (history, ...): options and output only; the work is in attempts."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import click

from deployer.cli import fleet
from deployer.cli.options import _emit_json, _target_options

if TYPE_CHECKING:
    from deployer.pipeline.up import UpOptions


@click.command()
@click.argument("target")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--json", "as_json", is_flag=True)
@click.option("--local", is_flag=True, help="Read this machine's history cache instead of the target.")
def history(target: str, host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool,
            local: bool) -> None:
    """Every attempt of a deployment: when, content hash, outcome, diagnosis, change made."""
    from deployer.oncall import history as attempts

    from deployer.cli.targets import remembered

    if local:
        rows = attempts.local_history(target, host)
    else:
        ref = remembered(target, host, workdir, trust_new_host) or \
            attempts.make_ref(target, host, workdir, trust_new_host, read_only=True)
        rows = attempts.history(ref)
    if as_json:
        _emit_json(rows)
        return
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started_at"])) if row["started_at"] else "?"
        if row.get("kind") == "lock":
            click.echo(f"  {when}  {row['outcome']:<34} {row['detail']}")
            continue
        diag = (row.get("diagnosis") or {}).get("signature") or ""
        change = (row.get("change") or {}).get("reason") or ""
        current = "*" if row.get("current") else " "
        outcome = row.get("outcome") or "unfinished"  # an `up` interrupted (or still running) never recorded one
        click.echo(f"{current} {when}  {row['run_id']:<34} {str(row['content_hash'] or '')[:12]}  "
                   f"attempt {row['attempt']}  {outcome:<10} {diag}{'  -> ' + change if change else ''}")


def _oncall(action: str, target: str, host: str | None, workdir: str | None, trust_new_host: bool,
            as_json: bool, no_heal: bool, break_lock: bool) -> None:
    from deployer.oncall import rollback as going_back
    from deployer.oncall import deployment as ops
    from deployer.cli.targets import run_reported
    from deployer.pipeline.up import UpOptions

    opts = UpOptions(trust_new_host=trust_new_host, heal=not no_heal, skip_preflight=True, break_lock=break_lock,
                     what=action)
    if fleet.names_file(target) and _nodes_restart(action, target, opts, as_json):
        return
    fleet_prof = fleet.fleet_profile(target)
    if fleet_prof is not None:
        fleet.on_call(action, fleet_prof, opts, as_json)
        return
    ref = ops.make_ref(target, host, workdir, trust_new_host)
    run_reported(as_json, lambda sink: getattr(going_back, action)(ref, sink, opts))


def _nodes_restart(action: str, target: str, opts: UpOptions, as_json: bool) -> bool:
    """`restart` of a `nodes:` profile: every rank stopped and the group started again as one (a new attempt of
    the profile's version, watched and healed like `up`); False when TARGET is no nodes profile. `rollback` of
    one is refused in one line: which earlier version every node shares is not worked out yet."""
    from deployer.cli.targets import run_reported
    from deployer.errors import ProfileError
    from deployer.fleet.nodes_plan import nodes_profile
    from deployer.fleet.nodes_up import up_nodes

    group = nodes_profile(target, None)
    if group is None:
        return False
    if action != "restart":
        raise ProfileError(f"{group.name}: {action} of a nodes: profile is not built yet; `deploy up` the version "
                           "to go back to (the group is replaced as one)")
    forced = dataclasses.replace(opts, force=True)
    run_reported(as_json, lambda sink: up_nodes(group, forced, sink))
    return True


def _oncall_options(func: Any) -> Any:
    for option in reversed([
        click.argument("target"),
        click.option("--host", default=None, metavar="[USER@]HOST[:PORT]"),
        click.option("--workdir", default=None),
        click.option("--trust-new-host", is_flag=True, help="Record the key of a host not yet in known_hosts."),
        click.option("--json", "as_json", is_flag=True, help="NDJSON events on stdout, then the report."),
        click.option("--no-heal", is_flag=True, help="Diagnose a failure but change nothing and do not retry."),
        click.option("--break-lock", is_flag=True,
                     help="Take the deployment lock even if another operation holds it (recorded in the history)."),
    ]):
        func = option(func)
    return func


@click.command()
@_oncall_options
def restart(target: str, host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool,
            no_heal: bool, break_lock: bool) -> None:
    """Graceful stop and start of the last good version, with the same watch and healing as `up`."""
    _oncall("restart", target, host, workdir, trust_new_host, as_json, no_heal, break_lock)


@click.command()
@_oncall_options
def rollback(target: str, host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool,
             no_heal: bool, break_lock: bool) -> None:
    """Back to the newest other version that reached ready (read from the target's history)."""
    _oncall("rollback", target, host, workdir, trust_new_host, as_json, no_heal, break_lock)


@click.command()
@click.argument("target")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--keep", type=click.IntRange(1, 10000), default=None,
              help="Run dirs to keep (default: the profile's retention.keep_runs, 10).")
@click.option("--dry-run", is_flag=True, help="Say what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True)
def prune(target: str, host: str | None, workdir: str | None, trust_new_host: bool, keep: int | None,
          dry_run: bool, as_json: bool) -> None:
    """Delete old run dirs beyond the newest N and the env files (secrets) of runs no restart or rollback needs.

    The current run and the newest run that reached ready (and rollback's target) are never deleted.
    """
    from deployer.oncall import history as ops_more

    result = ops_more.prune(ops_more.make_ref(target, host, workdir, trust_new_host), keep, dry_run)
    if as_json:
        _emit_json(result)
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{result['name']} on {result['host']}: {result['runs']} runs, keeping the newest {result['keep']}"
               f"{' (dry run: nothing changed)' if dry_run else ''}")
    for run_id in result["delete"]:
        click.echo(f"  {verb} run {run_id}")
    for run_id in result["drop_env"]:
        click.echo(f"  {verb} the env file of run {run_id}")
    for run_id, why in result["protected"].items():
        click.echo(f"  kept run {run_id}: {why}")
    if not result["delete"] and not result["drop_env"]:
        click.echo("  nothing to prune")


def register(group: click.Group) -> None:
    for command in (history, restart, rollback, prune):
        group.add_command(command)
