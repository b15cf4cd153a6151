"""A hung host (sshd frozen, the kernel still ACKs): only operation timeouts can notice. Every call must end,
bounded, with a clear ConnectFailed, and work again once the host thaws."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from deployer.remote.ssh import connection as remote_ssh
from deployer.errors import ConnectFailed, RemoteError
from deployer.remote.connect import connect

pytestmark = pytest.mark.integration


def sshd_processes(bed: Any) -> list[int]:
    """Every process in the sshd's PID namespace (the master and each connection's sshd), by host pid."""
    root = bed.proc.pid
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        try:
            children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            children = []
        for child in children:
            comm = open(f"/proc/{child}/comm").read().strip()
            if comm.startswith("sshd"):
                found.append(int(child))
            queue.append(int(child))
    return found


@contextmanager
def frozen(bed: Any) -> Iterator[None]:
    pids = sshd_processes(bed)
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_calls_to_a_hung_host_end_with_a_clear_error(fresh_sshd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_ssh, "SFTP_TIMEOUT_S", 2.0)
    remote = connect(fresh_sshd.spec())
    try:
        assert remote.size("/etc/hostname") is not None  # SFTP and a channel are open and working
        with frozen(fresh_sshd):
            for call in (lambda: remote.size("/etc/hostname"), lambda: remote.read("/etc/hostname"),
                         lambda: remote.run("true", timeout=2)):
                t0 = time.monotonic()
                with pytest.raises(RemoteError) as info:
                    call()
                assert time.monotonic() - t0 < 12, info.value
                message = str(info.value)
                assert "no answer" in message or "no SSH answer" in message or "timed out" in message, message
        assert remote.run("echo back", timeout=10).stdout.strip() == "back"  # thawed: usable again
    finally:
        remote.close()



def test_first_sftp_timeout_is_a_connect_failure(fresh_sshd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_ssh, "SFTP_TIMEOUT_S", 1.5)
    remote = connect(fresh_sshd.spec())
    try:
        remote.size("/etc/hostname")
        with frozen(fresh_sshd):
            t0 = time.monotonic()
            with pytest.raises(ConnectFailed, match=r"stat /etc/hostname: no answer within 1.5s"):
                remote.size("/etc/hostname")
            assert time.monotonic() - t0 < 5
    finally:
        remote.close()
