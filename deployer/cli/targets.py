"""Commands that act on targets (up, status, logs, down, diagnose, plan, history): options and output only."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import click

from deployer.cli import fleet
from deployer.cli.options import _emit_json, _load, _profile_options, _target_options
from deployer.engines import kinds

if TYPE_CHECKING:
    from deployer.oncall.deployment import Ref
    from deployer.profile.model import Profile


def _progress(as_json: bool) -> Any:
    from deployer.output.console import JsonEvents, LiveProgress

    return JsonEvents() if as_json else LiveProgress()


@click.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@_target_options
@click.option("--json", "as_json", is_flag=True, help="NDJSON events on stdout, then the report.")
@click.option("--no-heal", is_flag=True, help="Diagnose a failure but change nothing and do not retry.")
@click.option("--save-fixed", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the profile that worked (with healing's changes) to this file.")
@click.option("--skip-preflight", is_flag=True, help="Do not check GPUs, flags and memory before launch.")
@click.option("--model-config", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A local folder with the model's config.json for the memory plan.")
@click.option("--force", is_flag=True, help="Restart even if the same version is running and healthy.")
@click.option("--no-rollback", is_flag=True,
              help="If the new version cannot be started, leave it as it failed: do not bring back the old one.")
@click.option("--break-lock", is_flag=True,
              help="Take the deployment lock even if another operation holds it (recorded in the history).")
def up(profile: str, overrides: tuple[str, ...], host: str | None, trust_new_host: bool, as_json: bool,
       no_heal: bool, save_fixed: Path | None, skip_preflight: bool, model_config: Path | None,
       force: bool, no_rollback: bool, break_lock: bool) -> None:
    """Render, push, start and watch a deployment; heal known failures and retry."""
    from deployer.pipeline.up import UpOptions
    from deployer.pipeline.up import up as run_up

    prof = _load(profile, overrides, host)
    opts = UpOptions(trust_new_host=trust_new_host, heal=not no_heal, skip_preflight=skip_preflight,
                     save_fixed=save_fixed, model_config=model_config, force=force, rollback=not no_rollback,
                     break_lock=break_lock)
    if prof.nodes:  # one engine across nodes (issue 14)
        from deployer.fleet.nodes_up import up_nodes

        run_reported(as_json, lambda sink: up_nodes(prof, opts, sink))
        return
    if fleet.dispatch_kind(prof) is not None:
        fleet.up(prof, opts, as_json, host)
        return
    from deployer.oncall.remembered import remember

    remember(profile, overrides, host, prof)  # the on-call commands on this file need not load it again
    run_reported(as_json, lambda sink: run_up(prof, opts, sink))


def run_reported(as_json: bool, action: Callable[[Any], Any]) -> None:
    """Run an up-like action with live progress (or NDJSON), then print its report, failed or not."""
    from deployer.errors import LaunchFailed

    sink = _progress(as_json)
    try:
        report = action(sink)
    except LaunchFailed as exc:
        sink.close()
        if exc.outcome is not None and hasattr(exc.outcome, "attempts"):
            _final(exc.outcome, as_json, sink)
        raise
    sink.close()
    _final(report, as_json, sink)


def _final(report: Any, as_json: bool, sink: Any) -> None:
    from deployer.output.console import print_up_report
    from deployer.secrets import mask_data

    if as_json:  # masked before JSON escaping (the stdout guard sees only the escaped text)
        sys.stdout.write(json.dumps({"event": "report", **mask_data(report.to_json())}, default=str) + "\n")
    else:
        print_up_report(report, sink)


def _nodes_group(target: str | None, node: int | None) -> tuple[ModuleType, Profile] | None:
    """(deployer.fleet.nodes_ops, the profile) when TARGET is a `nodes:` profile, else None. The module is
    imported only when TARGET names a file (or --node is given): the commands on a name stay light to start.
    Only on-call commands come here: the engine's `${VAR}`s may be unset."""
    if node is None and not fleet.names_file(target):
        return None
    from deployer.fleet.nodes_plan import nodes_profile

    group = nodes_profile(target, node, read_only=True)
    if group is None:
        return None
    from deployer.fleet import nodes_ops  # the multi-node work: only for a nodes: profile

    return nodes_ops, group


def remembered(target: str | None, host: str | None, workdir: str | None, trust_new_host: bool) -> Ref | None:
    """The Ref of a single-host profile file that is unchanged since a command loaded it (no profile load, no
    nodes/fleet check: it was neither), else None."""
    if not fleet.names_file(target):
        return None
    assert target is not None
    from deployer.oncall.deployment import remembered_ref

    return remembered_ref(target, host, workdir, trust_new_host)


@click.command()
@click.argument("target", required=False)
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None, help="Workdir on the target (default: the profile's or /workspace/deployer).")
@_target_options
@click.option("--json", "as_json", is_flag=True)
@click.option("--node", type=click.IntRange(0, 4096), default=None,
              help="One node of a multi-node (nodes:) profile: its node_rank.")
def status(target: str | None, host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool,
           node: int | None) -> None:
    """State, pid, uptime, health, attempt, content hash and run dir; every deployment with only --host.

    Exits 0 only while the deployment serves (every one, with only --host): 5 crashed, crash-looping or
    lost; 6 alive but not answering /health (starting, restarting, hung); 8 stopped; 7 none there."""
    from deployer.oncall import deployment as ops

    from deployer.errors import NotFound

    ref = remembered(target, host, workdir, trust_new_host) if node is None else None
    if ref is None:
        if _nodes_status(target, node, workdir, trust_new_host, as_json):
            return
        fleet_prof = fleet.fleet_profile(target, read_only=True)
        if fleet_prof is not None:
            fleet.status(fleet_prof, host, trust_new_host, as_json)
            return
        ref = ops.make_ref(target, host, workdir, trust_new_host, read_only=True)
    try:
        rows = ops.status(ref)
    except NotFound:
        fleet_prof = fleet.fleet_by_name(target, host, workdir, trust_new_host)
        if fleet_prof is None:
            raise
        fleet.status(fleet_prof, None, trust_new_host, as_json)
        return
    code = ops.worst_exit_code(rows)
    if as_json:
        _emit_json(rows if target is None else rows[0])
    else:
        _print_status(rows)
    click.get_current_context().exit(code)


def _nodes_status(target: str | None, node: int | None, workdir: str | None, trust_new_host: bool,
                  as_json: bool) -> bool:
    """`status` of a `nodes:` profile (a row per node; exits with the worst code); False for any other TARGET."""
    from deployer.oncall import deployment as ops

    found = _nodes_group(target, node)
    if found is None:
        return False
    nodes_ops, group = found  # one engine across nodes: a row per node
    rows = nodes_ops.status(group, node, workdir, trust_new_host)
    code = ops.worst_exit_code(rows)
    if as_json:
        _emit_json(rows)
    else:
        for row in rows:
            first = ": its crash came first, the group fell with it" if row.get("first_crash") else ""
            click.echo(f"node {row['node']} ({row['role']}){first}:")
            _print_status([row])
            crash = row.get("last_crash_diagnosis")
            if crash and not row.get("diagnosis"):
                click.echo(f"  last crash diagnosis: {crash.get('signature')}: {crash.get('summary')}")
    click.get_current_context().exit(code)
    return True


def _print_status(rows: list[dict[str, Any]]) -> None:
    if not rows:
        click.echo("no deployments")
    for row in rows:
        health = "healthy" if row["healthy"] else "not healthy"
        uptime = f", up {row['uptime_s']:.0f}s" if row["uptime_s"] is not None else ""
        click.echo(f"{row['name']}: {row['status']} ({health}{uptime}) pid {row['pid']} port {row['port']} "
                   f"attempt {row['attempt']} content {row['content_hash'][:12]} restarts {row['restarts']}")
        click.echo(f"  run dir {row['run_dir']} on {row['host']}")
        if row.get("last_crash"):
            click.echo(f"  last crash: {describe_crash(row['last_crash'])}")
        if row.get("lock"):
            click.echo(f"  lock: {row['lock']['text']}")
        for line in row.get("drift") or []:
            click.echo(f"  drift: {line}")


def describe_crash(crash: Any, now: float | None = None) -> str:
    """The supervisor's last_crash record for people: how the engine ended, when (local time) and how long ago."""
    if not isinstance(crash, dict):
        return str(crash)
    if crash.get("signal"):
        how = f"killed by {crash.get('signal_name') or 'signal ' + str(crash['signal'])}"
    elif crash.get("exit_code") is not None:
        how = f"exited with code {crash['exit_code']}"
    else:
        how = "ended"
    at = crash.get("at")
    if not isinstance(at, (int, float)):
        return how
    ago = max((time.time() if now is None else now) - at, 0)
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))
    return f"{how} at {when} ({_ago(ago)} ago)"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


@click.command()
@click.argument("target")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", default=50, show_default=True, type=click.IntRange(1, 100000))
@click.option("--previous", is_flag=True, help="The log of the attempt before the current one.")
@click.option("--replica", type=click.IntRange(0, 10000), default=None,
              help="Fleet profile: the log of replica N (0-based, the order of `replicas:`).")
@click.option("--router", "router", is_flag=True, help="Fleet profile: the router's log.")
@click.option("--node", type=click.IntRange(0, 4096), default=None,
              help="One node of a multi-node (nodes:) profile: its node_rank.")
def logs(target: str, host: str | None, workdir: str | None, trust_new_host: bool, follow: bool, lines: int,
         previous: bool, replica: int | None, router: bool, node: int | None) -> None:
    """Print the engine log of the current (or previous) attempt (a fleet: of --replica N, --host H or --router;
    a multi-node profile: of --node N)."""
    from deployer.oncall import deployment as ops

    plain = node is None and replica is None and not router
    ref = remembered(target, host, workdir, trust_new_host) if plain else None
    if ref is not None:
        ops.logs(ref, lines=lines, follow=follow, previous=previous, out=click.echo)
        return
    found = _nodes_group(target, node)
    if found is not None:
        nodes_ops, group = found
        nodes_ops.logs(group, node, workdir, trust_new_host, lines=lines, follow=follow, previous=previous,
                       out=click.echo)
        return
    fleet_prof = fleet.fleet_profile(target, read_only=True)
    if fleet_prof is None and (replica is not None or router):
        fleet_prof = fleet.fleet_by_name(target, host, workdir, trust_new_host)
        if fleet_prof is None:
            from deployer.errors import NotFound

            raise NotFound(f"no fleet {target!r} here: --replica and --router need a fleet profile file, or a "
                           "fleet's name with --host of its router's host")
        host = None if replica is not None or router else host
    if fleet_prof is not None:
        fleet.logs(fleet_prof, replica=replica, host=host, router=router, trust_new_host=trust_new_host, lines=lines,
                   follow=follow, previous=previous)
        return

    ops.logs(ops.make_ref(target, host, workdir, trust_new_host, read_only=True), lines=lines, follow=follow, previous=previous,
             out=click.echo)


@click.command()
@click.argument("target")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--grace", type=float, default=None, help="Seconds between SIGTERM and SIGKILL.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--break-lock", is_flag=True,
              help="Take the deployment lock even if another operation holds it (recorded in the history).")
@click.option("--node", type=click.IntRange(0, 4096), default=None,
              help="One node of a multi-node (nodes:) profile: its node_rank.")
def down(target: str, host: str | None, workdir: str | None, trust_new_host: bool, grace: float | None,
         as_json: bool, break_lock: bool, node: int | None) -> None:
    """Stop a deployment gracefully (idempotent: 'not running' is success)."""
    from deployer.oncall import deployment as ops

    found = _nodes_group(target, node)
    if found is not None:
        nodes_ops, group = found  # every node, rank 0 first (or the one --node names)
        results = nodes_ops.down(group, node, workdir, trust_new_host, grace, break_lock=break_lock,
                                 notify=lambda m: click.echo(f"warning: {m}", err=True))
        if as_json:
            _emit_json(results)
        for result in [] if as_json else results:
            what = "stopped" if result["was_running"] else "not running"
            click.echo(f"{result['name']} node {result['node']}: {what} on {result['host']}")
        return
    fleet_prof = fleet.fleet_profile(target, read_only=True)
    if fleet_prof is not None:
        fleet.down(fleet_prof, host, trust_new_host, grace, as_json, break_lock)
        return
    result = ops.down(ops.make_ref(target, host, workdir, trust_new_host, read_only=True), grace, break_lock=break_lock,
                      notify=lambda m: click.echo(f"warning: {m}", err=True))
    if result.get("status") == "absent":  # no such deployment here: perhaps the fleet whose router runs here
        fleet_prof = fleet.fleet_by_name(target, host, workdir, trust_new_host)
        if fleet_prof is not None:
            fleet.down(fleet_prof, None, trust_new_host, grace, as_json, break_lock)
            return
    if as_json:
        _emit_json(result)
    elif result["was_running"]:
        click.echo(f"{result['name']}: stopped on {result['host']}")
    else:
        click.echo(f"{result['name']}: not running on {result['host']}")


@click.command()
@click.argument("target", required=False)
@click.option("--log", "log_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Diagnose a local log file (no target needed).")
@click.option("--engine-version", default=None, help="Engine version the log came from.")
@click.option("--engine", "engine_kind", type=click.Choice(kinds()), default=None,
              help="Engine the log file came from (default: told from the log itself; a deployment's own record "
                   "says it).")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--json", "as_json", is_flag=True)
def diagnose(target: str | None, log_file: str | None, engine_version: str | None, engine_kind: str | None,
             host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool) -> None:
    """The first traceback and diagnosis of a log file, or of a deployment's latest failed attempt."""
    if log_file is None:
        from deployer.oncall import history as attempts

        ref = remembered(target, host, workdir, trust_new_host) or \
            attempts.make_ref(target, host, workdir, trust_new_host, read_only=True)
        data = attempts.diagnose_deployment(ref, engine_version)
    else:
        from deployer.diagnose.diagnosis import diagnose, read_window
        from deployer.engines import detect, engine_for
        from deployer.logtext import bounded_diagnosis

        text = read_window(log_file)
        # Nothing defaults to an engine: the log names its engine, or only the engine-neutral signatures are used.
        engine, how = (engine_for(engine_kind), "given") if engine_kind else (detect(text), "detected from the log")
        data = bounded_diagnosis(diagnose(text, engine_version=engine_version, engine=engine).to_json())
        data["hint"] = None
        data["engine"] = {"kind": engine.kind, "how": how} if engine is not None else \
            {"kind": None, "how": "not told by the log: engine-neutral signatures only"}
    if as_json:
        _emit_json(data)
        return
    _print_diagnosis(data)


def _print_diagnosis(data: dict[str, Any]) -> None:
    engine = data.get("engine")
    if isinstance(engine, dict):
        click.echo(f"engine:    {engine.get('kind') or 'unknown'} ({engine.get('how')})")
    click.echo(f"signature: {data.get('signature') or 'none (unknown failure)'}")
    click.echo(f"summary:   {data.get('summary')}")
    click.echo(f"transient: {'yes' if data.get('transient') else 'no (retrying unchanged is pointless)'}")
    for line in data.get("evidence") or []:
        click.echo(f"evidence:  {line}")
    if data.get("remedy"):
        click.echo(f"remedy:    {json.dumps(data['remedy'])}")
    if data.get("traceback"):
        click.echo("traceback:")
        click.echo(data["traceback"])


@click.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@_target_options
@click.option("--model-config", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A local folder with the model's config.json (else read on the target).")
@click.option("--json", "as_json", is_flag=True)
def plan(profile: str, overrides: tuple[str, ...], host: str | None, trust_new_host: bool,
         model_config: Path | None, as_json: bool) -> None:
    """Preflight without launching: GPUs, engine version, flags, effective args, memory plan."""
    from deployer.errors import PreflightFailed
    from deployer.preflight.checks import run_preflight
    from deployer.remote.connect import conversing, target_spec
    from deployer.local_history import home
    from deployer.secrets import mask_data

    prof = _load(profile, overrides, host)
    if prof.nodes:  # one engine across nodes: every node checked, nothing changed (issue 14)
        from deployer.fleet.nodes_dryrun import plan_report

        nodes = plan_report(prof, trust_new_host=trust_new_host, model_config=model_config)
        if as_json:
            _emit_json(mask_data(nodes.to_json()))
        else:
            click.echo(nodes.render_text(), nl=False)
        if nodes.problems:
            raise PreflightFailed(nodes.problems)
        return
    with conversing(target_spec(prof, trust_new_host)) as remote:  # one exec channel: preflight's requests
        report = run_preflight(remote, prof, cache_dir=home() / "cache", model_config=model_config,
                               own_port=_own_port(remote, prof))
    if as_json:  # masked before JSON escaping: a secret with quotes or non-ASCII is hidden too
        _emit_json(mask_data(report.to_json()))
    else:
        click.echo(report.render_text())
    refused = report.refusal()  # what `up` refuses with exit 2 (a flag nothing may fix), plan refuses alike
    if refused is not None:
        raise refused
    if report.problems:
        raise PreflightFailed(report.problems)


def _own_port(remote: Any, prof: Profile) -> bool:
    """This deployment's running version holds the engine port: `up` replaces it, so plan does not call it busy."""
    from deployer.push import layout_for
    from deployer.target.records import current_view

    view = current_view(remote, layout_for(remote, prof))
    return view is not None and view.alive and view.record.get("port") == prof.engine.port


def register(group: click.Group) -> None:
    """Attach the target commands to the top-level group."""
    for command in (up, status, logs, down, diagnose, plan):
        group.add_command(command)
