"""The helper's file ops on a deployment dir (helper.py answers them): what the pipeline used to send
as shell lines (`ln -sfn`, `readlink`, `rm -rf`, `sha256sum`/`df`, `mkdir`, `ls`, `grep -b`, `dmesg`, the lease's
`--show`, retention's run summary), each one request with a typed reply.

Stdlib only, Python >= 3.8. The ops that change something (`link`, `remove`, `mkdir`) take `within`, the
deployment dir: a path outside it is refused, and so is any symlink on the way from `within` to the path or a
directory there that another user controls (base.check_dirs); nothing is ever written or removed
through a symlink. Refusals raise UnsafePath (kind `unsafe`) or OpRefused (its `kind`), one line each.

The read-only ops (the helper's `read` and `size`, and `listdir`, `find_bytes`) open their path as the writes do,
a component at a time from / (`open_to_read`: base's walk, openat with O_NOFOLLOW), never by path: a
symlink another user owns, or a directory another user controls, on the way is refused in one line naming it and
its owner, and the last component is never a link.

    link {path, target, within}         `path` becomes a symlink to `target` (relative, no ".."), atomically:
                                        a new link beside it renamed over it (the old link is replaced, never
                                        followed)                                            -> {}
    readlink {path}                     -> {target: str | null}   (null: missing or not a symlink)
    remove {paths, within}              each path (a file, a symlink, a whole dir) gone, none followed; a
                                        missing one is fine                                  -> {removed: N}
    disk {path, files}                  -> {free: bytes | null, digests: [sha256 | null]}    (no fsync)
    mkdir {path, within, need}          a new 0700 dir when `need` bytes are free under its parent, else
                                        nothing                                        -> {made, free}
    listdir {path}                      -> {names: [sorted, no hidden] | null}
    find_bytes {path, needle_b64, offset}  the first offset at or after `offset` -> {at: int | null}
    kernel_log {lines}                  the kernel ring buffer's last lines (dmesg)         -> {text}
    lease_show {path}                   the lock's lease as `supervise_lease.py PATH --show` -> {lease}
    runs {path}                         every run of a runs dir (retention's summary), the payload each run's
                                        supervise.py names, the root's, and the payloads there (their age)
                                        -> {runs, current, root_payload, payloads: [{digest, age_s}]}
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional

from .base import UnsafePath, check_dirs, open_dir_to_read, open_file
from .lease import public, read_lease

READ_CHUNK = 1 << 20
FIND_MAX = 1 << 30           # find_bytes reads at most this much of a log
KERNEL_LOG_MAX = 2000
RECORD_MAX = 4 << 20


class OpRefused(Exception):
    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _inside(path: str, within: str) -> str:
    """`path` (absolute, normalised) strictly below `within`, reached without a symlink and through directories
    only we control; else UnsafePath."""
    top, where = os.path.normpath(within), os.path.normpath(path)
    if not os.path.isabs(where) or not os.path.isabs(top) or not where.startswith(top.rstrip("/") + "/"):
        raise UnsafePath(f"{path} is not inside {within}: refused")
    parent, step = os.path.dirname(where), top
    for part in [p for p in parent[len(top):].split("/") if p]:   # below `within`: no symlink on the way
        step = os.path.join(step, part)
        try:
            if stat.S_ISLNK(os.lstat(step).st_mode):
                raise UnsafePath(f"{step} is a symbolic link: refused (deployer never acts through one)")
        except FileNotFoundError:
            break
    check_dirs(parent, top)
    return where


def open_to_read(path: str, flags: int = os.O_RDONLY) -> int:
    """An fd of `path` reached a component at a time (open_dir_to_read), the last one opened with O_NOFOLLOW from
    its directory's fd: UnsafePath for a link there or another user's component on the way, FileNotFoundError when
    it is missing. A file must be a regular one (a planted FIFO or device is refused, never read)."""
    parent, name = os.path.split(os.path.abspath(path))
    at = open_dir_to_read(parent)
    try:
        fd = os.open(name or ".", flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=at)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symbolic link: refused (deployer never reads through one)") from None
        if e.errno == errno.ENOTDIR and flags & os.O_DIRECTORY:
            raise UnsafePath(f"{path} is not a directory") from None
        raise
    finally:
        os.close(at)
    kind = os.fstat(fd).st_mode
    if not (stat.S_ISDIR(kind) if flags & os.O_DIRECTORY else stat.S_ISREG(kind)):
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file: refused")
    os.set_blocking(fd, True)
    return fd


def read_bytes(path: str, offset: int, limit: int) -> bytes:
    """At most `limit` bytes of `path` from `offset` (open_to_read)."""
    with os.fdopen(open_to_read(path), "rb") as f:
        f.seek(max(offset, 0))
        return f.read(max(limit, 0))


def size_of(path: str) -> Optional[int]:
    """The size of the regular file `path` (open_to_read), None when it is missing."""
    try:
        fd = open_to_read(path)
    except FileNotFoundError:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def link(req: Dict[str, Any]) -> Dict[str, Any]:
    target = str(req["target"])
    if not target or target.startswith("/") or ".." in target.split("/"):
        raise OpRefused(f"link: {target!r} is not a path inside the deployment dir", "bad-request")
    path = _inside(str(req["path"]), str(req["within"]))
    tmp = os.path.join(os.path.dirname(path), ".%s.%s.link" % (os.path.basename(path), os.urandom(6).hex()))
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)   # rename(2) replaces a symlink itself, never what it points at
    except OSError:
        os.unlink(tmp)
        raise
    return {}


def readlink(req: Dict[str, Any]) -> Dict[str, Any]:
    try:
        return {"target": os.readlink(str(req["path"]))}
    except OSError:
        return {"target": None}


def remove(req: Dict[str, Any]) -> Dict[str, Any]:
    within = str(req["within"])
    paths = [_inside(str(p), within) for p in req["paths"]]   # all checked before anything goes
    removed = 0
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)   # fd-based on Linux (rmtree.avoids_symlink_attacks): links inside are unlinked
        else:
            os.unlink(path)
        removed += 1
    return {"removed": removed}


def _free(path: str) -> Optional[int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _sha256(path: str) -> Optional[str]:
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        for chunk in iter(lambda: f.read(READ_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def disk(req: Dict[str, Any]) -> Dict[str, Any]:
    return {"free": _free(str(req["path"])), "digests": [_sha256(str(p)) for p in req["files"]]}


def mkdir(req: Dict[str, Any]) -> Dict[str, Any]:
    path = _inside(str(req["path"]), str(req["within"]))
    free = _free(os.path.dirname(path))
    if free is not None and free < int(req.get("need") or 0):
        return {"made": False, "free": free}
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise OpRefused(f"{path} exists already", "exists") from None
    return {"made": True, "free": free}


def listdir(req: Dict[str, Any]) -> Dict[str, Any]:
    try:
        fd = open_to_read(str(req["path"]), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return {"names": None}
    try:
        names = os.listdir(fd)
    except OSError:
        return {"names": None}
    finally:
        os.close(fd)
    return {"names": sorted(n for n in names if n and not n.startswith("."))}


def find_bytes(req: Dict[str, Any]) -> Dict[str, Any]:
    needle, offset = base64.b64decode(req["needle_b64"]), max(int(req.get("offset") or 0), 0)
    if not needle:
        raise OpRefused("find_bytes: an empty needle", "bad-request")
    try:
        f = os.fdopen(open_to_read(str(req["path"])), "rb")
    except FileNotFoundError:
        raise OpRefused(f"{req['path']}: no such file", "notfound") from None
    with f:
        f.seek(offset)
        carry, at = b"", offset
        while at - offset < FIND_MAX:
            chunk = f.read(READ_CHUNK)
            if not chunk:
                return {"at": None}
            found = (carry + chunk).find(needle)
            if found >= 0:
                return {"at": at - len(carry) + found}
            at += len(chunk)
            carry = (carry + chunk)[-(len(needle) - 1):] if len(needle) > 1 else b""
    return {"at": None}


def kernel_log(req: Dict[str, Any]) -> Dict[str, Any]:
    lines = min(max(int(req.get("lines") or 300), 1), KERNEL_LOG_MAX)
    try:
        out = subprocess.run(["dmesg"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = b""   # no dmesg, or not allowed to read the ring buffer: no kernel lines, as `dmesg 2>/dev/null`
    return {"text": "".join(t + "\n" for t in out.decode("utf-8", "replace").splitlines()[-lines:])}


def lease_show(req: Dict[str, Any]) -> Dict[str, Any]:
    path = str(req["path"])
    try:
        fd = open_file(path, os.O_RDONLY, 0, "lock")
    except OSError as e:
        if e.errno == errno.ENOENT:
            return {"lease": {"held": False}}
        raise
    try:
        return {"lease": public(read_lease(fd), time.time())}
    finally:
        os.close(fd)


def _record(path: str) -> Dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(RECORD_MAX) or b"null")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# An entry file names the payload it runs on one line (remote/program.py's ENTRY_FILE); a run dir whose supervise.py
# has none holds a whole program of its own (an older deployer's).
_PAYLOAD_LINE = re.compile(rb"^PAYLOAD(?:, SIZE)? = '([0-9a-f]{64})'(?:, \d+)?$", re.MULTILINE)
_PAYLOAD_FILE = re.compile(r"^([0-9a-f]{64})\.py$")
ENTRY_HEAD = 4096


def named_payload(text: bytes) -> str:
    """The sha256 of the payload an entry file's text names, or ""."""
    found = _PAYLOAD_LINE.search(text[:ENTRY_HEAD])
    return found.group(1).decode("ascii") if found else ""


def _named_by(path: str) -> str:
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            return named_payload(f.read(ENTRY_HEAD))
    except OSError:
        return ""


def _payloads(folder: str) -> List[Dict[str, Any]]:
    """The payload files of a deployment dir's payload/ (not links), with their age."""
    out: List[Dict[str, Any]] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    now = time.time()
    for name in names:
        found = _PAYLOAD_FILE.match(name)
        try:
            st = os.lstat(os.path.join(folder, name))
        except OSError:
            continue
        if found and stat.S_ISREG(st.st_mode):
            out.append({"digest": found.group(1), "age_s": max(0.0, now - st.st_mtime)})
    return out


def runs(req: Dict[str, Any]) -> Dict[str, Any]:
    """Retention's summary of every run (oldest first), the current one's id, and the payloads (its records never
    followed)."""
    folder = str(req["path"])
    root = os.path.dirname(folder)
    out: List[Dict[str, Any]] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    for rid in names:
        d = os.path.join(folder, rid)
        try:
            if rid.startswith(".") or not stat.S_ISDIR(os.lstat(d).st_mode):
                continue
        except OSError:
            continue
        state, outcome = _record(os.path.join(d, "state.json")), _record(os.path.join(d, "outcome.json"))
        out.append({"id": rid, "hash": str(_record(os.path.join(d, "profile.json")).get("content_hash", "")),
                    "ready": bool(state.get("ready_at")) or outcome.get("outcome") == "ready",
                    "status": str(state.get("status", "unknown")), "env": os.path.lexists(os.path.join(d, "env")),
                    "payload": _named_by(os.path.join(d, "supervise.py"))})
    try:
        current: Optional[str] = os.path.basename(os.readlink(os.path.join(root, "current")))
    except OSError:
        current = None
    return {"runs": out, "current": current, "root_payload": _named_by(os.path.join(root, "supervise.py")),
            "payloads": _payloads(os.path.join(root, "payload"))}

