"""`python -m deployer.dashboard --demo [DIR]`: the dashboard over a directory of JSON files (StaticSource),
the packaged demo data when DIR is not given. Prints the URL to open (token included) as its first stdout line,
then serves until interrupted. `deploy dashboard` (the real targets) is wired in deployer/cli.
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources import as_file, files
from pathlib import Path

from deployer.dashboard.server import LOOPBACK, DashboardConfig, DashboardServer, serve_until_interrupted
from deployer.dashboard.source import StaticSource


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deployer.dashboard", description=__doc__)
    parser.add_argument("--demo", nargs="?", const="", required=True, metavar="DIR",
                        help="serve DIR/overview.json, DIR/deployments/*.json, DIR/logs/*.log (default: the demo)")
    parser.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    parser.add_argument("--address", default=LOOPBACK,
                        help="the address to listen on (default 127.0.0.1; anything else is reachable by others)")
    return parser.parse_args(argv)


def serve(directory: Path, config: DashboardConfig) -> None:
    serve_until_interrupted(DashboardServer(StaticSource.from_dir(directory), config),
                            lambda url: print(url, flush=True))


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
