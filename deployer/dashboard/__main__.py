"""`python -m deployer.dashboard --demo [DIR]`: the dashboard over a directory of JSON files (StaticSource),
the packaged demo data when DIR is not given. Prints the URL to open (token included) as its first stdout line,
then serves until interrupted. `deploy dashboard` (the real targets) is wired in deployer/cli.
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources import as_file, files
from pathlib import Path
from typing import NoReturn

from deployer.dashboard.options import beyond_loopback, listen_address, loud_warning
from deployer.dashboard.server import LOOPBACK, DashboardConfig, DashboardServer, serve_until_interrupted
from deployer.dashboard.source import StaticSource


def _port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 5 or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{ascii(text[:20])} is not a port from 0 to 65535")
    return int(text)


def _address(text: str) -> str:
    try:
        return listen_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A bad argument: one line, exit 2 (not the usage block)."""
        self.exit(2, f"{self.prog}: {message}\n")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="python -m deployer.dashboard", description=__doc__)
    parser.add_argument("--demo", nargs="?", const="", required=True, metavar="DIR",
                        help="serve DIR/overview.json, DIR/deployments/*.json, DIR/logs/*.log (default: the demo)")
    parser.add_argument("--port", type=_port, metavar="PORT", default=0,
                        help="the port (default: a free one)")
    parser.add_argument("--address", type=_address, default=LOOPBACK,
                        help="the address to listen on (default 127.0.0.1; anything else is reachable by others)")
    return parser.parse_args(argv)


def serve(directory: Path, config: DashboardConfig) -> None:
    try:
        server = DashboardServer(StaticSource.from_dir(directory), config)
    except OSError as exc:
        print(f"python -m deployer.dashboard: cannot listen on {config.address} port {config.port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        sys.exit(2)
    if beyond_loopback(config.address):
        print(loud_warning(config.address, server.port), file=sys.stderr, flush=True)
    serve_until_interrupted(server, lambda url: print(url, flush=True))


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    config = DashboardConfig(address=args.address, port=args.port)
    if args.demo:
        serve(Path(args.demo), config)
        return
    with as_file(files("deployer.dashboard").joinpath("demo")) as directory:
        serve(Path(directory), config)


if __name__ == "__main__":
    main()
