"""The supervisor's view of the engine port on the target: the host-wide port claim, who listens on a port,
and whether that listener belongs to a given process group. Stdlib only, Python >= 3.8 (runs on the target).

The claim is an abstract unix socket per port, `\\0deployer-port-<port>`, bound (and listening) by the supervisor
before it starts an engine and handed down to the engine process: the kernel lets one socket at a time have the
name, whoever asks (every deployment on the host, whatever its user or workdir), and frees it when the last
process holding it dies, so it is held for as long as either of them lives. Two deployments can never both start
on one port. It is not a file: there is no directory another user could create first, no symlink to follow, nothing
to chmod. (Abstract names are per network namespace, as the port itself is.)

Who holds a claim: the holder's uid, asked of the socket itself (SO_PEERCRED of a connection to it), and
its note, `/dev/shm/deployer-port-<port>.<uid>.json` (name, run dir), written by the holder into the root-owned
sticky /dev/shm with O_EXCL/O_NOFOLLOW (never through a link planted there). A note is believed only when it is the
deploying user's own (its owner and the claim's holder are this user): another user's note says what that user
wants, so a claim of another user is named by its user, uid and pid, never as "deployment X".

A claim file of the previous release (`/dev/shm/deployer-ports/<port>`, a flock) is still honoured while its holder
runs: probed read-only, never created, followed through a symlink or written.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import re
import socket
import stat
import struct
import time
from typing import Any, Dict, List, Optional, Set, Tuple

SHM = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
# The previous release's claim files (flocks), honoured read-only during an upgrade.
LEGACY_CLAIM_DIR = os.path.join(SHM, "deployer-ports")
CLAIM_NAME = "deployer-port-%d"
NOTE_MAX = 64 << 10
NOTE_GRACE_S = 10.0
LISTEN = "0A"
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")  # controls, bidi too


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


def _address(port: int) -> bytes:
    return b"\0" + (CLAIM_NAME % port).encode()


def _note_path(port: int, uid: int) -> str:
    return os.path.join(SHM, "%s.%d.json" % (CLAIM_NAME % port, uid))


def _clean(text: Any) -> str:
    """A note's words as one printable line (a forged note's escape sequences never reach a terminal)."""
    return _UNPRINTABLE.sub("?", str(text))[:300]


def _describe_note(info: Any) -> Optional[str]:
    if not isinstance(info, dict) or not info.get("run_dir"):
        return None
    return f"deployment {_clean(info.get('name') or '?')} ({_clean(info['run_dir'])})"


def _shared_dir_fd() -> int:
    """SHM, opened, if it is safe to keep notes in: root's (or ours) and sticky when others can write it."""
    fd = os.open(SHM, os.O_RDONLY | os.O_DIRECTORY)
    st = os.fstat(fd)
    if st.st_uid not in (0, os.geteuid()) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        os.close(fd)
        raise OSError(errno.EPERM, f"{SHM} is not a root-owned sticky directory")
    return fd


def _write_note(port: int, info: Dict[str, Any]) -> None:
    """The holder's note, best effort (the claim holds without it): a new file, renamed over the old note."""
    try:
        dfd = _shared_dir_fd()
    except OSError:
        return
    name = os.path.basename(_note_path(port, os.geteuid()))
    tmp = ".%s.%d.%s.tmp" % (name, os.getpid(), os.urandom(4).hex())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, json.dumps(info, sort_keys=True).encode())
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
    try:
        _sweep_notes(dfd, port)
    finally:
        os.close(dfd)


def _sweep_notes(dfd: int, keep: int) -> None:
    """Our notes of ports no longer claimed go (claims end without a word: the kernel frees them); a note younger
    than NOTE_GRACE_S is left, its claimer may be about to write it."""
    me, now = os.geteuid(), time.time()
    pattern = re.compile(r"%s\.%d\.json\Z" % (re.escape(CLAIM_NAME).replace("%d", r"(\d+)"), me))
    try:
        names = os.listdir(dfd)
    except OSError:
        return
    for name in names:
        m = pattern.match(name)
        if not m or int(m.group(1)) == keep:
            continue
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if st.st_uid == me and now - st.st_mtime > NOTE_GRACE_S and not _peer(int(m.group(1)))[0]:
                os.unlink(name, dir_fd=dfd)
        except OSError:
            continue


def _read_note(path: str, uid: int) -> Optional[Dict[str, Any]]:
    """A note, only if it is a regular file owned by `uid` (the claim holder): never followed through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return None
        info = json.loads(os.pread(fd, NOTE_MAX, 0).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return info if isinstance(info, dict) else None


def _peer(port: int) -> Tuple[bool, Optional[Tuple[int, int]]]:
    """(claimed, (pid, uid) of the holder or None): a connection to the claim socket (never accepted) says both."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.setblocking(False)
        try:
            s.connect(_address(port))
        except (BlockingIOError, InterruptedError):  # its queue is full: claimed, by someone we cannot ask
            return True, None
        except ConnectionRefusedError:
            return _name_bound(port), None  # nobody, or a socket with the name that does not listen
        except OSError:
            return False, None
        try:
            pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                           struct.calcsize("3i")))
        except (OSError, AttributeError, struct.error):
            return True, None
        return True, (pid, uid)


def _name_bound(port: int) -> bool:
    """Whether a socket holds the claim's name (from /proc/net/unix, which lists every bound abstract name)."""
    want = "@" + CLAIM_NAME % port
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            return any(line.split()[-1:] == [want] for line in f)
    except OSError:
        return False


def user_name(uid: int) -> str:
    try:
        return _clean(pwd.getpwuid(uid).pw_name)
    except (KeyError, OverflowError):
        return "uid %d" % uid


def _another_user(uid: int, pid: Optional[int]) -> str:
    """A holder that is not the deploying user, by what the kernel says of it (its note is not believed)."""
    at = "" if pid is None else ", pid %d" % pid
    return "a process of user %s (uid %d%s), not a deployment of %s" % (user_name(uid), uid, at,
                                                                         user_name(os.geteuid()))


def _holder(port: int, peer: Optional[Tuple[int, int]]) -> str:
    """'deployment NAME (RUN_DIR)' from our own note when we hold the claim; another user's claim by its user, uid
    and pid; else 'another deployment'."""
    me = os.geteuid()
    if peer is not None:
        pid, uid = peer  # (the pid is the claimer's in its own PID namespace: said, not compared)
        if uid != me:
            return _another_user(uid, pid)
        return _describe_note(_read_note(_note_path(port, uid), uid)) or "another deployment"
    # the claim could not be asked: only our own note is believed
    return _describe_note(_read_note(_note_path(port, me), me)) or "another deployment"


def _legacy_holder(port: int) -> Optional[str]:
    """The holder of the previous release's claim file on `port` while one holds it (read-only probe)."""
    try:
        fd = os.open(os.path.join(LEGACY_CLAIM_DIR, str(port)), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except OSError:
            pass
        if st.st_uid != os.geteuid():
            return _another_user(st.st_uid, None)
        try:
            info = json.loads(os.pread(fd, NOTE_MAX, 0).decode("utf-8", "replace") or "{}")
        except (OSError, ValueError):
            info = None
        return _describe_note(info) or "another deployment"
    finally:
        os.close(fd)


def claim_port(port: int, run_dir: str, name: str) -> int:
    """Takes the host-wide claim on `port` for this run; the descriptor holds it. PortTaken if held."""
    legacy = _legacy_holder(port)
    if legacy is not None:
        raise PortTaken(f"port {port} taken by {legacy}")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(_address(port))
        s.listen(128)  # so that others can ask who holds it (SO_PEERCRED); nobody ever accepts
    except OSError as e:
        s.close()
        if e.errno != errno.EADDRINUSE:
            raise PortTaken(f"cannot claim port {port}: {e.strerror}") from None
        who = "another deployment"
        for _ in range(20):  # the holder writes its note just after taking the claim
            claimed, peer = _peer(port)
            who = _holder(port, peer) if claimed else who
            if who != "another deployment":
                break
            time.sleep(0.01)
        raise PortTaken(f"port {port} taken by {who}") from None
    _write_note(port, {"port": port, "run_dir": run_dir, "name": name, "since": time.time(), "pid": os.getpid()})
    return s.detach()


def claimed_by(port: int) -> Optional[str]:
    """The claim's holder if the port is claimed now, else None (probes without taking it)."""
    legacy = _legacy_holder(port)
    if legacy is not None:
        return legacy
    claimed, peer = _peer(port)
    return _holder(port, peer) if claimed else None


def listening_inodes(port: int) -> Dict[str, int]:
    """Socket inodes listening on `port` (any address, IPv4 and IPv6), from /proc/net/tcp{,6}: inode -> the uid
    that owns the socket (readable by anyone, where the process behind it may not be)."""
    inodes: Dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for r in rows:
            if len(r) > 9 and r[3] == LISTEN and int(r[1].rsplit(":", 1)[1], 16) == port:
                inodes[r[9]] = int(r[7]) if r[7].isdigit() else -1
    return inodes


def _pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _pgid(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _uid_of(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _describe(pid: int) -> str:
    """'pid N (comm) of user U', with the deployer run it belongs to where its environment says
    (DEPLOYER_RUN_DIR)."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            text = f"pid {pid} ({_clean(f.read().strip())})"
    except OSError:
        text = f"pid {pid}"
    uid = _uid_of(pid)
    if uid is not None:
        text += f" of user {user_name(uid)}"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        run = next((e[len(b"DEPLOYER_RUN_DIR="):] for e in env if e.startswith(b"DEPLOYER_RUN_DIR=")), None)
        if run:
            text += f" of run {_clean(run.decode('utf-8', 'replace'))}"
    except OSError:
        pass
    return text


def _hidden(inodes: Dict[str, int], seen: Set[str]) -> List[str]:
    """The listeners no readable /proc/PID/fd showed: named by the uid /proc/net/tcp gives their socket."""
    uids = sorted({uid for inode, uid in inodes.items() if inode not in seen})
    return ["a process of user %s (uid %d) that cannot be inspected from here" % (user_name(uid), uid)
            for uid in uids if uid >= 0]


def _sockets_of(pid: int, inodes: Dict[str, int]) -> Set[str]:
    found: Set[str] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                found.add(link[8:-1])
    except OSError:
        pass
    return found


def port_holders(port: int) -> List[str]:
    """Best effort: who listens on `port`: 'pid N (comm) of user U' where its fds can be read, else the user the
    socket belongs to."""
    inodes = listening_inodes(port)
    if not inodes:
        return []
    out, seen = [], set()  # type: List[str], Set[str]
    for pid in _pids():
        held = _sockets_of(pid, inodes)
        if held:
            seen |= held
            out.append(_describe(pid))
    return out + _hidden(inodes, seen)


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
    ours, seen = False, set()  # type: bool, Set[str]
    for pid in _pids():
        held = _sockets_of(pid, inodes)
        if not held:
            continue
        seen |= held
        if isinstance(pgid, int) and _pgid(pid) == pgid:
            ours = True
        else:
            holders.append(_describe(pid))
    if not ours:  # listeners we may not inspect (another user's): named by their socket's user
        holders += _hidden(inodes, seen)
    if not ours and not holders:
        holders = [claimed_by(port) or "a process that cannot be inspected from here"]
    return {"port": port, "ours": ours, "holders": holders}
