"""Several hosts for multi-host tests: one real sshd per loopback address (127.0.0.2, 127.0.0.3, ...).

Each host is an `SSHD` from tests/sshbed.py with its own host key, workdir and `bin` dir; all of them accept
one client key and are named `node-0`, `node-1`, ... in one ssh_config (with one known_hosts listing every
host key), so `ssh -F <bed.ssh_config> node-1 CMD` reaches the second host. `host_bed()` stops every sshd it
started (and so, by their PID namespaces, everything started through them), also when starting one fails.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sshbed import SSHD, keygen, known_hosts_name, make_sshd, public_key

FIRST_ADDR = 2  # 127.0.0.1 stays for the single-host bed and the test process itself
SSH_TIMEOUT_S = 30.0


@dataclass
class Host:
    """One host of the bed: its alias, its sshd and a workdir private to it."""

    alias: str
    sshd: SSHD
    workdir: Path

    @property
    def addr(self) -> str:
        return self.sshd.host


@dataclass
class HostBed:
    """N hosts reachable with one ssh_config, one identity and one known_hosts."""

    hosts: list[Host]
    ssh_config: Path
    identity_file: Path
    known_hosts: Path
    nets: list[Any] = field(default_factory=list)   # net_host_bed: each host's netbed.NetHost (its faults)

    def ssh_argv(self, alias: str, command: str) -> list[str]:
        """argv of a plain OpenSSH client running `command` on the host named `alias`."""
        return ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", alias, command]

    def run(self, alias: str, command: str, timeout: float = SSH_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.ssh_argv(alias, command), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def popen(self, alias: str, command: str, log: Path) -> subprocess.Popen[bytes]:
        """A long-running ssh session (e.g. an engine in the foreground), its output appended to `log`."""
        with open(log, "ab") as out:
            return subprocess.Popen(self.ssh_argv(alias, command), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)


def _write_client_files(d: Path, hosts: list[Host], identity: Path) -> tuple[Path, Path]:
    known_hosts = d / "known_hosts"
    known_hosts.write_text("".join(f"{known_hosts_name(h.addr, h.sshd.port)} {public_key(h.sshd.host_key)}\n"
                                   for h in hosts))
    blocks = [
        f"Host {h.alias}\n"
        f"    HostName {h.addr}\n"
        f"    Port {h.sshd.port}\n"
        f"    User {h.sshd.user}\n"
        f"    IdentityFile {identity}\n"
        f"    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known_hosts}\n"
        f"    StrictHostKeyChecking yes\n"
        for h in hosts
    ]
    ssh_config = d / "ssh_config"
    ssh_config.write_text("\n".join(blocks))
    return ssh_config, known_hosts


@contextlib.contextmanager
def host_bed(d: Path, count: int = 2) -> Iterator[HostBed]:
    """Start `count` sshds on 127.0.0.2.. under `d`; stop all of them on exit, whatever happened."""
    if not 1 <= count <= 250:
        raise ValueError(f"host_bed: count must be 1..250, got {count}")
    d.mkdir(parents=True, exist_ok=True)
    identity = keygen(d / "id_ed25519", "deployer-hostbed")
    hosts: list[Host] = []
    try:
        for i in range(count):
            host_dir = d / f"node-{i}"
            sshd = make_sshd(host_dir, addr=f"127.0.0.{FIRST_ADDR + i}", client_key=identity)
            workdir = host_dir / "work"
            workdir.mkdir()
            hosts.append(Host(alias=f"node-{i}", sshd=sshd, workdir=workdir))
        ssh_config, known_hosts = _write_client_files(d, hosts, identity)
        yield HostBed(hosts=hosts, ssh_config=ssh_config, identity_file=identity, known_hosts=known_hosts)
    finally:
        for host in hosts:
            host.sshd.stop()


@contextlib.contextmanager
def net_host_bed(d: Path, count: int = 2) -> Iterator[HostBed]:
    """`count` hosts the way real ones are: each in its own network namespace (tests/netbed.py), sshd on port 2222
    of every one, its own /dev/shm, routed to the others, named node-0.. in one ssh_config. A port is free or taken
    per host, as on separate machines: every host can serve the same engine port."""
    from netbed import net_host, routed

    d.mkdir(parents=True, exist_ok=True)
    identity = keygen(d / "id_ed25519", "deployer-netbed")
    with contextlib.ExitStack() as stack:
        nets = [stack.enter_context(net_host(d / f"node-{i}", client_key=identity, private_shm=True))
                for i in range(count)]
        stack.enter_context(routed(nets))
        hosts = []
        for i, net in enumerate(nets):
            assert net.sshd is not None
            workdir = d / f"node-{i}" / "work"
            workdir.mkdir()
            hosts.append(Host(alias=f"node-{i}", sshd=net.sshd, workdir=workdir))
        ssh_config, known_hosts = _write_client_files(d, hosts, identity)
        yield HostBed(hosts=hosts, ssh_config=ssh_config, identity_file=identity, known_hosts=known_hosts, nets=nets)
