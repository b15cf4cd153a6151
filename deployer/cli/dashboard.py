"""`deploy dashboard`: a local web page of the deployments named, read through the Deployment interface (options
and serving only; the data is deployer.dashboard.live's)."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import click

from deployer.dashboard.live import LiveSource, watched
from deployer.dashboard.options import beyond_loopback, listen_address, loud_warning, refresh_interval
from deployer.dashboard.server import LOOPBACK, DashboardConfig, DashboardServer, serve_until_interrupted
from deployer.deployments.base import Deployment
from deployer.deployments.resolve import Mode, resolve
from deployer.remote.connect import kept_open


@dataclass
class Named:
    """One `PROFILE|NAME [--host H] [--workdir W]` of the command line (no arg: every deployment on the host)."""

    arg: str | None
    host: str | None = None
    workdir: str | None = None


def named(tokens: tuple[str, ...]) -> list[Named]:
    """The deployments the arguments name: `--host`/`--workdir` belong to the PROFILE|NAME before them; a
    `--host` after one that has its host (or first) means every deployment on that host."""
    out: list[Named] = []
    items = list(tokens)
    while items:
        token = items.pop(0)
        option, _, inline = token.partition("=")
        if option in ("--host", "--workdir"):
            if not inline and not items:
                raise click.UsageError(f"{option} needs a value")
            value = inline or items.pop(0)
            if option == "--host":
                if not out or out[-1].host is not None:
                    out.append(Named(None))
                out[-1].host = value
            elif not out:
                raise click.UsageError("--workdir belongs after the PROFILE|NAME (or --host) it is for")
            else:
                out[-1].workdir = value
        elif token.startswith("-"):
            raise click.UsageError(f"no such option: {token}")
        else:
            out.append(Named(token))
    if not out:
        raise click.UsageError("name at least one deployment: PROFILE, NAME --host H, or --host H (every one there)")
    return out


class BadOption(click.ClickException):
    """A bad option value: `Error: <one line>` on stderr, exit 2 (click's usage errors print the usage too)."""

    exit_code = 2


class Checked(click.ParamType):  # type: ignore[type-arg]
    """An option value checked by one of deployer.dashboard.options's functions (its ValueError: one line)."""

    def __init__(self, name: str, check: Callable[[str], Any]) -> None:
        self.name = name
        self._check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self._check(value)
        except ValueError as exc:
            raise BadOption(str(exc)) from None


class PairedCommand(click.Command):
    """A command whose `--host`/`--workdir` belong to the argument before them (parsed by `named`, not click)."""

    pair_options = ("--host", "--workdir")


@click.command(cls=PairedCommand, context_settings={"ignore_unknown_options": True})
@click.argument("targets", nargs=-1, type=click.UNPROCESSED, metavar="[PROFILE|NAME --host H [--workdir W]]...")
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="The port to listen on (default: a free one).")
@click.option("--address", type=Checked("address", listen_address), default=LOOPBACK, show_default=True,
              help="The IP address to listen on; any other than a loopback one is reachable by others on the network "
                   "(said on stderr).")
@click.option("--refresh", type=Checked("seconds", refresh_interval), default=5.0, show_default=True,
              help="Seconds between the page's refreshes (the targets are asked at most every 2 s whatever the "
                   "number of pages).")
@click.option("--trust-new-host", is_flag=True,
              help="Record the key of a host not yet in known_hosts (never a changed key).")
def dashboard(targets: tuple[str, ...], port: int, address: str, refresh: float, trust_new_host: bool) -> None:
    """A local web page of every deployment, fleet member and node named: state, serving, attempts, log.

    Serves on 127.0.0.1 (another address only with --address) and prints the address to open, with a one-time
    ticket that lets one browser in, as its first line (then the next one each time one is used); read-only; one
    SSH connection per host, kept open. Ctrl-C stops it.
    `--host H` / `--workdir W` after a NAME are that name's; a `--host` alone means every deployment there.
    """
    # read-only, with each profile file loaded (its engine's kind and version label the rows)
    loaded = Mode(read_only=True, remembered=False)
    def by_name(n: Named) -> Callable[[str], Deployment]:  # a row of `--host H`: that deployment, as NAME --host H
        return lambda name: resolve(name, n.host, n.workdir, trust_new_host=trust_new_host, mode=loaded)

    source = LiveSource([watched(resolve(n.arg, n.host, n.workdir, trust_new_host=trust_new_host, mode=loaded),
                                 by_name(n) if n.arg is None else None) for n in named(targets)])
    try:
        server = DashboardServer(source, DashboardConfig(address=address, port=port, refresh_s=refresh))
    except OSError as exc:
        raise BadOption(f"cannot listen on {address} port {port}: {exc.strerror or exc}") from None
    if beyond_loopback(address):
        click.echo(loud_warning(address, server.port), err=True)
    with kept_open():
        serve_until_interrupted(server, click.echo)
