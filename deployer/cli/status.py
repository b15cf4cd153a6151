"""`deploy status`: options and output only, as the other on-call reads (deployer.cli.targets). It resolves the
deployment (deployer.deployments) and prints its status report (deployer.cli.show).

A status is one exec channel whose wait is the target's login shell and helper starting; started after every
module that makes and shows the report had been imported, that wait came after them. So when the target is known
without them (a profile file an earlier command remembered: deployer.local.remembered), the connection is made and
the helper's exec sent first (deployer.remote.connect.started_early), and those modules are imported while the
target's shell starts: they are imported inside the command, after that start (tests/unit/test_status_early.py).
"""

from __future__ import annotations

import click

from deployer.cli.options import NODE, _target_options
from deployer.local.remembered import lookup
from deployer.host import TargetSpec
from deployer.remote.connect import started_early


@click.command()
@click.argument("target", required=False)
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None, help="Workdir on the target (default: the profile's or /workspace/deployer).")
@_target_options
@click.option("--json", "as_json", is_flag=True)
@NODE
def status(target: str | None, host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool,
           node: int | None) -> None:
    """State, pid, uptime, health, attempt, content hash and run dir; every deployment with only --host.

    Exits 0 only while the deployment serves (every one, with only --host): 5 crashed, crash-looping or
    lost; 6 alive but not answering /health (starting, restarting, hung); 8 stopped; 7 none there."""
    with started_early(early_target(target, host, trust_new_host, node)):
        # imported here, while the target's helper starts (the module's docstring)
        from deployer.cli import show
        from deployer.deployments.base import Select
        from deployer.deployments.reports import HostStatus
        from deployer.deployments.resolve import READ, resolve

        report = resolve(target, host, workdir, trust_new_host=trust_new_host, select=Select(node=node),
                         mode=READ).status()
        if isinstance(report, HostStatus) and report.nothing_found:
            click.echo(f"deploy: {report.nothing_found}", err=True)
        if as_json:
            show.emit_json(report.to_json())
        else:
            show.text(report)
    click.get_current_context().exit(report.exit_code)


def early_target(target: str | None, host: str | None, trust_new_host: bool, node: int | None) -> TargetSpec | None:
    """The host a status will talk to, when it is known before the deployment is resolved: a whole deployment's
    profile file that an earlier command loaded and that is unchanged since (deployer.deployments.resolve, rule 1,
    which reads the same record); else None."""
    if target is None or node is not None:
        return None
    pointer = lookup(target, (), host)
    return None if pointer is None else pointer.spec(trust_new_host)
