"""`deploy top`: a live view of one or more deployments (one row per replica or node), refreshed every --interval
seconds over connections kept open (one per host) until q or Ctrl-C; `--once` looks once (`--json` for scripts).
The terminal is put in cbreak mode on the alternate screen and restored however the view ends."""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import click

from deployer.cli import show
from deployer.cli.options import _target_options
from deployer.deployments.base import Deployment
from deployer.deployments.resolve import READ, resolve
from deployer.deployments.top import TopRow
from deployer.errors import DeployError
from deployer.logtext import printable
from deployer.output.edge import styled_stdout
from deployer.output.top import table
from deployer.remote.connect import kept_open

QUIT_KEYS = (b"q", b"Q", b"\x03")   # \x03: Ctrl-C where the terminal does not turn it into SIGINT


@dataclass(frozen=True)
class Look:
    """Every target's rows at one look; a target that could not be read is a problem line and its exit code."""

    rows: list[TopRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    exit_code: int = 0
    nothing_found: list[str] = field(default_factory=list)  # host-wide looks that found nothing: where they looked


@dataclass(frozen=True)
class Watched:
    label: str
    deployment: Deployment


def _one(target: Watched) -> Look:
    try:
        report = target.deployment.top()
    except DeployError as e:
        return Look(problems=[f"{target.label}: {e}"], exit_code=e.exit_code)
    return Look(report.rows, exit_code=report.exit_code,
                nothing_found=[report.nothing_found] if report.nothing_found else [])


def look(targets: Sequence[Watched]) -> Look:
    """Each target's top at once (one thread each; the hosts' connections are kept open by the caller)."""
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        looks = list(pool.map(_one, targets))
    code = next((one.exit_code for one in looks if one.exit_code), 0)
    return Look([r for one in looks for r in one.rows], [p for one in looks for p in one.problems], code,
                [n for one in looks for n in one.nothing_found])


@click.command()
@click.argument("targets", nargs=-1)
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]",
              help="The host of deployments given by name (only --host: every deployment there).")
@click.option("--workdir", default=None, help="Workdir on the target (default: the profile's or /workspace/deployer).")
@_target_options
@click.option("--once", is_flag=True, help="Look once, print and exit (with the exit code `status` would give).")
@click.option("--json", "as_json", is_flag=True, help="With --once: the rows as JSON.")
@click.option("--interval", type=click.FloatRange(0.5, 3600), default=2.0, show_default=True,
              help="Seconds between refreshes.")
def top(targets: tuple[str, ...], host: str | None, workdir: str | None, trust_new_host: bool, once: bool,
        as_json: bool, interval: float) -> None:
    """A live view of deployments, like htop: per replica or node its state, requests, tokens/s, KV cache, p99
    latency and restarts (q or Ctrl-C quits); --once --json for scripts."""
    if as_json and not once:
        raise click.UsageError("--json needs --once (the live view is for a terminal)")
    if not targets and not host:
        raise click.UsageError("give PROFILE or NAME (with --host), or --host alone for every deployment there")
    if not once and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise click.UsageError("the live view needs a terminal; use --once (with --json in scripts)")
    chosen = [Watched(t or str(host), resolve(t, host, workdir, trust_new_host=trust_new_host, mode=READ))
              for t in (targets or (None,))]
    ctx = click.get_current_context()
    with kept_open():
        if once:
            seen = look(chosen)
            _print_once(seen, as_json)
            ctx.exit(seen.exit_code)
        _live(lambda: look(chosen), interval)
    ctx.exit(0)


def _print_once(seen: Look, as_json: bool) -> None:
    for line in seen.nothing_found:
        click.echo(f"deploy: {line}", err=True)
    if as_json:
        show.emit_json({"at": time.time(), "rows": [r.to_json() for r in seen.rows], "problems": seen.problems})
        return
    for line in table(seen.rows, seen.problems):
        click.echo(line)


def _live(refresh: Callable[[], Look], interval: float) -> None:
    with _screen() as fd:
        try:
            while True:
                seen = refresh()
                when = time.strftime("%H:%M:%S")
                lines = [f"deploy top: {len(seen.rows)} engines at {when}, every {interval:g}s (q quits)", "",
                         *table(seen.rows, seen.problems), *seen.nothing_found]
                screen = styled_stdout()   # its own escape sequences; the text stripped here
                screen.write("\x1b[H\x1b[2J" + "\r\n".join(printable(line) for line in lines) + "\r\n")
                screen.flush()
                if _quit_pressed(fd, interval):
                    return
        except KeyboardInterrupt:
            return


@contextmanager
def _screen() -> Iterator[int]:
    """The terminal in cbreak mode (keys one by one, no echo) on the alternate screen, restored on the way out."""
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    styled_stdout().write("\x1b[?1049h\x1b[?25l")
    styled_stdout().flush()
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        styled_stdout().write("\x1b[?25h\x1b[?1049l")
        styled_stdout().flush()


def _quit_pressed(fd: int, wait_s: float) -> bool:
    """Whether q (or EOF) came within `wait_s`; other keys are ignored."""
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return False
        key = os.read(fd, 1)
        if not key or key in QUIT_KEYS:
            return True
    return False
