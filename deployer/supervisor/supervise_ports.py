"""The supervisor's view of the engine port on the target: the host-wide port claim, who listens on a port,
and whether that listener belongs to a given process group. Stdlib only, Python >= 3.8 (runs on the target).

The claim is a flock on CLAIM_DIR/<port> (/dev/shm/deployer-ports), shared by every deployment on the host
whatever its workdir: the supervisor takes it before it starts an engine and hands it down to the engine
process, so it is held for as long as either of them lives. Two deployments can never both start on one port.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Any, Dict, List, Optional, Set

# /dev/shm: host-wide, and not aged out like /tmp (systemd-tmpfiles would delete a weeks-old claim file while held).
CLAIM_DIR = "/dev/shm/deployer-ports" if os.path.isdir("/dev/shm") else "/tmp/deployer-ports"
LISTEN = "0A"


class PortTaken(Exception):
    """The port is claimed by another deployment or bound by another process; the message names it."""


def can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not busy
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def port_bindable(port: int) -> bool:
    return all(can_bind(host, port) for host in ("127.0.0.1", "0.0.0.0"))


def _claim_path(port: int) -> str:
    return os.path.join(CLAIM_DIR, str(port))


def _open_claim(port: int) -> int:
    """The claim file's descriptor (created world-usable, in a sticky world-writable dir, like /tmp)."""
    if not os.path.isdir(CLAIM_DIR):
        try:
            os.mkdir(CLAIM_DIR, 0o1777)
            os.chmod(CLAIM_DIR, 0o1777)
        except FileExistsError:
            pass
    path = _claim_path(port)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's claim file: flock works on a read-only descriptor too
        return os.open(path, os.O_RDONLY)
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o666)
    except OSError:
        pass
    return fd


def claim_holder(fd: int) -> str:
    """Who holds a claim, from what its holder wrote: 'deployment NAME (RUN_DIR)'."""
    try:
        info = json.loads(os.pread(fd, 65536, 0).decode("utf-8", "replace") or "{}")
    except ValueError:
        info = {}
    if not isinstance(info, dict) or not info.get("run_dir"):
        return "another deployment"
    return f"deployment {info.get('name') or '?'} ({info['run_dir']})"


def claim_port(port: int, run_dir: str, name: str) -> int:
    """Takes the host-wide claim on `port` for this run; the descriptor holds it. PortTaken if held."""
    try:
        fd = _open_claim(port)
    except OSError as e:
        raise PortTaken(f"cannot open the port claim {_claim_path(port)}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        who = "another deployment"
        for _ in range(20):  # the holder writes its info just after taking the claim
            who = claim_holder(fd)
            if who != "another deployment":
                break
            time.sleep(0.01)
        os.close(fd)
        raise PortTaken(f"port {port} taken by {who}") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"port": port, "run_dir": run_dir, "name": name, "since": time.time(),
                                  "pid": os.getpid()}).encode(), 0)
    except OSError:
        pass  # a read-only claim file (another user's): the lock still holds, only the note is missing
    return fd


def claimed_by(port: int) -> Optional[str]:
    """The claim's holder if the port is claimed now, else None (probes without keeping it)."""
    path = _claim_path(port)
    if not os.path.exists(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return claim_holder(fd)
    finally:
        os.close(fd)
    return None


def listening_inodes(port: int) -> Set[str]:
    """Socket inodes listening on `port` (any address, IPv4 and IPv6), from /proc/net/tcp{,6}."""
    inodes: Set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for r in rows:
            if len(r) > 9 and r[3] == LISTEN and int(r[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(r[9])
    return inodes


def _pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _holds(pid: int, inodes: Set[str]) -> bool:
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    except OSError:
        pass
    return False


def _pgid(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _describe(pid: int) -> str:
    """'pid N (comm)', with the deployer run it belongs to where its environment says (DEPLOYER_RUN_DIR)."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            text = f"pid {pid} ({f.read().strip()})"
    except OSError:
        text = f"pid {pid}"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        run = next((e[len(b"DEPLOYER_RUN_DIR="):] for e in env if e.startswith(b"DEPLOYER_RUN_DIR=")), None)
        if run:
            text += f" of run {run.decode('utf-8', 'replace')}"
    except OSError:
        pass
    return text


def port_holders(port: int) -> List[str]:
    """Best effort: who listens on `port` (needs rights to read their fds)."""
    inodes = listening_inodes(port)
    return [_describe(pid) for pid in _pids() if inodes and _holds(pid, inodes)]


def listener_of(port: int, pgid: Any) -> Dict[str, Any]:
    """Whether the listener on `port` is a process of group `pgid`: {"ours": bool|None, "holders": [...]}.

    ours is None when nobody listens (or /proc does not tell); holders names the listeners that are not ours.
    """
    if not os.path.exists("/proc/net/tcp"):  # no procfs to ask: the health answer is all there is
        return {"port": port, "ours": True, "holders": [], "unverified": True}
    inodes = listening_inodes(port)
    if not inodes:
        return {"port": port, "ours": None, "holders": []}
    holders: List[str] = []
    ours = False
    for pid in _pids():
        if not _holds(pid, inodes):
            continue
        if isinstance(pgid, int) and _pgid(pid) == pgid:
            ours = True
        else:
            holders.append(_describe(pid))
    if not ours and not holders:  # a listener we may not inspect (another user's): name the claim, if any
        holders = [claimed_by(port) or "a process that cannot be inspected from here"]
    return {"port": port, "ours": ours, "holders": holders}
