#!/usr/bin/env python3
"""The deployment lock on the TARGET: a lease with an owner, renewed by heartbeats, that expires.

Stdlib only, Python >= 3.8; deployer sends its own copy (with base) over stdin, `python3 -B - ARGS`, or
its helper runs it in process (a copy kept beside supervise.py serves older deployers):
  LOCK_PATH --holder JSON --token T --lease S [--mode take|retake|break|replace] [--from HOLDER]
  LOCK_PATH --show

The lease lives in LOCK_PATH as JSON (owner, pid, host_id, command, since, token, renewed_at, expires_at), read and
written in place under a short flock, judged on the target's clock only (no clock skew between client and target).
The first output line is `LOCKED {info}`, `BUSY {lease}` (exit 75), `LOST {lease}` (exit 76: a retake found the
lease no longer ours) or `UNSAFE {"error": ...}` (exit 77: the deployment dir is not ours alone, or another user
controls a directory above it, or the lock is a symlink or another user's file; nothing was written). Then, while
holding, each stdin line `HB` renews the lease (`OK <seconds left>`, or `LOST` and exit 76 when someone broke or
took it over) and `RELEASE` frees it (`RELEASED`). EOF without RELEASE (the connection dropped, or the client died)
leaves the lease to expire, so a reconnecting client can re-take it with its token and nobody else can act in
between. A holder that hears nothing for two leases exits (a late heartbeat before that gets a precise LOST).

Mode `inherit` (`--from` is then a lease token, not an identity) takes the lease only while that token holds it:
the target-side repair of an interrupted replace (supervise_guard.py) takes over from a client that is gone, and
from nobody else. Takeovers of an expired lease and broken locks are appended to LOCK_PATH + "-events.jsonl" (the deployment's
lock history; `deploy history` shows it). `--show` prints the lease with "held" and "expires_in".

Fencing: the helper that holds a lease checks it is still current (`still_ours`) before every change it makes (a
start, a stop, a write), and hands the tokens it holds to the supervisors it starts (env FENCE_ENV), which check
(`restart_refusal`) before each restart that nobody else holds the deployment's lock and that their run is still
the deployment's `current`: an operation that lost its lock, or its supervisor, brings nothing back after another
took over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import sys
import time
from typing import Any

from .base import EXIT_UNSAFE, UnsafePath, make_dirs, open_file

EXIT_BUSY, EXIT_LOST, EXIT_BAD_INPUT, EXIT_FAILED = 75, 76, 2, 1
MODES = ("take", "retake", "break", "replace", "inherit")
RECORD_SIZE = 2048  # the lease is rewritten in place, padded: once created it needs no new disk blocks
GUARD_WAIT_S = 5.0
EVENTS_SUFFIX = "-events.jsonl"
EVENTS_MAX = 256 << 10
HOLDER_KEYS = ("owner", "pid", "host_id", "command")
FENCE_ENV = "DEPLOYER_LEASE_TOKENS"  # the tokens of the leases a start ran under (comma-separated)


class LeaseError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def _guard(fd: int) -> None:
    """The short flock around one read-modify-write of the lease (never held while waiting for the client)."""
    deadline = time.monotonic() + GUARD_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                raise LeaseError("the lock file is held by another program (an older deployer?)") from None
            time.sleep(0.02)


def read_lease(fd: int) -> dict[str, Any]:
    raw = os.pread(fd, 65536, 0).strip(b"\0 \n")
    if not raw:
        return {}
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return {}  # a lease torn by a crash mid-write protects nothing
    return data if isinstance(data, dict) else {}


def write_lease(fd: int, lease: dict[str, Any]) -> None:
    body = json.dumps(lease, sort_keys=True).encode()
    if len(body) > RECORD_SIZE - 1:
        raise LeaseError("lease record too long", EXIT_BAD_INPUT)
    try:
        os.pwrite(fd, body + b"\n" + b" " * (RECORD_SIZE - len(body) - 1), 0)
        os.fsync(fd)
    except OSError as e:
        raise LeaseError(f"cannot write the lease: {e.strerror}") from None


def held(lease: dict[str, Any], now: float) -> bool:
    return bool(lease.get("token")) and float(lease.get("expires_at") or 0) > now


def public(lease: dict[str, Any], now: float) -> dict[str, Any]:
    """The lease as others may see it (no token), with seconds left and seconds since the last heartbeat."""
    out = {k: v for k, v in lease.items() if k != "token"}
    out["held"] = held(lease, now)
    if lease.get("expires_at") is not None:
        out["expires_in"] = round(float(lease["expires_at"]) - now, 1)
    if lease.get("renewed_at") is not None:
        out["renewed_ago"] = round(now - float(lease["renewed_at"]), 1)
    return out


def record_event(path: str, event: dict[str, Any]) -> None:
    """Append to the lock history; best effort (a full disk must not block a takeover), bounded in size."""
    events = path + EVENTS_SUFFIX
    try:
        fd = open_file(events, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644, "lock history")
        try:
            if os.fstat(fd).st_size > EVENTS_MAX:
                keep = os.pread(fd, EVENTS_MAX // 2, os.fstat(fd).st_size - EVENTS_MAX // 2).split(b"\n", 1)[-1]
                tmp = f"{events}.{os.getpid()}.tmp"
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                try:
                    os.write(out, keep)
                finally:
                    os.close(out)
                os.replace(tmp, events)
                os.close(fd)
                fd = open_file(events, os.O_RDWR | os.O_APPEND, 0o644, "lock history")
            os.write(fd, json.dumps(event, sort_keys=True).encode() + b"\n")
        finally:
            os.close(fd)
    except (OSError, UnsafePath):
        pass


def identity(lease: dict[str, Any]) -> str:
    """What a client names when it replaces a holder it saw die on its own machine (the token stays secret)."""
    return json.dumps([lease.get("pid"), lease.get("host_id"), lease.get("since")])


def _decide(lease: dict[str, Any], token: str, mode: str, from_token: str, now: float) -> tuple[str, str]:
    """(verdict, reason): verdict is take | busy | lost; reason names a takeover or break ("" otherwise)."""
    ours = bool(lease.get("token")) and lease.get("token") == token
    if mode == "retake":
        return ("take", "") if ours else ("lost", "")
    if mode == "inherit":  # the target-side repair (supervise_guard.py): only from the gone client's own lease
        return ("take", "client-gone") if from_token and lease.get("token") == from_token else ("lost", "")
    if ours or not lease.get("token"):
        return "take", ""
    if mode == "break":
        return "take", "broken"
    if not held(lease, now):
        return "take", "expired"
    if mode == "replace" and from_token and from_token == identity(lease):
        return "take", "holder-gone"
    return "busy", ""


def acquire(path: str, holder: dict[str, Any], token: str, lease_s: float, mode: str,
            from_token: str = "") -> tuple[int, dict[str, Any]]:
    """Take the lease; returns (fd, info for the LOCKED line). BUSY/LOST are LeaseErrors carrying the lease."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        make_dirs(folder, folder)  # the deployment dir is ours alone, and no other user controls one above it
        fd = open_file(path, os.O_RDWR | os.O_CREAT, 0o644, "lock")
    except UnsafePath as e:
        raise Refused("unsafe", {"error": str(e)}) from None
    except OSError as e:
        raise LeaseError(f"cannot open lock {path}: {e.strerror}") from None
    try:
        _guard(fd)
        now = time.time()
        lease = read_lease(fd)
        verdict, reason = _decide(lease, token, mode, from_token, now)
        if verdict != "take":
            raise Refused(verdict, public(lease, now))
        retaken = lease.get("token") == token
        new = {k: holder.get(k) for k in HOLDER_KEYS}
        new.update(token=token, since=lease.get("since") if retaken else now, lease_s=lease_s,
                   renewed_at=now, expires_at=now + lease_s, holder_pid=os.getpid())
        write_lease(fd, new)
        info: dict[str, Any] = {"retaken": retaken, "lease_s": lease_s, "reason": reason or None,
                                "previous": public(lease, now) if reason else None}
        if reason:
            record_event(path, {"at": now, "event": "lock-broken" if reason == "broken" else "lock-taken-over",
                                "reason": reason, "by": {k: new[k] for k in (*HOLDER_KEYS, "since")},
                                "from": {k: lease.get(k) for k in (*HOLDER_KEYS, "since", "renewed_at",
                                                                    "expires_at")}})
        return fd, info
    except BaseException:
        os.close(fd)  # closing drops the flock too
        raise
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass  # already closed above


class Refused(LeaseError):
    """The lease was not taken: verdict busy (held by another), lost (a retake found it gone) or unsafe."""

    def __init__(self, verdict: str, lease: dict[str, Any]) -> None:
        super().__init__(verdict, {"busy": EXIT_BUSY, "unsafe": EXIT_UNSAFE}.get(verdict, EXIT_LOST))
        self.verdict = verdict
        self.lease = lease


def update(fd: int, token: str, lease_s: float, release: bool) -> tuple[bool, dict[str, Any]]:
    """Renew (or release) our lease; (False, current lease) when it is no longer ours."""
    _guard(fd)
    try:
        now = time.time()
        lease = read_lease(fd)
        if lease.get("token") != token:
            return False, public(lease, now)
        if release:
            write_lease(fd, {"released_at": now, "released_by": lease.get("owner")})
        else:
            lease.update(renewed_at=now, expires_at=now + lease_s, holder_pid=os.getpid())
            write_lease(fd, lease)
        return True, public(lease, now)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def still_ours(fd: int, token: str) -> tuple[bool, dict[str, Any]]:
    """Whether the lease open on `fd` is still `token`'s and unexpired, and the lease as others may see it."""
    _guard(fd)
    try:
        now = time.time()
        lease = read_lease(fd)
        return lease.get("token") == token and held(lease, now), public(lease, now)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def take_fence() -> frozenset[str]:
    """The lease tokens a supervisor was started under, removed from the environment its engine inherits."""
    return frozenset(t for t in os.environ.pop(FENCE_ENV, "").split(",") if t)


def restart_refusal(run_dir: str, tokens: frozenset[str]) -> str | None:
    """Why the supervisor of `run_dir` must not restart its engine now (None: it may). Someone else holds the
    deployment's lock (they did not ask for it: a break-lock, a takeover, a `down` or a replace in progress), or
    the run is no longer the deployment's `current` (another version was switched to)."""
    deployment = os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))
    try:
        link = os.readlink(os.path.join(deployment, "current"))
        if os.path.basename(link.rstrip("/")) != os.path.basename(os.path.abspath(run_dir)):
            return f"not restarted: the deployment's current run is now {os.path.basename(link.rstrip('/'))}"
    except OSError:
        pass  # no `current` (a run started by hand): nothing says another run replaced it
    try:
        fd = open_file(os.path.join(deployment, "lock"), os.O_RDONLY, 0, "lock")
    except (OSError, UnsafePath):
        return None
    try:
        lease = read_lease(fd)
    finally:
        os.close(fd)
    if held(lease, time.time()) and lease.get("token") not in tokens:
        return f"not restarted: the deployment lock is held by {lease.get('owner')} pid {lease.get('pid')} " \
               f"({lease.get('command')}), who did not ask for it"
    return None


def _say(word: str, data: Any = None) -> None:
    print(word if data is None else f"{word} {json.dumps(data, sort_keys=True)}", flush=True)


def hold(fd: int, token: str, lease_s: float) -> int:
    """Serve heartbeats until RELEASE, EOF, a lease's worth of silence, or the lease is no longer ours."""
    buf = b""
    while True:
        if not select.select([0], [], [], 2 * lease_s)[0]:
            return 0  # the client went silent (its lease expired a lease ago): leave the rest to the expiry
        chunk = os.read(0, 4096)
        if not chunk:
            return 0  # connection gone without RELEASE: leave the lease to the reconnecting client (or expiry)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            word = line.strip().decode("ascii", "replace")
            if word not in ("HB", "RELEASE"):
                continue
            ok, lease = update(fd, token, lease_s, release=word == "RELEASE")
            if not ok:
                _say("LOST", lease)
                return EXIT_LOST
            if word == "RELEASE":
                _say("RELEASED")
                return 0
            _say(f"OK {lease_s:g}")


def show(path: str) -> int:
    try:
        fd = open_file(path, os.O_RDONLY, 0, "lock")
    except UnsafePath as e:
        raise LeaseError(str(e)) from None
    except OSError as e:
        if e.errno == errno.ENOENT:
            _say("LEASE", {"held": False})
            return 0
        raise LeaseError(f"cannot open lock {path}: {e.strerror}") from None
    try:
        _say("LEASE", public(read_lease(fd), time.time()))
    finally:
        os.close(fd)
    return 0


def _options(argv: list[str]) -> tuple[str, dict[str, str]]:
    if not argv or argv[0].startswith("--"):
        raise LeaseError("usage: supervise_lease.py LOCK_PATH --holder JSON --token T --lease S [--mode M]",
                         EXIT_BAD_INPUT)
    opts, rest = {}, list(argv[1:])
    while rest:
        word = rest.pop(0)
        if word == "--show":
            opts["show"] = "1"
        elif word.startswith("--") and rest:
            opts[word[2:]] = rest.pop(0)
        else:
            raise LeaseError(f"bad argument {word!r}", EXIT_BAD_INPUT)
    return argv[0], opts


def main(argv: list[str] | None = None) -> int:
    try:
        path, opts = _options(sys.argv[1:] if argv is None else argv)
        if "show" in opts:
            return show(path)
        mode = opts.get("mode", "take")
        try:
            holder, lease_s, token = json.loads(opts["holder"]), float(opts["lease"]), opts["token"]
        except (KeyError, ValueError):
            raise LeaseError("--holder JSON, --lease SECONDS and --token are required", EXIT_BAD_INPUT) from None
        if mode not in MODES or not isinstance(holder, dict) or not token or lease_s <= 0:
            raise LeaseError(f"bad --mode, --holder, --token or --lease ({mode})", EXIT_BAD_INPUT)
        try:
            fd, info = acquire(path, holder, token, lease_s, mode, opts.get("from", ""))
        except Refused as r:
            _say(r.verdict.upper(), r.lease)
            return r.code
        _say("LOCKED", info)
        try:
            return hold(fd, token, lease_s)
        except BrokenPipeError:
            return 0  # the client is gone: the lease expires on its own
        finally:
            os.close(fd)
    except LeaseError as e:
        print(f"supervise_lease: {e}", file=sys.stderr, flush=True)
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
