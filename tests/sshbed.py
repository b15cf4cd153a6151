"""A real OpenSSH sshd on loopback for integration tests.

Each `SSHD` runs `/usr/sbin/sshd -D` as PID 1 of its own PID namespace (via `unshare`), so stopping it
(SIGKILL) makes the kernel end every session and process started through it: nothing outlives the tests.
Keys, known_hosts, ssh_config, authorized_keys, the log and the pid file all live in one temp dir; the real
~/.ssh is never read or written. Sessions see a fixed environment whose PATH starts with `bin_dir`, where
tests drop stand-in tools (e.g. `nvidia-smi`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.remote.base import TargetSpec

SSHD_BIN = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ALIAS = "deployer-test"
JUMP_ALIAS = "deployer-test-via-jump"
START_TIMEOUT = 10.0


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def keygen(path: Path, comment: str = "deployer-test") -> Path:
    """An ed25519 key pair without passphrase at `path` / `path.pub`."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path


def public_key(path: Path) -> str:
    """`type base64` of the public half of the key at `path` (comment dropped)."""
    kind, blob = Path(f"{path}.pub").read_text().split()[:2]
    return f"{kind} {blob}"


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _sshd_config(d: Path, addr: str, port: int, host_key: Path, bin_dir: Path, extra: list[str]) -> str:
    return "\n".join(
        [
            *extra,  # sshd keeps the first value it reads for an option
            f"ListenAddress {addr}:{port}",
            f"HostKey {host_key}",
            f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}",
            f"Subsystem sftp {SFTP_SERVER}",
            # SHLVL=1 makes bash skip ~/.bashrc for ssh commands (it only sources it at level < 2): root's
            # real bashrc here prepends pyenv/cargo dirs to PATH and costs ~120 ms per command.
            f"SetEnv PATH={bin_dir}:{SYSTEM_PATH} SHLVL=1",
            "StrictModes no",
            "UsePAM no",
            "UseDNS no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "AllowTcpForwarding yes",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "LogLevel VERBOSE",
            "",
        ]
    )


@dataclass
class SSHD:
    """One running sshd and every file a client needs to reach it."""

    dir: Path
    host: str
    port: int
    host_key: Path
    identity_file: Path
    known_hosts: Path
    ssh_config: Path
    bin_dir: Path
    log: Path
    user: str = "root"
    extra_config: list[str] = field(default_factory=list)
    netns: str | None = None  # run inside this network namespace (tests/netbed.py)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def spec(self, **overrides: Any) -> TargetSpec:
        """A TargetSpec for this sshd; never falls back to the real ~/.ssh."""
        kw: dict[str, Any] = dict(
            host=self.host,
            user=self.user,
            port=self.port,
            identity_file=str(self.identity_file),
            known_hosts=str(self.known_hosts),
            ssh_config=str(self.ssh_config),
            connect_timeout=5.0,
        )
        kw.update(overrides)
        return TargetSpec(**kw)

    def target(self, workdir: str | os.PathLike[str]) -> dict[str, Any]:
        """The `target:` mapping of a profile pointing at this sshd."""
        return {
            "host": self.host,
            "user": self.user,
            "port": self.port,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts),
            "workdir": str(workdir),
        }

    def log_count(self, needle: str) -> int:
        """How many sshd log lines contain `needle` (e.g. 'Accepted publickey')."""
        try:
            return sum(needle in line for line in self.log.read_text(errors="replace").splitlines())
        except FileNotFoundError:
            return 0

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # privilege-separation dir
        cfg = self.dir / "sshd_config"
        cfg.write_text(_sshd_config(self.dir, self.host, self.port, self.host_key, self.bin_dir, self.extra_config))
        argv = [SSHD_BIN, "-D", "-f", str(cfg), "-E", str(self.log)]
        if shutil.which("unshare"):
            argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        # A bare environment: nothing from the test process leaks into sessions.
        self.proc = subprocess.Popen(
            argv,
            env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "sshd.stderr", "ab"),
            start_new_session=True,
        )
        self._wait_for_banner()

    def _wait_for_banner(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            with contextlib.suppress(OSError):
                with socket.create_connection((self.host, self.port), timeout=1.0) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return
            time.sleep(0.02)
        err = (self.dir / "sshd.stderr").read_text(errors="replace")
        log = self.log.read_text(errors="replace") if self.log.exists() else ""
        self.stop()
        raise RuntimeError(f"sshd on {self.host}:{self.port} did not start: {err} {log}")

    def stop(self) -> None:
        """SIGKILL the namespace's PID 1 (and so every session), and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listening daemon), as seen from this namespace."""
        if self.proc is None:
            return []
        listeners = _children(self.proc.pid) if shutil.which("unshare") else [self.proc.pid]
        # orphans (the engines' supervisors) are re-parented to the namespace's init, the daemon: keep sshd's own
        return [pid for listener in listeners for pid in _children(listener) if _comm(pid) == "sshd"]

    def drop_connections(self) -> int:
        """SIGKILL every client connection's sshd process, as a dropped link would end them; the daemon (and
        the engines its sessions started) stay. Returns how many were dropped."""
        pids = self.session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    @contextlib.contextmanager
    def second_host_key_sshd(self) -> Iterator[SSHD]:
        """Another sshd whose known_hosts still lists THIS sshd's key under the new one's address.

        From the client's side that is exactly a host whose key changed: known_hosts says key A for
        [127.0.0.1]:port, the server there presents key B.
        """
        other = make_sshd(self.dir / f"second-{time.monotonic_ns()}", client_key=self.identity_file)
        name = known_hosts_name(other.host, other.port)
        other.known_hosts.write_text(f"{name} {public_key(self.host_key)}\n")
        try:
            yield other
        finally:
            other.stop()


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _write_ssh_config(d: Path, host: str, port: int, identity: Path, known_hosts: Path) -> Path:
    path = d / "ssh_config"
    path.write_text(
        f"Host {ALIAS}\n"
        f"    HostName {host}\n"
        f"    Port {port}\n"
        f"    User root\n"
        f"    IdentityFile {identity}\n"
        f"    UserKnownHostsFile {known_hosts}\n"
        f"\n"
        f"Host {JUMP_ALIAS}\n"
        f"    HostName {host}\n"
        f"    Port {port}\n"
        f"    User root\n"
        f"    IdentityFile {identity}\n"
        f"    UserKnownHostsFile {known_hosts}\n"
        f"    ProxyJump {ALIAS}\n"
    )
    return path


def make_sshd(
    d: Path, *, addr: str = "127.0.0.1", client_key: Path | None = None, extra_config: list[str] | None = None,
    port: int | None = None, netns: str | None = None,
) -> SSHD:
    """Create keys and files under `d` and start an sshd on a free port of `addr`.

    `extra_config`: sshd_config lines that take precedence over the defaults (e.g. "AllowTcpForwarding no").
    `netns`: start it inside that network namespace, on `port` (a free port of this namespace is meaningless there).
    """
    d.mkdir(parents=True, exist_ok=True)
    host_key = keygen(d / "host_ed25519", "deployer-test-host")
    identity = client_key or keygen(d / "id_ed25519")
    (d / "authorized_keys").write_text(public_key(identity) + "\n")
    bin_dir = d / "bin"
    bin_dir.mkdir(exist_ok=True)
    port = port or free_port(addr)
    known_hosts = d / "known_hosts"
    known_hosts.write_text(f"{known_hosts_name(addr, port)} {public_key(host_key)}\n")
    bed = SSHD(
        dir=d,
        host=addr,
        port=port,
        host_key=host_key,
        identity_file=identity,
        known_hosts=known_hosts,
        ssh_config=_write_ssh_config(d, addr, port, identity, known_hosts),
        bin_dir=bin_dir,
        log=d / "sshd.log",
        extra_config=list(extra_config or []),
        netns=netns,
    )
    bed.start()
    return bed
