"""The multi-host test bed (tests/hostbed.py): distinct hosts behind one ssh_config, and nothing left behind."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import hostbed
import sshbed
from hostbed import host_bed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _listening(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=1.0):
            return True
    except OSError:
        return False


def _closes(addr: str, port: int, deadline_s: float = 5.0) -> bool:
    """Whether nothing listens there within the deadline (a SIGKILLed namespace takes a moment to go)."""
    end = time.monotonic() + deadline_s
    while _listening(addr, port):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_each_host_is_its_own_address_key_and_workdir(tmp_path: Path) -> None:
    with host_bed(tmp_path / "hosts", 3) as bed:
        assert [h.addr for h in bed.hosts] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        assert len({h.sshd.host_key.read_text() for h in bed.hosts}) == 3
        assert len({h.workdir for h in bed.hosts}) == 3 and all(h.workdir.is_dir() for h in bed.hosts)
        for host in bed.hosts:
            # one ssh_config, strict host key checking: the alias reaches that host's sshd and no other
            result = bed.run(host.alias, f'echo "$SSH_CONNECTION" > {host.workdir}/seen; cat {host.workdir}/seen')
            assert result.returncode == 0, result.stderr
            server_addr, server_port = result.stdout.split()[2:4]
            assert (server_addr, int(server_port)) == (host.addr, host.sshd.port)


def test_a_host_key_of_another_host_is_refused(tmp_path: Path) -> None:
    with host_bed(tmp_path / "hosts", 2) as bed:
        first, second = bed.hosts
        # node-0's name with node-1's endpoint: known_hosts has no such key for that endpoint -> refused
        argv = ["ssh", "-F", str(bed.ssh_config), "-o", "BatchMode=yes", "-o", f"Port={second.sshd.port}",
                "-o", f"HostKeyAlias=[{first.addr}]:{first.sshd.port}", "-o", f"HostName={second.addr}",
                first.alias, "true"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert result.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in result.stderr, result.stderr


def test_everything_started_through_the_bed_ends_with_it(tmp_path: Path) -> None:
    with host_bed(tmp_path / "hosts", 2) as bed:
        ports = [(h.addr, h.sshd.port) for h in bed.hosts]
        host = bed.hosts[1]
        # a detached listener on the host, as an engine would be
        bed.run(host.alias, f"cd {host.workdir}; setsid nohup python3 -c 'import socket,time;"
                f"s=socket.socket();s.bind((\"{host.addr}\",0));s.listen();"
                f"f=open(\"port\",\"w\");f.write(str(s.getsockname()[1]));f.close();time.sleep(600)' "
                "</dev/null >/dev/null 2>&1 &")
        port_file = host.workdir / "port"
        deadline = time.monotonic() + 10
        while not port_file.exists() or not port_file.read_text():
            assert time.monotonic() < deadline, "the listener never started"
            time.sleep(0.05)
        child_port = int(port_file.read_text())
        assert _listening(host.addr, child_port)
    assert all(_closes(addr, port) for addr, port in ports)
    assert _closes(host.addr, child_port)


def test_a_failing_start_stops_the_hosts_already_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    real = sshbed.make_sshd

    def second_fails(d: Path, **kw: Any) -> sshbed.SSHD:
        if started:
            raise RuntimeError("sshd did not start")
        sshd = real(d, **kw)
        started.append(sshd.port)
        return sshd

    monkeypatch.setattr(hostbed, "make_sshd", second_fails)
    with pytest.raises(RuntimeError, match="did not start"):
        with host_bed(tmp_path / "hosts", 2):
            pass
    assert started and _closes("127.0.0.2", started[0])
