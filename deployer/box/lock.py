"""The deployment lock, client side: take the target's lease, keep it alive, notice when it is lost.

The lease itself lives on the target (deployer/supervisor/lease.py): an owner (user@client-host, pid,
command, since), renewed by a heartbeat over the SSH connection, expiring `lease_s` after the last renewal. A
background thread sends the heartbeat (over the command's helper conversation when it has one, else to a lease
program of its own on an exec channel: deployer's own copy, sent in the exec line, never one on the target's disk);
when the connection drops it re-takes the same lease over a new connection (the lease cannot be taken by anyone
else before it expires). Every remote call of the operation goes through `Guarded`, which refuses to act once the
lease may have expired or was broken: the operation then stops with LockLost instead of changing a target that
someone else may now be changing. The target fences too (helper.py): a change that reaches it after the
lease stopped being ours is refused there (kind `fenced`), and reported here as the lost lock.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from deployer.errors import Locked, LockLost, NotFound, ProfileError, RemoteError, TargetError, UnsafeTarget
from deployer.box.push import Layout
from deployer.remote.base import Hasher, Helper, HttpReply, Remote, Result, Session
from deployer.remote.base import HelperRefused

LEASE_S = 30.0  # env DEPLOYER_LOCK_LEASE_S; a vanished client blocks others at most this long
LEASE_ENV = "DEPLOYER_LOCK_LEASE_S"
FIRST_LINE_S = 20.0
Notify = Callable[[str], None]


def lease_seconds() -> float:
    text = os.environ.get(LEASE_ENV, "").strip()
    try:
        value = float(text) if text else LEASE_S
    except ValueError:
        value = -1.0
    if not 1.0 <= value <= 3600:
        raise ProfileError(f"{LEASE_ENV}={text!r}: the lock's lease must be a number of seconds from 1 to 3600")
    return value


def host_id() -> str:
    """This machine, for "is the holder's process still alive here": hostname plus boot id (pids reset on boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _when(stamp: Any) -> str:
    try:
        return datetime.fromtimestamp(float(stamp)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "unknown time"


def describe_holder(lease: dict[str, Any]) -> str:
    """`alice@laptop pid 123 (up) since 2026-11-30 23:40:01`; older locks only had a free-text `who`."""
    if lease.get("owner"):
        return f"{lease['owner']} pid {lease.get('pid')} ({lease.get('command')}) since {_when(lease.get('since'))}"
    return f"{lease.get('who', 'another deploy')} since {_when(lease.get('since'))}"


def busy_message(lease: dict[str, Any]) -> str:
    timing = ""
    if lease.get("expires_in") is not None:
        timing = f" (heartbeat {lease.get('renewed_ago', '?')}s ago; the lease expires in {lease['expires_in']}s " \
                 f"unless renewed)"
    return f"deployment is locked by {describe_holder(lease)}{timing}"


def takeover_message(info: dict[str, Any]) -> str | None:
    prev, reason = info.get("previous") or {}, info.get("reason")
    if not reason:
        return None
    who = describe_holder(prev)
    if reason == "broken":
        return f"broke the deployment lock held by {who} (--break-lock; recorded in the deployment's history)"
    if reason == "holder-gone":
        return f"took over the deployment lock from {who}: that process is gone from this machine"
    ago = -float(prev.get("expires_in") or 0)
    return f"took over the deployment lock from {who}: its lease expired {ago:.0f}s ago " \
           f"(no heartbeat for {prev.get('renewed_ago', '?')}s)"


def lock_state(remote: Remote, layout: Layout) -> dict[str, Any] | None:
    """What the lock says now (owner, since, held, expires_in, renewed_ago), or None when nobody holds a lease."""
    try:
        raw: bytes | None = remote.read(layout.lock, 0, 64 << 10)
    except NotFound:
        raw = None
    return lease_of(remote, layout, raw)


def lease_of(remote: Remote, layout: Layout, raw: bytes | str | None) -> dict[str, Any] | None:
    """The lock as its file `raw` says (read by the caller, e.g. in a snapshot). A released lock is seen from the
    file alone; only a lease that may be live costs a command (its expiry is judged on the target's clock)."""
    text = raw.encode() if isinstance(raw, str) else raw
    try:
        stripped = (text or b"").strip(b"\0 \n")
        data = json.loads(stripped) if stripped else {}
    except ValueError:
        return None
    if not isinstance(data, dict) or not (data.get("token") or data.get("who")):
        return None
    try:
        lease: dict[str, Any] | None = remote.helper.lease_show(layout.lock)
    except TargetError:
        lease = None
    if not lease:  # the helper could not judge it (a lock file it cannot open): report the file as it is
        lease = {k: v for k, v in data.items() if k != "token"}
    lease["text"] = describe_lease(lease)
    return lease


def describe_lease(lease: dict[str, Any]) -> str:
    if lease.get("held"):
        return f"locked by {describe_holder(lease)} (heartbeat {lease.get('renewed_ago', '?')}s ago, " \
               f"lease expires in {lease.get('expires_in', '?')}s)"
    if lease.get("expires_in") is not None:
        return f"expired lease of {describe_holder(lease)} (the next operation takes it over)"
    return f"locked by {describe_holder(lease)}"


def _pid_gone(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (OSError, TypeError, ValueError):
        return False
    return False


class DeploymentLock:
    """The per-deployment lease on the target, held (and heartbeated) inside a `with` block."""

    def __init__(self, remote: Remote, layout: Layout, what: str, *, break_lock: bool = False,
                 notify: Notify | None = None) -> None:
        self.remote = remote
        self.layout = layout
        self.what = what
        self.break_lock = break_lock
        self.notify: Notify = notify or (lambda _m: None)
        self.holder = {"owner": f"{getpass.getuser()}@{socket.gethostname()}", "pid": os.getpid(),
                       "host_id": host_id(), "command": what}
        self.who = f"{self.holder['owner']} ({what})"
        self.token = uuid.uuid4().hex
        self.lease_s = lease_seconds()
        self.heartbeat_s = max(0.2, self.lease_s / 6)
        self.session: Session | None = None
        self._valid_until = 0.0
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- taking and releasing ----------------------------------------------------------------------------

    def _open(self, mode: str, from_holder: str = "") -> tuple[str, dict[str, Any], Session]:
        # the command's helper holds the lease (no channel of its own); on a bare connection deployer's own copy
        # runs in the exec line (stdin carries the heartbeats): nothing on the target's disk runs
        session = self.remote.helper.lease(self.layout.lock, self.holder, self.token, self.lease_s, mode, from_holder)
        try:
            line = session.readline(timeout=FIRST_LINE_S) or ""
        except RemoteError:
            session.close()
            raise
        word, _, payload = line.partition(" ")
        try:
            data = json.loads(payload) if payload else {}
        except ValueError:
            data = {}
        if word != "LOCKED":
            session.close()
            if word == "UNSAFE":
                raise UnsafeTarget(f"unsafe deployment dir on {self.remote.label}: {data.get('error')}; the lock was "
                                   f"not taken", hint="use a target.workdir that only the deploying user can write")
            if word not in ("BUSY", "LOST"):
                raise RemoteError(f"could not take the deployment lock: {line or 'no answer'}", host=self.remote.label)
        return word, data if isinstance(data, dict) else {}, session

    def __enter__(self) -> DeploymentLock:
        sent = time.monotonic()
        word, data, session = self._open("break" if self.break_lock else "take")
        if word == "BUSY" and data.get("host_id") == self.holder["host_id"] and data.get("pid") != os.getpid() \
                and _pid_gone(data.get("pid")):
            sent = time.monotonic()
            word, data, session = self._open("replace", json.dumps([data.get("pid"), data.get("host_id"),
                                                                   data.get("since")]))
        if word != "LOCKED":
            raise Locked(busy_message(data), hint="wait for it to finish, check `deploy status`, or, if its "
                         "machine is gone for good, use --break-lock")
        self.session, self._valid_until = session, sent + self.lease_s
        message = takeover_message(data)
        if message:
            self.notify(message)
        elif self.break_lock:
            self.notify("--break-lock: the deployment was not locked")
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="deployer-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s * 3 + FIRST_LINE_S)
            self._thread = None
        session, self.session = self.session, None
        if session is None:
            return
        try:  # even after a loss: the target frees the lease only if it is still ours (a late re-take)
            session.send(b"RELEASE\n")
            session.readline(timeout=5.0)
        except RemoteError:
            pass  # the lease expires on its own
        finally:
            session.close()

    # -- keeping it --------------------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            session = self.session
            if session is None:
                return
            sent = time.monotonic()
            try:
                session.send(b"HB\n")
                reply = session.readline(timeout=max(1.0, self.heartbeat_s * 2)) or ""
            except RemoteError:
                reply = ""
            if reply.startswith("OK"):
                self._valid_until = sent + self.lease_s
            elif reply.startswith("LOST"):
                self._lose_to(reply)
                return
            elif not self._retake(session):
                return

    def _retake(self, old: Session) -> bool:
        """The lease session broke: take the same lease again over a fresh channel (reconnecting if needed)."""
        old.close()
        while not self._stop.is_set():
            if time.monotonic() >= self._valid_until:
                self._lost = f"could not renew the lease within {self.lease_s:g}s (connection to " \
                             f"{self.remote.label} lost)"
                return False
            sent = time.monotonic()
            try:
                word, data, session = self._open("retake")
            except RemoteError:
                self._stop.wait(min(self.heartbeat_s, max(0.0, self._valid_until - time.monotonic())))
                continue
            except TargetError as e:  # the deployment dir became unsafe: the lease is not re-taken there
                self._lost = e.message
                return False
            if word != "LOCKED":
                self._lose_to(f"LOST {json.dumps(data)}")
                return False
            self.session, self._valid_until = session, sent + self.lease_s
            self.notify("the connection dropped; re-took the same deployment lock and carried on")
            return True
        return False

    def _lose_to(self, reply: str) -> None:
        try:
            lease = json.loads(reply.partition(" ")[2] or "{}")
        except ValueError:
            lease = {}
        self._lost = f"the lock is now held by {describe_holder(lease)}" if isinstance(lease, dict) and \
            lease.get("held") else "the lease expired and was taken over or released by someone else"

    def lost_error(self) -> LockLost | None:
        """Why the lock cannot be counted on any more (lost, or the lease ran out unrenewed); None while held."""
        if self._lost is None and time.monotonic() >= self._valid_until:
            self._lost = f"could not renew the lease within {self.lease_s:g}s (connection to {self.remote.label} lost)"
        if self._lost is None:
            return None
        return LockLost(f"lost the deployment lock of {self.layout.root} on {self.remote.label}: {self._lost}; "
                        f"stopped without changing anything more",
                        hint="see `deploy status` and `deploy history`, then run the operation again")

    @contextmanager
    def fenced(self) -> Iterator[None]:
        """A change the target refused because the lease is no longer ours (its helper checks before each start,
        stop and write) is the lost lock: reported as such, whatever the heartbeat has heard so far."""
        try:
            yield
        except HelperRefused as exc:
            if exc.kind != "fenced":
                raise
            self._lost = self._lost or exc.said.removeprefix("refused: ").split("; nothing was changed")[0]
            lost = self.lost_error()
            assert lost is not None
            raise lost from None

    @contextmanager
    def reporting_loss(self) -> Iterator[None]:
        """A connection error while the lock was lost (or its lease ran out) is reported as the lost lock."""
        try:
            yield
        except RemoteError as exc:
            lost = self.lost_error()
            if lost is None:
                raise
            raise lost from exc

    def ensure(self) -> None:
        """Raise LockLost unless the lease is certainly still ours; waits (bounded) while it is being re-taken."""
        margin = self.heartbeat_s
        deadline = time.monotonic() + self.lease_s + FIRST_LINE_S
        while self._lost is None and time.monotonic() >= self._valid_until - margin:
            if time.monotonic() >= deadline or self._thread is None or not self._thread.is_alive():
                self._lost = self._lost or f"the lease of {self.lease_s:g}s could not be renewed"
                break
            time.sleep(0.05)
        lost = self.lost_error() if self._lost is not None else None
        if lost is not None:
            raise lost

    @property
    def lost(self) -> str | None:
        return self._lost

    def guarded(self, remote: Remote | None = None) -> Guarded:
        return Guarded(remote or self.remote, self)


class Guarded:
    """A Remote that acts only while the deployment lock is certainly held (see DeploymentLock.ensure).

    Every member of the Remote protocol and of its `helper` (the helper's own requests: snapshot, supervise, lease,
    mkdirs) checks the lock first; mypy holds both classes to their protocols (`_conforms` below), so a member the
    seam gains cannot be left unguarded."""

    def __init__(self, remote: Remote, lock: DeploymentLock) -> None:
        self.inner = remote
        self.lock = lock
        self.label = remote.label

    @property
    def helper(self) -> Helper:
        return GuardedHelper(self.inner.helper, self.lock)

    def run(self, cmd: str, *, timeout: float = 60.0, check: bool = True, stdin: bytes | None = None) -> Result:
        self.lock.ensure()
        with self.lock.fenced():
            return self.inner.run(cmd, timeout=timeout, check=check, stdin=stdin)

    def put(self, data: bytes, path: str, mode: int = 0o644) -> str:
        self.lock.ensure()
        with self.lock.fenced():
            return self.inner.put(data, path, mode)

    def put_all(self, files: Sequence[tuple[bytes, str, int]], hasher: Hasher | None = None) -> list[str]:
        self.lock.ensure()  # the one-argument call when no hasher is given: a narrower put_all (a test's) still fits
        with self.lock.fenced():
            return self.inner.put_all(files) if hasher is None else self.inner.put_all(files, hasher)

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        self.lock.ensure()
        return self.inner.read(path, offset, limit)

    def size(self, path: str) -> int | None:
        self.lock.ensure()
        return self.inner.size(path)

    def request(self, method: str, port: int, path: str, *, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 5.0, address: str = "127.0.0.1") -> HttpReply:
        self.lock.ensure()
        return self.inner.request(method, port, path, body=body, headers=headers, timeout=timeout, address=address)

    def spawn(self, cmd: str) -> Session:
        self.lock.ensure()
        return self.inner.spawn(cmd)

    def close(self) -> None:
        self.inner.close()


class GuardedHelper(Helper):
    """The helper's own requests, each only while the deployment lock is certainly held (Guarded.helper); the
    file ops (base.Helper's) go through `call`, guarded like the rest."""

    def __init__(self, helper: Helper, lock: DeploymentLock) -> None:
        self.inner = helper
        self.lock = lock

    def supervise(self, argv: Sequence[str], timeout: float) -> Result:
        self.lock.ensure()
        with self.lock.fenced():
            return self.inner.supervise(argv, timeout)

    def snapshot(self, argv: Sequence[str], timeout: float) -> dict[str, Any]:
        self.lock.ensure()
        return self.inner.snapshot(argv, timeout)

    def lease(self, path: str, holder: dict[str, Any], token: str, lease_s: float, mode: str,
              from_holder: str = "") -> Session:
        self.lock.ensure()
        return self.inner.lease(path, holder, token, lease_s, mode, from_holder)

    def mkdirs(self, path: str, owned_from: str) -> None:
        self.lock.ensure()
        with self.lock.fenced():
            self.inner.mkdirs(path, owned_from)

    def program(self, op: str) -> Session:
        self.lock.ensure()
        return self.inner.program(op)

    def call(self, op: str, fields: dict[str, Any], wait_s: float, what: str) -> dict[str, Any]:
        self.lock.ensure()
        with self.lock.fenced():  # a file op that changes a file is refused once the lease is another's
            return self.inner.call(op, fields, wait_s, what)


def _conforms(remote: Guarded, helper: GuardedHelper) -> tuple[Remote, Helper]:
    """Never called: mypy checks here that the guards implement the whole seam."""
    return remote, helper
