"""Exec-channel plumbing for SSHRemote: feeding stdin, collecting output under a deadline, and the
line-reading `SSHSession` returned by spawn()."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from typing import TYPE_CHECKING

from deployer.errors import RemoteError
from deployer.remote.base import LineReader

if TYPE_CHECKING:
    import paramiko


def text(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


class SSHSession(LineReader):
    """A remote command with an open stdin over an exec channel; stdout and stderr merged."""

    def __init__(self, chan: paramiko.Channel, label: str) -> None:
        super().__init__(label)
        self._chan = chan

    def _recv(self, wait: float) -> bytes | None:
        self._chan.settimeout(wait)
        try:
            return bytes(self._chan.recv(65536))
        except socket.timeout:
            return None
        except OSError as e:
            raise RemoteError(f"session lost: {e}", host=self._label) from None

    def send(self, data: bytes) -> None:
        if self._closed or self._chan.closed:
            raise RemoteError("session closed", host=self._label)
        self._chan.settimeout(5.0)
        try:
            self._chan.sendall(data)
        except (OSError, EOFError) as e:
            raise RemoteError(f"session lost: {e or type(e).__name__}", host=self._label) from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._chan.shutdown_write()  # the remote command sees EOF on stdin
            self._chan.status_event.wait(2.0)  # let it finish (e.g. release a lock) before we hang up
        with contextlib.suppress(Exception):
            self._chan.close()


def send_stdin(chan: paramiko.Channel, data: bytes | None, deadline: float) -> None:
    """Send `data` then EOF. A command that exits without reading closes the channel: not our error."""
    if data:
        chan.settimeout(max(0.001, deadline - time.monotonic()))
        with contextlib.suppress(OSError):
            chan.sendall(data)
    with contextlib.suppress(OSError, EOFError):
        chan.shutdown_write()


def _drain(chan: paramiko.Channel, out: bytearray, err: bytearray) -> bool:
    got = False
    while chan.recv_ready():
        out += chan.recv(65536)
        got = True
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)
        got = True
    return got


def collect(chan: paramiko.Channel, out: bytearray, err: bytearray, deadline: float) -> bool:
    """Read stdout/stderr until the command exits; False if the deadline passed or the channel died first."""
    while True:
        if _drain(chan, out, err):
            continue
        left = deadline - time.monotonic()
        if chan.eof_received:
            done = chan.status_event.wait(max(0.0, left))
            _drain(chan, out, err)
            return done and chan.exit_status_ready() and not (chan.closed and not chan.eof_received)
        if chan.closed or left <= 0:
            return False
        select.select([chan], [], [], min(left, 1.0))
