"""`deploy smoke`: up, one real chat completion through the SSH tunnel, down; JUnit and JSON for CI.

Exit codes are the usual ones (0 ok, 2 bad profile, 3 connection, 4 target unfit, 5 launch failed,
6 unhealthy: the request failed or the answer was empty). The JUnit file (--junit) is written whatever
happened, a bad profile included: its `preflight` testcase then fails and the other five are skipped.
A fleet's cases are per member and phase; a node group's are the single host's phases (the request through
node 0's port).
"""

from __future__ import annotations

from pathlib import Path

import click

from deployer.cli import show
from deployer.cli.load import _load
from deployer.cli.options import _profile_options, _target_options
from deployer.deployments.base import Deployment
from deployer.deployments.resolve import for_profile, unloaded
from deployer.deployments.single.deployment import Origin
from deployer.errors import ProfileError
from deployer.output import junit, text_runs
from deployer.smoke import SmokeOptions

__all__ = ["smoke", "text_runs"]


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
@click.option("--max-tokens", default=8, show_default=True, type=click.IntRange(1, 4096),
              help="max_tokens of the chat request.")
@click.option("--request-timeout", default=60.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds to wait for each HTTP answer.")
@click.option("--settle", default=0.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds to wait after ready before the request (catches crashes right after warm-up).")
def smoke(profile: str, overrides: tuple[str, ...], host: str | None, trust_new_host: bool,
          junit_file: Path | None, as_json: bool, keep: bool, skip_preflight: bool, no_heal: bool, force: bool,
          prompt: str, max_tokens: int, request_timeout: float, settle: float) -> None:
    """Deploy, send one real chat completion through the tunnel, stop: a CI check of a whole deployment."""
    origin = Origin(profile, host, None, trust_new_host, overrides)
    deployment: Deployment
    try:
        deployment = for_profile(_load(profile, overrides, host), origin)
    except ProfileError as exc:
        deployment = unloaded(exc, origin)
    opts = SmokeOptions(trust_new_host=trust_new_host, skip_preflight=skip_preflight, heal=not no_heal,
                        force=force, keep=keep, prompt=prompt, max_tokens=max_tokens,
                        request_timeout_s=request_timeout, settle_s=settle)
    sink = show.progress(deployment, as_json, smoke=True)
    try:
        report = deployment.smoke(opts, sink)
    finally:
        sink.close()
    if junit_file is not None:
        junit.write(junit_file, [junit.smoke_suite(report, profile)])
    if as_json:
        show.report_event(report.to_json())
    else:
        show.text(report)
    if report.error is not None:
        raise report.error
