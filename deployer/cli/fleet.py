"""Fleet profiles on the commands that reach targets: which fleet path a profile takes, and its output.

`dispatch_kind` is the one place that tells a `replicas:` fleet from the others; a `nodes:` engine gets its own
branch there. Output and exit codes only: the work is in deployer.fleet.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from deployer.cli.options import _emit_json, _load

if TYPE_CHECKING:
    from deployer.fleet.smoke import FleetSmokeReport
    from deployer.output.junit import Suite
    from deployer.pipeline.up import UpOptions
    from deployer.profile.model import Profile
    from deployer.smoke import SmokeOptions


def dispatch_kind(profile: Profile) -> str | None:
    """`replicas` (with or without a router), `nodes`, or None for a single-host profile."""
    if profile.nodes is not None:
        return "nodes"
    if profile.replicas is not None or profile.router is not None:
        return "replicas"
    return None


def names_file(arg: str | None) -> bool:
    """Whether a NAME|PROFILE argument names a profile file (else it is a deployment's name)."""
    return arg is not None and (Path(arg).is_file() or arg.endswith((".yaml", ".yml")))


def fleet_profile(arg: str | None, overrides: tuple[str, ...] = (), *, read_only: bool = False) -> Profile | None:
    """The fleet profile named by a NAME|PROFILE argument, or None (a name, or a single-host profile).
    read_only (status, logs, down): the engine's `${VAR}`s may be unset here."""
    if not arg or not names_file(arg):
        return None
    if read_only:
        from deployer.profile.loader import READ_ONLY, load_profile

        prof = load_profile(arg, overrides=list(overrides), allow_unset=READ_ONLY)
    else:
        prof = _load(arg, overrides, None)
    kind = dispatch_kind(prof)
    if kind is None:
        return None
    if kind == "nodes":
        from deployer.errors import ProfileError

        raise ProfileError(f"{prof.name}: nodes: (one engine over several hosts) is not deployed by this command yet")
    return prof


def fleet_by_name(name: str | None, host: str | None, workdir: str | None, trust_new_host: bool) -> Profile | None:
    """A bare NAME with --host that is no deployment there: the fleet of that name whose router runs on that host
    (its record, fleet.json), or None."""
    from deployer.fleet.record import find_fleet
    from deployer.oncall.deployment import make_ref

    if not name or not host:
        return None
    ref = make_ref(name, host, workdir, trust_new_host)
    return find_fleet(ref.spec, ref.workdir, name)


def _no_host(host: str | None, what: str) -> None:
    if host:
        from deployer.errors import ProfileError

        raise ProfileError(f"--host does not apply to `{what}` of a fleet profile: its hosts are in the profile")


def _sink(as_json: bool) -> Any:
    from deployer.output.console import JsonEvents
    from deployer.output.fleet import FleetProgress

    return JsonEvents() if as_json else FleetProgress()


def run_fleet(as_json: bool, action: Any) -> None:
    """Run a fleet up/restart, then print its report, whatever happened (a partial failure too)."""
    from deployer.errors import LaunchFailed, PartlyFailed

    sink = _sink(as_json)
    try:
        report = action(sink)
    except (PartlyFailed, LaunchFailed) as exc:
        if exc.outcome is not None and hasattr(exc.outcome, "replicas"):
            _report(exc.outcome.to_json(), as_json)
        raise
    _report(report.to_json(), as_json)


def _report(data: dict[str, Any], as_json: bool) -> None:
    from deployer.output.fleet import report_lines
    from deployer.secrets import mask_data

    if as_json:
        sys.stdout.write(json.dumps({"event": "report", **mask_data(data)}, default=str) + "\n")
        sys.stdout.flush()
        return
    for line in report_lines(data):
        click.echo(line, err=True)


def up(prof: Profile, opts: UpOptions, as_json: bool, host: str | None) -> None:
    from deployer.fleet.up import fleet_up

    _no_host(host, "up")
    run_fleet(as_json, lambda sink: fleet_up(prof, opts, sink))


def on_call(action: str, prof: Profile, opts: UpOptions, as_json: bool) -> None:
    """`restart` or `rollback` of a fleet: one replica at a time through the router."""
    from deployer.fleet.up import fleet_restart, fleet_rollback

    run = {"restart": fleet_restart, "rollback": fleet_rollback}[action]
    run_fleet(as_json, lambda sink: run(prof, opts, sink))


def status(prof: Profile, host: str | None, trust_new_host: bool, as_json: bool) -> None:
    from deployer.fleet.members import fleet_of
    from deployer.fleet.oncall import fleet_status
    from deployer.output.fleet import status_lines

    _no_host(host, "status")
    data, code = fleet_status(fleet_of(prof), trust_new_host)
    if as_json:
        _emit_json(data)
    else:
        for line in status_lines(data):
            click.echo(line)
    click.get_current_context().exit(code)


def down(prof: Profile, host: str | None, trust_new_host: bool, grace: float | None, as_json: bool,
         break_lock: bool) -> None:
    from deployer.errors import PartlyFailed
    from deployer.fleet.members import fleet_of
    from deployer.fleet.oncall import fleet_down

    _no_host(host, "down")
    try:
        result = fleet_down(fleet_of(prof), grace, trust_new_host=trust_new_host, break_lock=break_lock,
                            emit=_sink(as_json))
    except PartlyFailed as exc:
        if as_json and isinstance(exc.outcome, dict):
            _emit_json(exc.outcome)
        raise
    if as_json:
        _emit_json(result)
        return
    for row in result["members"]:
        what = "stopped" if row.get("was_running") else "not running"
        click.echo(f"{row['member']}@{row.get('alias') or row['host']}: {row['name']} {what}")


def logs(prof: Profile, *, replica: int | None, host: str | None, router: bool, trust_new_host: bool, lines: int,
         follow: bool, previous: bool) -> None:
    from deployer.fleet.members import fleet_of
    from deployer.fleet.oncall import fleet_logs, pick_member

    fleet = fleet_of(prof)
    member = pick_member(fleet, replica=replica, host=host, router=router)
    fleet_logs(fleet, member, lines=lines, follow=follow, previous=previous, out=click.echo,
               trust_new_host=trust_new_host)


def smoke(prof: Profile, opts: SmokeOptions, as_json: bool, junit_file: Path | None, profile_path: str) -> None:
    """A fleet's smoke: the cases per member and phase, JUnit written whatever happened."""
    from deployer.fleet.smoke import smoke_fleet
    from deployer.secrets import mask_data

    sink = _sink(as_json)
    try:
        report = smoke_fleet(prof, opts, sink)
    finally:
        sink.close()
    if junit_file is not None:
        from deployer.output import junit

        junit.write(junit_file, [junit_suite(report, profile_path)])
    if as_json:
        sys.stdout.write(json.dumps({"event": "report", **mask_data(report.to_json())}, default=str) + "\n")
    else:
        verdict = "ok" if report.ok else f"FAILED (exit {report.exit_code})"
        click.echo(f"smoke {report.name} (fleet): {verdict}")
        for c in report.cases:
            took = f"{c.duration_s:6.2f}s" if c.status != "skipped" else " " * 7
            click.echo(f"  {c.phase:<8} {c.member + '@' + c.host:<20} {c.status:<7} {took}  {c.details}")
    if report.error is not None:
        raise report.error


def junit_suite(report: FleetSmokeReport, profile_path: str) -> Suite:
    """One testcase per member (host) and phase: `up r0@gpu-a`, `request router@gpu-a`, ..."""
    from deployer.output.junit import Case, Suite

    cases = [Case(name=f"{c.phase} {c.member}@{c.host}", classname=f"smoke.{report.name}.{c.host}",
                  time_s=c.duration_s, status=c.status, message=c.details, text=c.details,
                  kind=type(report.error).__name__ if c.status == "failed" and report.error else "",
                  stdout=c.details if c.status == "passed" else "")
             for c in report.cases]
    props = {"profile": profile_path, "exit_code": str(report.exit_code), "fleet": report.name}
    return Suite(name=f"deploy smoke {report.name}", cases=cases, properties=props)
