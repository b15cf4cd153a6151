"""`deploy smoke`: up, one real chat completion through the SSH tunnel, down; JUnit and JSON for CI.

Exit codes are the usual ones (0 ok, 2 bad profile, 3 connection, 4 target unfit, 5 launch failed,
6 unhealthy: the request failed or the answer was empty). The JUnit file (--junit) is written whatever
happened, a bad profile included: its `preflight` testcase then fails and the other five are skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from deployer.cli import fleet
from deployer.cli.options import _load, _profile_options, _target_options
from deployer.events import Event, SmokePhase

if TYPE_CHECKING:
    from deployer.output.junit import Suite
    from deployer.smoke import SmokeReport


class _People:
    """Live progress for people (stderr), plus one line per finished smoke phase."""

    def __init__(self) -> None:
        from deployer.output.console import LiveProgress

        self.progress = LiveProgress()

    def __call__(self, event: Event) -> None:
        if isinstance(event, SmokePhase):
            colour = "green" if event.status == "passed" else "red"
            self.progress.say(f"[bold]{event.phase}[/] [{colour}]{event.status}[/] [dim]{event.duration_s:.2f}s[/]")
        else:
            self.progress(event)

    def close(self) -> None:
        self.progress.close()


@click.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@_target_options
@click.option("--junit", "junit_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a JUnit XML report here: one testcase per phase (written on failure too).")
@click.option("--json", "as_json", is_flag=True, help="NDJSON progress events on stdout, then the report.")
@click.option("--keep", is_flag=True, help="Leave the engine running after a successful request.")
@click.option("--skip-preflight", is_flag=True, help="Do not check GPUs, flags and memory before launch.")
@click.option("--no-heal", is_flag=True, help="Diagnose a failed launch but change nothing and do not retry.")
@click.option("--force", is_flag=True, help="Redeploy even if the same version is running and healthy.")
@click.option("--prompt", default="Say hello in five words.", show_default=True, help="The chat prompt.")
@click.option("--max-tokens", default=8, show_default=True, type=click.IntRange(1, 4096))
@click.option("--request-timeout", default=60.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds to wait for each HTTP answer.")
@click.option("--settle", default=0.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds to wait after ready before the request (catches crashes right after warm-up).")
def smoke(profile: str, overrides: tuple[str, ...], host: str | None, trust_new_host: bool,
          junit_file: Path | None, as_json: bool, keep: bool, skip_preflight: bool, no_heal: bool, force: bool,
          prompt: str, max_tokens: int, request_timeout: float, settle: float) -> None:
    """Deploy, send one real chat completion through the tunnel, stop: a CI check of a whole deployment."""
    from deployer import smoke as sm
    from deployer.errors import ProfileError

    prof, load_error = None, None
    try:
        prof = _load(profile, overrides, host)
    except ProfileError as exc:
        load_error = exc
    opts = sm.SmokeOptions(trust_new_host=trust_new_host, skip_preflight=skip_preflight, heal=not no_heal,
                           force=force, keep=keep, prompt=prompt, max_tokens=max_tokens,
                           request_timeout_s=request_timeout, settle_s=settle)
    if prof is not None and prof.nodes is not None:
        raise ProfileError(f"{prof.name}: smoke of a nodes: profile is not built yet; `deploy up` it and send a "
                           "request to node 0's port")
    if prof is not None and fleet.dispatch_kind(prof) is not None:
        fleet.smoke(prof, opts, as_json, junit_file, profile)
        return
    sink: Any = _json_sink() if as_json else _People()
    try:
        report = sm.run(prof, opts, sink, load_error=load_error, label=Path(profile).stem)
    finally:
        sink.close()
    if junit_file is not None:
        from deployer.output import junit

        junit.write(junit_file, [junit_suite(report, profile)])
    if as_json:
        sys.stdout.write(json.dumps({"event": "report", **report.to_json()}, default=str) + "\n")
    else:
        _print_summary(report)
    if report.error is not None:
        raise report.error


def _json_sink() -> Any:
    from deployer.output.console import JsonEvents

    return JsonEvents()


def junit_suite(report: SmokeReport, profile_path: str) -> Suite:
    from deployer.output.junit import Case, Suite

    classname = f"smoke.{report.name or 'profile'}"
    cases = [Case(name=p.name, classname=classname, time_s=p.duration_s, status=p.status,
                  message=p.details, text=p.text or p.details,
                  kind=type(report.error).__name__ if p.status == "failed" and report.error else "",
                  stdout=p.details if p.status == "passed" else "")
             for p in report.phases.values()]
    props = {"profile": profile_path, "host": report.host, "exit_code": str(report.exit_code)}
    if report.answer is not None:
        props.update(model=report.answer.model, latency_ms=f"{report.answer.latency_ms:.1f}",
                     answer=report.answer.text[:200])
    return Suite(name=f"deploy smoke {report.name}".strip(), cases=cases, properties=props)


def _print_summary(report: SmokeReport) -> None:
    verdict = "ok" if report.ok else f"FAILED (exit {report.exit_code})"
    click.echo(f"smoke {report.name} on {report.host}: {verdict}")
    for p in report.phases.values():
        took = f"{p.duration_s:6.2f}s" if p.status != "skipped" else " " * 7
        click.echo(f"  {p.name:<9} {p.status:<7} {took}  {p.details}")
    if report.answer is not None:
        a = report.answer
        click.echo(f"  answer ({a.model}, {a.latency_ms:.0f} ms): {a.text[:120]!r}")


def register(group: click.Group) -> None:
    """Attach `smoke` to the top-level group (called from deployer.cli.main)."""
    group.add_command(smoke)
