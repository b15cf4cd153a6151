"""Commands that start engines (up, plan, restart, rollback): options and output only. Each resolves its
deployment (deployer.deployments) and calls one method of it; the report is printed whatever happened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from deployer.cli import show
from deployer.cli.load import _load
from deployer.cli.options import _profile_options, _target_options
from deployer.deployments.base import Deployment
from deployer.deployments.resolve import CHANGE, for_profile, resolve
from deployer.deployments.single.deployment import Origin
from deployer.errors import DiskFull, LaunchFailed, PartlyFailed, ProfileError
from deployer.output import text_runs
from deployer.runner.up import UpOptions
from deployer.secrets import mask_data

if TYPE_CHECKING:
    from deployer.deployments.reports import UpResult

__all__ = ["plan", "restart", "rollback", "run_reported", "text_runs", "up"]


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
@click.option("--canary", is_flag=True, help="A serving fleet: replace one replica first, compare its live metrics "
              "with the others' (the profile's rollout.canary), then promote the rest or roll it back.")
def up(profile: str, overrides: tuple[str, ...], host: str | None, trust_new_host: bool, as_json: bool,
       no_heal: bool, save_fixed: Path | None, skip_preflight: bool, model_config: Path | None,
       force: bool, no_rollback: bool, break_lock: bool, canary: bool) -> None:
    """Render, push, start and watch a deployment; heal known failures and retry."""
    prof = _load(profile, overrides, host)
    if canary and not isinstance(prof.replicas, list):
        raise ProfileError(f"{prof.name}: --canary is for a fleet profile (replicas: with a router:)")
    opts = UpOptions(trust_new_host=trust_new_host, heal=not no_heal, skip_preflight=skip_preflight,
                     save_fixed=save_fixed, model_config=model_config, force=force, rollback=not no_rollback,
                     break_lock=break_lock, canary=canary)
    deployment = for_profile(prof, Origin(profile, host, None, trust_new_host, overrides))
    run_reported(as_json, deployment, lambda sink: deployment.up(opts, sink))


def run_reported(as_json: bool, deployment: Deployment, action: Callable[[Any], Any]) -> None:
    """Run an up-like action with live progress (or NDJSON), then print its report, failed or not."""
    sink = show.progress(deployment, as_json)
    try:
        report = action(sink)
    except (LaunchFailed, PartlyFailed, DiskFull) as exc:
        sink.close()
        if text_runs.is_up_result(exc.outcome):
            _final(exc.outcome, as_json, sink)
        raise
    except BaseException:
        sink.close()  # Ctrl-C: the live line cleared once, before the message that follows
        raise
    sink.close()
    _final(report, as_json, sink)


def _final(report: UpResult, as_json: bool, sink: Any) -> None:
    if as_json:
        show.report_event(report.to_json())
    else:
        show.text(report, sink)


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
    prof = _load(profile, overrides, host)
    report = for_profile(prof, Origin(profile, host, None, trust_new_host, overrides)).plan(model_config)
    if as_json:  # masked before JSON escaping: a secret with quotes or non-ASCII is hidden too
        show.emit_json(mask_data(report.to_json()))
    else:
        show.text(report)
    if report.error is not None:  # what `up` refuses (a flag nothing may fix, exit 2), plan refuses alike
        raise report.error
@dataclass(frozen=True)
class OnCallArgs:
    """The options `restart` and `rollback` share (click passes them by name)."""

    target: str
    host: str | None
    workdir: str | None
    trust_new_host: bool
    as_json: bool
    no_heal: bool
    break_lock: bool


Act = Callable[[Deployment, UpOptions, Any], Any]


def _on_call(act: Act, what: str, args: OnCallArgs) -> None:
    opts = UpOptions(trust_new_host=args.trust_new_host, heal=not args.no_heal, skip_preflight=True,
                     break_lock=args.break_lock, what=what)
    deployment = resolve(args.target, args.host, args.workdir, trust_new_host=args.trust_new_host, mode=CHANGE)
    run_reported(args.as_json, deployment, lambda sink: act(deployment, opts, sink))


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
def restart(**argv: Any) -> None:
    """Graceful stop and start of the last good version, with the same watch and healing as `up`."""
    _on_call(lambda d, opts, sink: d.restart(opts, sink), "restart", OnCallArgs(**argv))


@click.command()
@_oncall_options
def rollback(**argv: Any) -> None:
    """Back to the newest other version that reached ready (read from the target's history; a multi-node
    profile: the newest other version every node ran and that reached ready)."""
    _on_call(lambda d, opts, sink: d.rollback(opts, sink), "rollback", OnCallArgs(**argv))
