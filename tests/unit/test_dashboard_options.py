"""`deploy dashboard`'s and `python -m deployer.dashboard`'s options (issue 35): `--refresh` nan, inf, <= 0 refused,
`--address` empty or not an IP address refused, an address this machine does not have or a busy port: each one
line, exit 2, no traceback; listening beyond loopback said loudly on stderr (in process, over a stand-in server: a
test never listens beyond 127.0.0.0/8)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deployer.cli import dashboard as dashboard_cli
from deployer.dashboard.options import beyond_loopback, listen_address, refresh_interval

REPO = Path(__file__).resolve().parents[2]
NOBODY = ("--host", "nobody@127.0.0.1:1")   # resolved without connecting; the options fail first or at bind


@pytest.fixture()
def busy_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


def run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEPLOYER_HOME": str(tmp_path / "home"),
           "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=str(REPO),
                          timeout=60, stdin=subprocess.DEVNULL)


BAD = [
    (("--refresh", "nan"), "--refresh 'nan': expected seconds from 1 to 3600"),
    (("--refresh", "inf"), "--refresh 'inf': expected seconds from 1 to 3600"),
    (("--refresh", "-inf"), "expected seconds from 1 to 3600"),
    (("--refresh", "0"), "expected seconds from 1 to 3600"),
    (("--refresh", "-1"), "expected seconds from 1 to 3600"),
    (("--refresh", "soon"), "--refresh 'soon' is not a number of seconds"),
    (("--address", ""), "--address is empty (that would listen on every interface)"),
    (("--address", " "), "--address is empty"),
    (("--address", "not an address"), "is not an IP address"),
    (("--address", "192.0.2.1"), "cannot listen on 192.0.2.1 port 0: Cannot assign requested address"),
]


@pytest.mark.parametrize("argv, says", BAD)
def test_a_bad_option_is_one_line_and_exit_2(tmp_path: Path, argv: tuple[str, ...], says: str) -> None:
    out = run(tmp_path, "-m", "deployer.cli", "dashboard", *NOBODY, *argv)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert says in out.stderr and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""


def test_a_busy_port_is_one_line_and_exit_2(tmp_path: Path, busy_port: int) -> None:
    out = run(tmp_path, "-m", "deployer.cli", "dashboard", *NOBODY, "--port", str(busy_port))
    assert out.returncode == 2 and out.stderr == (f"Error: cannot listen on 127.0.0.1 port {busy_port}: Address "
                                                  "already in use\n"), out.stderr
    demo = run(tmp_path, "-m", "deployer.dashboard", "--demo", "--port", str(busy_port))
    assert demo.returncode == 2 and demo.stderr.count("\n") == 1 and "Address already in use" in demo.stderr
    for argv in (("--address", ""), ("--port", "70000")):
        demo = run(tmp_path, "-m", "deployer.dashboard", "--demo", *argv)
        assert demo.returncode == 2 and demo.stderr.count("\n") == 1 and "Traceback" not in demo.stderr, demo.stderr


class StandInServer:
    """Stand-in for DashboardServer: records its config, listens nowhere."""

    made: list[Any] = []

    def __init__(self, source: Any, config: Any) -> None:
        self.config = config
        self.port = 8765
        StandInServer.made.append(config)


@pytest.mark.parametrize("address, loud", [("0.0.0.0", True), ("::", True), ("10.1.2.3", True),
                                           ("127.0.0.1", False), ("127.0.0.2", False), ("::1", False),
                                           ("localhost", False)])
def test_listening_beyond_loopback_is_said_loudly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, address: str,
                                                  loud: bool) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path))
    monkeypatch.setattr(dashboard_cli, "DashboardServer", StandInServer)
    monkeypatch.setattr(dashboard_cli, "serve_until_interrupted", lambda server, say: say("served"))
    out = CliRunner().invoke(dashboard_cli.dashboard, [*NOBODY, "--address", address])
    assert out.exit_code == 0, out.output
    assert StandInServer.made[-1].address == address
    warned = "WARNING: the dashboard listens on" in out.stderr
    assert warned == loud, out.stderr
    if loud:
        assert out.stderr.count("\n") == 1 and "not only on loopback" in out.stderr
    assert beyond_loopback(listen_address(address)) == loud


def test_the_checks_themselves() -> None:
    assert listen_address(" 127.0.0.1 ") == "127.0.0.1" and listen_address("::1") == "::1"
    assert refresh_interval("2.5") == 2.5 and refresh_interval(1) == 1.0
    for bad in ("nan", "inf", "0", "3601", ""):
        with pytest.raises(ValueError):
            refresh_interval(bad)
