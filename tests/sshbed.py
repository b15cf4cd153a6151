"""A real OpenSSH sshd on loopback for integration tests.

Each `SSHD` runs `/usr/sbin/sshd -D` as PID 1 of its own PID namespace (via `unshare`), so stopping it
(SIGKILL) makes the kernel end every session and process started through it: nothing outlives the tests.
Keys, known_hosts, ssh_config, authorized_keys, the log and the pid file all live in one temp dir; the real
~/.ssh is never read or written. Sessions see a fixed environment whose PATH starts with `bin_dir`, where
tests drop stand-in tools (e.g. `nvidia-smi`).

Sessions get HOME = a bed-private home (`SSHD.home`), so nothing a test leaves under ~ on the "target" reaches
the real user's home or another bed. By default sessions skip ~/.bashrc (SHLVL=1): quick. A bed made
with `rc_cost=` is as slow as a real GPU image instead: its home gets a `.bashrc` that
runs a Python "shell hook" and evals what it prints, the way conda's and pyenv's init do, calibrated to cost
about `rc_cost` seconds per command; nothing sets SHLVL, so every exec channel and every SFTP session (sshd
runs the subsystem through the login shell too) pays it. The real ~/.bashrc is never read or written.
`SSHD.sessions_since()` counts what a client opened, from sshd's own VERBOSE log.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import statistics
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.host import TargetSpec

SSHD_BIN = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ALIAS = "deployer-test"
JUMP_ALIAS = "deployer-test-via-jump"
START_TIMEOUT = 10.0


_HANDED_OUT: set[int] = set()
_PORTS = random.Random()  # its own generator: pytest-randomly reseeds the global one identically in every worker
PORT_FLOOR = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(addr: str, port: int) -> bool:
    for where in {addr, "0.0.0.0"}:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((where, port))
            except OSError:
                return False
    return True


def worker_slot() -> tuple[int, int]:
    """(this pytest-xdist worker's index, the number of workers); (0, 1) outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    return index % max(count, 1), max(count, 1)


def port_range() -> range:
    """This worker's own slice of the ports below the kernel's ephemeral range: parallel workers never pick the
    same port, so a port free when it is checked is not taken by another worker before it is used."""
    low = max(_ephemeral_low(), PORT_FLOOR + 2000)
    index, count = worker_slot()
    width = (low - PORT_FLOOR) // count
    start = PORT_FLOOR + index * width
    return range(start, start + width)


def free_port(addr: str = "127.0.0.1") -> int:
    """A port free on `addr` (and on the wildcard), in this worker's slice below the kernel's ephemeral range and
    never handed out twice in this process. A port from the ephemeral range (what binding port 0 gives) can become
    the source port of any outgoing connection between this call and the port's use; a CI run lost a test to
    exactly that."""
    ports = port_range()
    for _ in range(500):  # bounded: the slice has hundreds of ports, nearly all free
        port = _PORTS.randrange(ports.start, ports.stop)
        if port not in _HANDED_OUT and _bindable(addr, port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} after 500 tries")


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


STAND_IN_CRONTAB = """#!/bin/bash
# stand-in crontab(1) of the test bed: -l prints the table, - (or no argument) reads it from stdin, -r removes
# it; the table is one file of the bed ({table}), so a test never touches the real user's crontab
table={table}
case "${{1:--}}" in
  -l) [ -f "$table" ] || {{ echo "no crontab for $(id -un)" >&2; exit 1; }}; cat "$table" ;;
  -) cat > "$table.new" && mv "$table.new" "$table" ;;
  -r) rm -f "$table" ;;
  *) echo "crontab: usage: crontab [-l|-r|-]" >&2; exit 1 ;;
esac
"""


def write_stand_in_crontab(bin_dir: Path, table: Path) -> None:
    """Puts the stand-in `crontab` first on the bed's PATH: `up`'s @reboot entry (restart.on_boot) lands in
    `table`, never in the user's real crontab."""
    path = bin_dir / "crontab"
    path.write_text(STAND_IN_CRONTAB.format(table=shlex.quote(str(table))))
    path.chmod(0o755)


def _session_env(bin_dir: Path, home: Path, rc_file: bool) -> str:
    """sshd's SetEnv line. HOME is always the bed's own (what a session keeps under ~, the helper's cache, a hub
    cache, is per bed, never the real user's nor another test's). Without an rc file, SHLVL=1 makes bash skip
    ~/.bashrc as well (it only sources it at level < 2); with one, nothing skips it."""
    if rc_file:
        return f"SetEnv PATH={bin_dir}:{SYSTEM_PATH} HOME={home}"
    return f"SetEnv PATH={bin_dir}:{SYSTEM_PATH} HOME={home} SHLVL=1"


def _sshd_config(
    d: Path, addr: str, port: int, host_key: Path, bin_dir: Path, extra: list[str], home: Path, rc_file: bool
) -> str:
    return "\n".join(
        [
            *extra,  # sshd keeps the first value it reads for an option
            f"ListenAddress {addr}:{port}",
            f"HostKey {host_key}",
            f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}",
            f"Subsystem sftp {SFTP_SERVER}",
            _session_env(bin_dir, home, rc_file),
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


# -- a login shell that costs what a real GPU image's does -------------------------------------------------

HOOK_PY = textwrap.dedent(
    """\
    # A stand-in for `conda shell.bash hook` / `pyenv init -`, written by tests/sshbed.py: a Python start-up
    # with imports, some work (ROUNDS, calibrated to the bed's rc_cost), and shell code for bash to eval.
    import hashlib, json, os, re, sys

    ROUNDS = int(sys.argv[1])
    root = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256(json.dumps({"root": root, "envs": ["base", "py311"]}).encode())
    block = bytes(4096)
    for _ in range(ROUNDS):
        digest.update(block)
    safe = re.sub(r"[^A-Za-z0-9_/.-]", "_", root)
    print(f'export BED_RC_ROOT="{safe}"')
    print(f'export BED_RC_DIGEST="{digest.hexdigest()[:12]}"')
    print(f'export PATH="{safe}/condabin:$PATH"')
    print('bed_activate() { export BED_ENV="${1:-base}"; }')
    """
)


def _bashrc(init_dir: Path, rounds: int) -> str:
    """The bed's ~/.bashrc: eval a Python hook's output (as conda's init block does) and note the run."""
    hook, runs = shlex.quote(str(init_dir / "hook.py")), shlex.quote(str(init_dir / "runs"))
    return (
        "# written by tests/sshbed.py: costs like a conda/pyenv init block, on every ssh command\n"
        f'__bed_setup="$(/usr/bin/python3 {hook} {rounds} 2>/dev/null)"\n'
        'if [ $? -eq 0 ]; then eval "$__bed_setup"; fi\n'
        "unset __bed_setup\n"
        f'printf "%s\\n" "$$" >> {runs}\n'
    )


def _timed_bash(home: Path, cmd: str, reps: int = 5) -> float:
    """Median wall time of `bash -c cmd` in a bare environment with HOME=`home`."""

    def once() -> float:
        t0 = time.perf_counter()
        subprocess.run(["bash", "-c", cmd], env={"PATH": SYSTEM_PATH, "HOME": str(home)}, check=True, timeout=30)
        return time.perf_counter() - t0

    return statistics.median(once() for _ in range(reps))


_ROUNDS: dict[float, int] = {}  # rc_cost -> calibrated rounds, once per process
PROBE_ROUNDS = 40000  # ~50 ms of hashing: enough to see above the noise of a loaded machine


def _calibrate(home: Path, init_dir: Path, rc_cost: float) -> int:
    """Hook rounds that make sourcing the rc file cost about `rc_cost` s on this machine: a probe, then one
    correction step (Python's start-up time swings with load, so a single probe over- or undershoots)."""

    def cost(rounds: int) -> float:
        (home / ".bashrc").write_text(_bashrc(init_dir, rounds))
        return max(0.0, _timed_bash(home, ". ~/.bashrc") - bare)

    bare = _timed_bash(home, "true")
    base = cost(0)
    per_round = max(cost(PROBE_ROUNDS) - base, 1e-3) / PROBE_ROUNDS
    rounds = max(0, int((rc_cost - base) / per_round))
    return max(0, rounds + int((rc_cost - cost(rounds)) / per_round))


def write_rc_home(home: Path, rc_cost: float) -> int:
    """A bed-private home whose .bashrc costs about `rc_cost` s; returns the hook's work rounds."""
    init_dir = home / ".bed-init"
    init_dir.mkdir(parents=True, exist_ok=True)
    (init_dir / "condabin").mkdir(exist_ok=True)
    (init_dir / "hook.py").write_text(HOOK_PY)
    if rc_cost not in _ROUNDS:
        _ROUNDS[rc_cost] = _calibrate(home, init_dir, rc_cost)
    (home / ".bashrc").write_text(_bashrc(init_dir, _ROUNDS[rc_cost]))
    (init_dir / "runs").write_text("")
    return _ROUNDS[rc_cost]


# -- what a client opened, from sshd's log -----------------------------------------------------------------

STARTING_SESSION = "Starting session: "  # session.c's verbose() line for every exec/shell/subsystem request


@dataclass(frozen=True)
class Sessions:
    """SSH connections and session channels opened between two points of the sshd log."""

    connections: int  # "Accepted publickey": one per handshake
    exec: int  # exec requests (`ssh host cmd`, paramiko exec_command): each runs the login shell
    sftp: int  # SFTP subsystem sessions (also started through the login shell)
    shell: int  # interactive shells

    @property
    def channels(self) -> int:
        """Session channels that each paid one login-shell start."""
        return self.exec + self.sftp + self.shell

    def __str__(self) -> str:
        return f"{self.exec} exec + {self.sftp} sftp ({self.connections} connection(s))"


def count_sessions(log_text: str) -> Sessions:
    """Tally sshd (LogLevel VERBOSE) log lines: 'Accepted publickey for ...', 'Starting session: command for
    ...', "Starting session: subsystem 'sftp' for ...", 'Starting session: shell on pts/N for ...'."""
    kinds = [line.split(STARTING_SESSION, 1)[1] for line in log_text.splitlines() if STARTING_SESSION in line]
    return Sessions(
        connections=sum("Accepted publickey for " in line for line in log_text.splitlines()),
        exec=sum(k.startswith(("command ", "forced-command ")) for k in kinds),
        sftp=sum(k.startswith("subsystem 'sftp' ") for k in kinds),
        shell=sum(k.startswith("shell ") for k in kinds),
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
    home: Path = Path("/nonexistent")  # sessions' HOME: the bed's own (make_sshd), never the real user's
    rc_cost: float = 0.0  # what the bed's .bashrc was calibrated to cost per command, seconds
    netns: str | None = None  # run inside this network namespace (tests/netbed.py)
    private_shm: bool = False  # its sessions get their own /dev/shm (a tmpfs in its mount namespace), as a host has
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

    def log_offset(self) -> int:
        """The log's current size: pass it to `sessions_since` to count what happens after this point."""
        try:
            return self.log.stat().st_size
        except FileNotFoundError:
            return 0

    def sessions_since(self, offset: int) -> Sessions:
        """What clients opened since `offset` (from `log_offset()`): connections, exec and SFTP sessions."""
        try:
            with self.log.open("rb") as fh:
                fh.seek(offset)
                return count_sessions(fh.read().decode("utf-8", "replace"))
        except FileNotFoundError:
            return count_sessions("")

    def rc_runs(self) -> int:
        """How many times the bed's .bashrc has run (0 without rc_cost)."""
        runs = self.home / ".bed-init" / "runs"
        return len(runs.read_text().split()) if runs.exists() else 0

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # privilege-separation dir
        cfg = self.dir / "sshd_config"
        cfg.write_text(_sshd_config(self.dir, self.host, self.port, self.host_key, self.bin_dir, self.extra_config,
                                 self.home, (self.home / ".bashrc").exists()))
        argv = [SSHD_BIN, "-D", "-f", str(cfg), "-E", str(self.log)]
        if self.private_shm:  # --mount-proc makes a private mount namespace: this tmpfs stays inside it
            argv = ["sh", "-c", 'mount -t tmpfs -o size=8g,mode=1777 tmpfs /dev/shm && exec "$@"', "sh", *argv]
        if shutil.which("unshare"):
            argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
        elif self.private_shm:
            raise RuntimeError("a private /dev/shm needs unshare (util-linux)")
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
    d: Path,
    *,
    addr: str = "127.0.0.1",
    client_key: Path | None = None,
    extra_config: list[str] | None = None,
    rc_cost: float | None = None,
    port: int | None = None,
    netns: str | None = None,
    private_shm: bool = False,
) -> SSHD:
    """Create keys and files under `d` and start an sshd on a free port of `addr`.

    `extra_config`: sshd_config lines that take precedence over the defaults (e.g. "AllowTcpForwarding no").
    `rc_cost`: seconds each command's login shell spends in `~/.bashrc` (a real GPU image: ~0.15); sessions
    then get a calibrated rc file in their home (`d`/home, always the bed's own). None: no rc file (SHLVL=1).
    `netns`: start it inside that network namespace, on `port` (a free port of this namespace is meaningless there).
    """
    d.mkdir(parents=True, exist_ok=True)
    host_key = keygen(d / "host_ed25519", "deployer-test-host")
    identity = client_key or keygen(d / "id_ed25519")
    (d / "authorized_keys").write_text(public_key(identity) + "\n")
    bin_dir = d / "bin"
    bin_dir.mkdir(exist_ok=True)
    write_stand_in_crontab(bin_dir, d / "crontab.txt")
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
        private_shm=private_shm,
    )
    bed.home = d / "home"
    bed.home.mkdir(exist_ok=True)  # 0755, as a real home is (a red-team test has another user reach into it)
    if rc_cost is not None:
        bed.rc_cost = rc_cost
        write_rc_home(bed.home, rc_cost)
    bed.start()
    return bed


@contextlib.contextmanager
def small_disk_sshd(tmp_path: Path, size: str = "8m") -> Iterator[tuple[SSHD, Path]]:
    """A tmpfs of `size` at tmp_path/disk, mounted before its own sshd starts (the sshd's PID and mount namespace
    copies the mounts), for disks that fill; skips without root or when a tmpfs cannot be mounted."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(disk)],
                             capture_output=True, text=True, timeout=20)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    bed = None
    try:
        bed = make_sshd(tmp_path / "sshd")
        yield bed, disk
    finally:
        if bed is not None:
            bed.stop()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=20)
