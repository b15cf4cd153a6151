"""Network namespaces as test hosts: a veth link per host, faults with nftables, and a real sshd inside.

`NetHost` is one namespace `dpl<pid>x<n>` joined to this (root) namespace by a veth pair: our side `vd<pid>x<n>`
at 10.200.N.1/24, the host's `eth0` at 10.200.N.2/24. A blackhole route for 10.200.0.0/16 is in place before any
link exists, so nothing meant for a test host leaks anywhere when its link is down. Faults (see
/work/shared/ssh-notes.md: no `tc netem` here):

  partition()   nftables in the namespace drops everything on eth0 both ways (TCP stays "alive": a frozen link)
  loss(pct)     drops pct % of eth0 packets at random
  link(False)   eth0 down: the route goes, the blackhole answers
  heal()        back to normal

`net_host(tmp_path)` is a context manager that also starts an sshd inside (listening on 10.200.N.2 and on the
namespace's own 127.0.0.1, so a "colleague on the GPU box" can reach it while our link is cut) and always cleans
up: the sshd (PID namespace: all its sessions and engines die with it), nftables, the veth (deleted before the
namespace: veths are freed asynchronously), the namespace. `unavailable()` says why this machine cannot do it.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sshbed import SSHD, make_sshd, worker_slot

NET = "10.200"
SSH_PORT = 2222
_counter = itertools.count(1)
NFT_TABLE = "netbed"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def unavailable(nft: bool = False) -> str | None:
    """Why network-namespace tests cannot run here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if nft and shutil.which("nft") is None:
        return "`nft` is not installed (apt-get install nftables)"
    probe = f"dplprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class NetHost:
    """One namespace with its veth link; `sshd` is set once started."""

    index: int
    ns: str
    veth: str
    sshd: SSHD | None = None
    _nft: bool = field(default=False, repr=False)

    @property
    def addr(self) -> str:
        return f"{NET}.{self.index}.2"

    @property
    def gateway(self) -> str:
        return f"{NET}.{self.index}.1"

    def exec(self, *argv: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.ns, *argv], capture_output=True, text=True,
                              timeout=timeout)

    def nft(self, script: str) -> None:
        out = subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=script, capture_output=True,
                             text=True, timeout=20)
        if out.returncode != 0:
            raise RuntimeError(f"nft in {self.ns}: {out.stderr.strip()}")

    def _drop_rule(self, rule: str) -> None:
        self.heal()
        self.nft(f"table inet {NFT_TABLE} {{\n"
                 f"  chain rx {{\n    type filter hook input priority 0; policy accept;\n"
                 f"    iifname \"eth0\" {rule}\n  }}\n"
                 f"  chain tx {{\n    type filter hook output priority 0; policy accept;\n"
                 f"    oifname \"eth0\" {rule}\n  }}\n"
                 f"}}\n")
        self._nft = True

    def partition(self) -> None:
        """Every packet on the link dropped, both ways: connections stay open and hear nothing."""
        self._drop_rule("drop")

    def block_port(self, port: int) -> None:
        """TCP to `port` dropped on the link both ways: a connect to it times out; ssh and everything else pass."""
        self._drop_rule(f"tcp dport {int(port)} drop")

    def loss(self, percent: int) -> None:
        self._drop_rule(f"numgen random mod 100 < {int(percent)} drop")

    def heal(self) -> None:
        if self._nft:
            self.exec("nft", "delete", "table", "inet", NFT_TABLE)
            self._nft = False
        self.link(True)

    def link(self, up: bool) -> None:
        self.exec("ip", "link", "set", "eth0", "up" if up else "down")
        _ip("link", "set", self.veth, "up" if up else "down", check=False)

    def close(self) -> None:
        if self.sshd is not None:
            self.sshd.stop()
            self.sshd = None
        _ip("link", "del", self.veth, check=False)  # before the namespace: veths are freed asynchronously
        _ip("netns", "del", self.ns, check=False)


def _subnet_index() -> int:
    """The next 10.200.N subnet of this pytest-xdist worker's own slice of 1..250: two workers never build a host on
    the same subnet (two links with one address would route one test's packets to the other's host)."""
    worker, workers = worker_slot()
    width = 250 // workers
    return 1 + worker * width + next(_counter) % width


def _free_subnet_index() -> int:
    """A subnet index of this worker's slice that no link on this machine uses now (another test session running
    beside this one has the same slices)."""
    for _ in range(250):  # bounded: the slice is at most 250 wide
        index = _subnet_index()
        used = _ip("-o", "addr", "show", "to", f"{NET}.{index}.0/24", check=False)
        if used.returncode == 0 and not used.stdout.strip():
            return index
    raise RuntimeError(f"every {NET}.N subnet of this worker's slice is in use")


def create_host() -> NetHost:
    index = _free_subnet_index()
    host = NetHost(index=index, ns=f"dpl{os.getpid()}x{index}", veth=f"vd{os.getpid() % 100000}x{index}"[:15])
    _ip("route", "replace", "blackhole", f"{NET}.0.0/16")
    try:
        _ip("netns", "add", host.ns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        _ip("addr", "add", f"{host.gateway}/24", "dev", host.veth)
        _ip("link", "set", host.veth, "up")
        for args in (("addr", "add", f"{host.addr}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                     ("link", "set", "lo", "up")):
            _ip("-n", host.ns, *args)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        host.close()
        raise RuntimeError(f"cannot build net host {host.ns}: {getattr(e, 'stderr', e)}") from None
    return host


@contextlib.contextmanager
def net_host(d: Path, *, client_key: Path | None = None, private_shm: bool = False) -> Iterator[NetHost]:
    """A namespace host with a real sshd inside (port 2222 on its address and on its own loopback); with
    `private_shm` its sessions also get their own /dev/shm, as a separate machine has."""
    host = create_host()
    try:
        host.sshd = make_sshd(d, addr=host.addr, port=SSH_PORT, netns=host.ns, client_key=client_key,
                              extra_config=[f"ListenAddress 127.0.0.1:{SSH_PORT}"], private_shm=private_shm)
        yield host
    finally:
        host.heal()
        host.close()


def processes_under(path: Path) -> list[int]:
    """Live processes whose working directory or command line is under `path` (a deployment's workdir)."""
    found = []
    prefix = str(path)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode("utf-8", "replace")
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                zombie = f.read().rsplit(")", 1)[-1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and (cwd.startswith(prefix) or prefix in cmdline):
            found.append(int(entry))
    return found


FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
FORWARD_USERS = Path("/run/deployer-tests-ip-forward")  # one line per holder pid: parallel workers share the knob


@contextlib.contextmanager
def _forwarding() -> Iterator[None]:
    """ip_forward on while any test process needs it; the last one out puts back what the first one found (a
    plain save-and-restore per test would turn forwarding off under another worker's routed hosts)."""
    with _users_locked() as users:
        if not users:
            (FORWARD_USERS.with_suffix(".before")).write_text(FORWARD.read_text())
        users.append(str(os.getpid()))
        FORWARD.write_text("1\n")
    try:
        yield
    finally:
        with _users_locked() as users:
            users.remove(str(os.getpid()))
            if not users:
                FORWARD.write_text(FORWARD_USERS.with_suffix(".before").read_text())


@contextlib.contextmanager
def _users_locked() -> Iterator[list[str]]:
    """The holders' list, under an exclusive lock, written back when the block ends; holders whose process is gone
    (a killed worker) are dropped."""
    FORWARD_USERS.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(FORWARD_USERS.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = FORWARD_USERS.read_text() if FORWARD_USERS.exists() else ""
        users = [pid for pid in text.split() if Path(f"/proc/{pid}").exists()]
        yield users
        FORWARD_USERS.write_text("".join(f"{pid}\n" for pid in users))
    finally:
        os.close(fd)


@contextlib.contextmanager
def routed(hosts: list[NetHost]) -> Iterator[None]:
    """The hosts reach each other (a fleet's router its replicas) through this namespace, which forwards between
    their links while the block runs (ip_forward is put back as it was once no test process routes any more)."""
    with _forwarding():
        for host in hosts:
            _ip("-n", host.ns, "route", "replace", f"{NET}.0.0/16", "via", host.gateway)
        yield
