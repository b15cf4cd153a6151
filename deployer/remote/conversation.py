"""`Conversation`: one target-side helper process per command, spoken to in line-delimited JSON over one channel.

Every exec channel pays the target's login shell (conda/pyenv init in its rc file, ~150 ms on a GPU image), so a
command that ran a dozen small commands paid for a dozen shells. `Conversation.open(remote)` starts the helper
(deployer/supervisor/helper.py) once over a single exec channel, and the Conversation is itself a
`Remote` (the one target client: every call a typed request; `helper` is the requests only a helper answers):
`run` sends the command line to the helper, which runs it under bash with the environment the login
shell set up (same exit code and output as an exec channel, minus the shell's start-up), uploads keep going over
SFTP with their hashes checked by the helper, reads stay on SFTP and HTTP on direct-tcpip. Typed requests beyond
`run`: `verify` (fsync + sha256 of uploaded files) and `lease` (the deployment lock's lease, held by the helper).

The helper is shipped once: the exec line's loader runs `~/.cache/deployer/helper-<sha256>.py` when the target
has it intact, else it asks for the program (`DEPLOYER-HELPER-SEND`), reads it from the channel, checks its hash,
stores it and runs it, so a fresh target still costs one exec channel. A home that cannot be written runs it from
memory.

Replies are matched to requests by id (requests run concurrently on the helper: a heartbeat never waits behind a
long command). Every wait is bounded; a helper that dies or a channel that drops fails the calls in flight with a
RemoteError, and the next call starts a new conversation (one exec channel, as a reconnect would have).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from deployer.errors import CommandFailed, ConnectFailed, NotFound, RemoteError, TargetError, TransferFailed
from deployer.remote.base import CommandTimedOut, EndpointUnreachable, Hasher, Helper, HelperRefused, HttpReply, NoLine
from deployer.remote.base import Result
from deployer.remote.base import Session, Transport
from deployer.remote.oneshot import ProgramHelper
from deployer.supervisor.protocol import IN_HELPER   # supervisor commands the helper answers itself
from deployer.remote.oneshot import known
from deployer.remote.program import SUPERVISOR_PYTHON, TARGET_CACHE, payload_bundle

START_TIMEOUT_S = 30.0   # from the exec to the helper's hello (a first contact also uploads it)
REPLY_MARGIN_S = 15.0    # beyond a command's own timeout (the helper enforces that one and answers)
VERIFY_TIMEOUT_S = 60.0
FEED_WAIT_S = 60.0       # a program op's start, and one write to its stdin (it reads as a channel's program did)
INLINE_MAX = 4 << 20     # uploads up to this size (in all) travel inside the conversation
SEND_MARKER = "DEPLOYER-HELPER-SEND"
PROGRAM_MARKER = "DEPLOYER-HELPER-PROGRAM"
NOISE_KEPT = 20          # lines that were not the helper's (an rc file's chatter, a traceback): for errors
POLL_S = 5.0
HELPERS_KEPT = 5         # helper versions kept on a target (the newest stored; an older deployer resends its own)

# Runs on the target under `python3 -B -c`: the cached helper if it is intact, else ask for the program, read it
# from stdin, check it, cache it (atomically; a home that cannot be written, or that is not ours alone, runs it from
# memory; the oldest versions beyond HELPERS_KEPT go) and run it with its modules' compiled code, kept beside it per
# Python version and loaded only when its keyed hash (HMAC-SHA256 under a 0600 key of the cache's own) is right: a
# missing, unreadable or tampered table is compiled again and saved. Files are written new (O_EXCL, 0600: never
# through a symlink) and read only when they are the user's own and private (never through a symlink). It records
# the interpreter it runs under (program.SUPERVISOR_PYTHON). The program it checked stays in its global `src` (the
# helper runs itself again from it for a program op: helper.own_program).
# One-space indents: it travels in the exec line (argv), which stays short.
_LOADER = """import glob, hashlib, hmac, marshal, os, sys, types
path, digest, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
home = os.path.dirname(path)
try:
 os.makedirs(home, 0o700, exist_ok=True)
 s = os.stat(home)
 ok = s.st_uid == os.geteuid() and not s.st_mode & 18
except OSError:
 ok = False
def put(at, data, sync=0):
 t = at + ".%%d.tmp" %% os.getpid()
 try:
  with open(os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
   f.write(data)
   sync and (f.flush() or os.fsync(f.fileno()))
  os.replace(t, at)
  return True
 except OSError:
  return False
def read(at, n=-1):
 try:
  with open(os.open(at, os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
   s = os.fstat(f.fileno())
   return b"" if s.st_uid != os.geteuid() or s.st_mode & 63 else f.read(n)
 except OSError:
  return b""
src = read(path, size + 1)
ahead = []
if hashlib.sha256(src).hexdigest() != digest:
 sys.stdout.write("%s " + digest + "\\n")
 sys.stdout.flush()
 line = sys.stdin.buffer.readline()
 while line and not line.startswith(b"%s "):
  ahead.append(line)
  line = sys.stdin.buffer.readline()
 src = sys.stdin.buffer.read(size)
 if hashlib.sha256(src).hexdigest() != digest:
  sys.stderr.write("deployer helper: the program arrived damaged (%%d of %%d bytes)\\n" %% (len(src), size))
  sys.exit(3)
 if ok and put(path, src, True):
  try:
   for old in sorted(glob.glob(home + "/helper-*.py"), key=os.path.getmtime)[:-%d]:
    for gone in [old] + glob.glob(old[:-3] + ".*.code"):
     os.unlink(gone)
  except OSError:
   pass
me = (sys.executable or "").encode()
if ok and me.startswith(b"/") and read(home + "/python").strip() != me:
 put(home + "/python", me + b"\\n")
key = read(home + "/code.key", 33)
if len(key) != 32:
 key = os.urandom(32)
 ok = ok and put(home + "/code.key", key)
cp = path[:-3] + "." + str(sys.implementation.cache_tag) + ".code"
mac = lambda d: hmac.new(key, d, "sha256").digest()
t = read(cp)
try:
 codes = marshal.loads(t[32:]) if ok and hmac.compare_digest(t[:32], mac(t[32:])) else {}
 codes = codes if all(isinstance(c, types.CodeType) for c in codes.values()) else {}
except Exception:
 codes = {}
class Ahead:
 def __init__(self, real):
  self.real = real
 def readline(self):
  return ahead.pop(0) if ahead else self.real.readline()
if ahead:
 sys.stdin = types.SimpleNamespace(buffer=Ahead(sys.stdin.buffer))
sys.argv = [path, "serve", digest]
exec(compile(src, path, "exec"), {"__name__": "__main__", "CODES": codes,
     "SAVE_CODES": lambda c, m=marshal.dumps: ok and put(cp, mac(m(c)) + m(c))})
""" % (SEND_MARKER, PROGRAM_MARKER, HELPERS_KEPT)


def start_line() -> str:
    """The one exec line: run the cached helper, or receive it, cache it and run it (one python either way)."""
    payload, digest = payload_bundle()
    return f'exec {SUPERVISOR_PYTHON} -c {shlex.quote(_LOADER)} {TARGET_CACHE}/helper-{digest}.py {digest} {len(payload)}'


_T = TypeVar("_T")


class _Pending:
    def __init__(self, session: Session, rid: int = 0) -> None:
        self.session = session
        self.rid = rid
        self.done = threading.Event()
        self.reply: dict[str, Any] | None = None


class Conversation(Helper):
    """The Remote protocol with every command sent to one helper process on the target."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.label = inner.label
        self.hello: dict[str, Any] = {}
        self.starts = 0            # helper processes started (1 unless a conversation broke)
        self.shipped = 0           # times the helper program had to be sent (a fresh or damaged cache)
        self._session: Session | None = None
        self._pending: dict[int, _Pending] = {}
        self._streams: dict[int, ProgramStream] = {}   # a program op's request id -> its lines (Op.program)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()        # the session, the pending table
        self._send_lock = threading.Lock()
        self._noise: deque[str] = deque(maxlen=NOISE_KEPT)
        self._dead: str | None = None
        self._closed = False
        self._greet_lock = threading.Lock()
        self._greeted_on: Session | None = None

    @classmethod
    def open(cls, inner: Transport, *, wait: bool = True) -> Conversation:
        """Start the helper; with `wait`, until it said hello (a helper that cannot start raises here), else the
        first request goes out at once and its wait includes the start."""
        conv = cls(inner)
        session = conv._ensure()
        if wait:
            conv._greeted(session)
        return conv

    @property
    def helper(self) -> Helper:
        """The requests only the helper answers (supervise, snapshot, lease, mkdirs): this conversation's own."""
        return self

    @property
    def version(self) -> str:
        """The helper's content hash (what a run dir records as the helper that wrote it)."""
        return str(self.hello.get("version") or payload_bundle()[1])

    # -- the conversation ---------------------------------------------------------------------------------

    def _ensure(self) -> Session:
        """The helper's channel, started if there is none (its hello is awaited by `_greeted`, so that the first
        request travels with the exec instead of one round trip after it)."""
        with self._lock:
            if self._closed:
                raise RemoteError("the conversation with the deployer helper was closed", host=self.label)
            if self._session is not None and self._dead is None:
                return self._session
            self._close_session()
            session = self.inner.spawn(start_line())
            self.starts += 1
            self._session, self._dead, self._pending = session, None, {}
            ended, self._streams = self._streams, {}
        for stream in ended.values():   # their programs went with the helper that ran them
            stream.arrived(None)
        return session

    def _greeted(self, session: Session) -> None:
        """Wait for this channel's hello (sending the program if the target asks for it), then hand the channel to
        the reader thread. A helper that does not start is a TargetError, for every request sent on it."""
        if self._greeted_on is session:  # every request after the first: no lock on this path (see below)
            return
        # Bounded: a Ctrl-C that lands in another wait must never leave a later one (the lock's release) stuck here.
        if not self._greet_lock.acquire(timeout=START_TIMEOUT_S + REPLY_MARGIN_S):
            raise TargetError(f"the deployer helper did not start on {self.label}: no hello within "
                              f"{START_TIMEOUT_S + REPLY_MARGIN_S:g}s")
        try:
            if self._greeted_on is session:
                return
            try:
                self.hello = self._greet(session)
            except BaseException as e:
                with self._lock:
                    if self._session is session:
                        self._dead = str(e)
                        self._close_session()
                raise
            self._greeted_on = session
            threading.Thread(target=self._read, args=(session,), name="deployer-helper-reader", daemon=True).start()
        finally:
            self._greet_lock.release()

    def _greet(self, session: Session) -> dict[str, Any]:
        deadline = time.monotonic() + START_TIMEOUT_S
        payload, digest = payload_bundle()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TargetError(f"the deployer helper did not start on {self.label} within "
                                  f"{START_TIMEOUT_S:g}s{self._said()}")
            try:
                line = session.readline(timeout=left)
            except NoLine:
                continue
            if line is None:
                raise TargetError(f"the deployer helper did not start on {self.label}{self._said()}",
                                  hint=start_hint(list(self._noise), self.label))
            if line.strip() == f"{SEND_MARKER} {digest}":  # after the requests already sent: the loader keeps them
                with self._send_lock:  # never inside another thread's request line
                    session.send(f"{PROGRAM_MARKER} {len(payload)}\n".encode() + payload)
                self.shipped += 1
                continue
            data = _json(line)
            if data is not None and isinstance(data.get("hello"), dict):
                return dict(data["hello"])
            self._noise.append(line)

    def _said(self) -> str:
        return f": {' | '.join(list(self._noise)[-3:])}" if self._noise else ""

    def _read(self, session: Session) -> None:
        """Hand each reply line to the request that waits for it; anything else is kept as noise."""
        why = "the helper ended the conversation"
        try:
            while True:
                try:
                    line = session.readline(timeout=POLL_S)
                except NoLine:
                    continue
                if line is None:
                    break
                data = _json(line)
                if data is not None and isinstance(data.get("stream"), int):
                    self._stream_line(data)
                    continue
                rid = data.get("id") if data is not None else None
                with self._lock:
                    waiting = self._pending.pop(rid, None) if isinstance(rid, int) else None
                if waiting is None:
                    self._noise.append(line)
                    continue
                waiting.reply = data
                waiting.done.set()
        except (RemoteError, OSError, ValueError) as e:
            why = f"the helper's channel broke: {e}"
        with self._lock:
            if self._session is session:
                self._dead = why + self._said()
            pending, self._pending = (self._pending, {}) if self._session is session else ({}, self._pending)
            streams, self._streams = (self._streams, {}) if self._session is session else ({}, self._streams)
        for waiting in pending.values():
            waiting.done.set()
        for stream in streams.values():   # the helper is gone, and its programs with it: their lines end
            stream.arrived(None)

    def forget(self, sid: int) -> None:
        """No more lines for the stream of request `sid` (its program did not start)."""
        with self._lock:
            self._streams.pop(sid, None)

    def _stream_line(self, data: dict[str, Any]) -> None:
        """A line of a program op's child, or its end, to the stream that reads it."""
        sid = int(data["stream"])
        with self._lock:
            stream = self._streams.pop(sid, None) if "end" in data else self._streams.get(sid)
        if stream is not None:
            stream.arrived(None if "end" in data else str(data.get("line") or ""))

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def send(self, op: str, fields: dict[str, Any], stream: ProgramStream | None = None) -> _Pending:
        """Send one request (`op`: a name of the protocol's table, protocol.OPS); wait for its reply with
        `wait`. `stream`: a program op's, which its child's lines go to (registered before they can come)."""
        known(op)
        session = self._ensure()
        rid = next(self._ids)
        waiting = _Pending(session, rid)
        with self._lock:
            if self._session is not session or self._dead is not None:  # it broke just now: fail fast, not late
                raise ConnectFailed(f"connection lost: {self._dead or 'the helper was restarted'}", host=self.label)
            self._pending[rid] = waiting
            if stream is not None:
                self._streams[rid] = stream
        line = json.dumps({"id": rid, "op": op, **fields}).encode() + b"\n"
        try:
            with self._send_lock:
                session.send(line)
        except RemoteError as e:
            with self._lock:
                self._pending.pop(rid, None)
                self._streams.pop(rid, None)
                if self._session is session:
                    self._dead = str(e)
            if self._greeted_on is not session:
                # the first request travels with the exec: a target that never ran the helper (a nologin shell
                # exits at once) closes the channel under it; what it printed says why, the broken send does not
                self._greeted(session)
            raise ConnectFailed(f"connection lost: the deployer helper's channel broke: {e.message}",
                                host=self.label) from None
        return waiting

    def wait(self, waiting: _Pending, timeout: float, what: str) -> dict[str, Any]:
        """The reply (ok true); a failed request raises TargetError, a broken conversation RemoteError, no reply
        within `timeout` NoLine."""
        self._greeted(waiting.session)
        if not waiting.done.wait(timeout):
            with self._lock:
                for rid, other in list(self._pending.items()):
                    if other is waiting:
                        del self._pending[rid]
            raise NoLine(f"{what}: no answer from the deployer helper within {timeout:g}s", host=self.label)
        reply = waiting.reply
        if reply is None:  # the channel dropped (or the helper died) with the request in flight
            raise ConnectFailed(f"connection lost while {what}: {self._dead or 'the helper ended the conversation'}",
                                host=self.label)
        if not reply.get("ok"):
            said = str(reply.get("error"))
            raise HelperRefused(f"{what} on {self.label}: the deployer helper said: {said}", said,
                                str(reply.get("kind") or ""))
        return reply

    def call(self, op: str, fields: dict[str, Any], wait_s: float, what: str) -> dict[str, Any]:
        return self.wait(self.send(op, fields), wait_s, what)

    # -- typed requests -----------------------------------------------------------------------------------

    def verify(self, paths: Sequence[str], timeout: float = VERIFY_TIMEOUT_S) -> list[str | None]:
        """fsync + sha256 of files on the target (uploads under their temp names), in one request."""
        try:
            reply = self.call("verify", {"paths": list(paths)}, timeout, f"verify {paths[0] if paths else ''}")
        except NoLine:
            raise TransferFailed(f"verify {paths[0]}: timed out after {timeout:g}s", host=self.label) from None
        digests = reply.get("digests")
        if not isinstance(digests, list) or len(digests) != len(paths):
            raise TransferFailed(f"verify {paths[0]}: the helper answered {str(reply)[:200]}", host=self.label)
        return [d if isinstance(d, str) else None for d in digests]

    def supervise(self, argv: Sequence[str], timeout: float) -> Result:
        """A supervisor command answered inside the helper (status, ports, listener: no process started for it);
        the others (start, stop: they start processes) run as `python3 -B -` commands through it."""
        if not argv or argv[0] not in IN_HELPER:
            return BareHelper(self).supervise(argv, timeout)
        cmd = "supervise " + " ".join(argv)
        try:
            reply = self.call("supervise", {"argv": list(argv)}, timeout + REPLY_MARGIN_S, cmd)
        except NoLine:
            raise CommandTimedOut(Result(cmd, -1, "", ""), timeout, host=self.label) from None
        return Result(cmd, int(reply.get("exit_code", -1)), str(reply.get("stdout") or ""),
                      str(reply.get("stderr") or ""))

    def snapshot(self, argv: Sequence[str], timeout: float) -> dict[str, Any]:
        """The snapshot of a deployment dir (snapshot.py's `snapshot ARGV`), read by the helper itself."""
        what = f"cannot read {argv[0] if argv else 'a snapshot'} on {self.label}"
        try:
            reply = self.call("snapshot", {"argv": list(argv)}, timeout, "reading a snapshot")
        except NoLine:
            raise TargetError(f"{what}: no answer within {timeout:g} s") from None
        except HelperRefused as e:  # the helper's own words: a usage error, a dir it cannot read
            raise TargetError(f"{what}: {e.said}") from None
        data = reply.get("data")
        if not isinstance(data, dict):
            raise TargetError(f"{what}: the deployer helper answered {str(reply)[:200]}")
        return data

    def lease(self, path: str, holder: dict[str, Any], token: str, lease_s: float, mode: str,
              from_holder: str = "") -> LeaseSession:
        """Take the deployment lock's lease through the helper: a Session that speaks the lease program's lines."""
        return LeaseSession(self, {"path": path, "holder": holder, "token": token, "lease_s": lease_s,
                                   "mode": mode, "from": from_holder})

    def mkdirs(self, path: str, owned_from: str) -> None:
        """base.make_dirs in the helper; HelperRefused (kind "unsafe": a chain another user controls)."""
        self.call("mkdirs", {"path": path, "owned_from": owned_from}, 30.0, f"creating {path}")

    def program(self, op: str) -> ProgramStream:
        """A program op (fetch, push: protocol.Op.program) started by the helper as its child: a Session
        over its stdin and stdout+stderr lines, as its exec channel was (closing it ends the program)."""
        return ProgramStream(self, op)

    # -- the Remote protocol ------------------------------------------------------------------------------

    def run(self, cmd: str, *, timeout: float = 60.0, check: bool = True, stdin: bytes | None = None) -> Result:
        fields: dict[str, Any] = {"cmd": cmd, "timeout": timeout}
        if stdin is not None:
            fields["stdin_b64"] = base64.b64encode(stdin).decode("ascii")
        try:
            reply = self.call("run", fields, timeout + REPLY_MARGIN_S, f"running {cmd[:80]!r}")
        except NoLine:
            raise CommandTimedOut(Result(cmd, -1, "", ""), timeout, host=self.label) from None
        result = Result(cmd, int(reply.get("exit_code", -1)), str(reply.get("stdout") or ""),
                        str(reply.get("stderr") or ""))
        if reply.get("timed_out"):
            raise CommandTimedOut(result, timeout, host=self.label)
        if check and not result.ok:
            raise CommandFailed(result, host=self.label)
        return result

    def put(self, data: bytes, path: str, mode: int = 0o644) -> str:
        return self.put_all([(data, path, mode)])[0]

    def put_all(self, files: Sequence[tuple[bytes, str, int]], hasher: Hasher | None = None) -> list[str]:
        """Small uploads (a run dir: scripts, env, records) travel in one `install` request: written, fsynced,
        checked and renamed into place by the helper; over SFTP each file cost ~5 round trips (open, chmod,
        close, chmod, rename: ~50 for a run dir, 2.5 s at 50 ms). Large ones go over SFTP, checked by the helper."""
        if not files or sum(len(data) for data, _, _ in files) > INLINE_MAX:
            return self.inner.put_all(files, hasher or self.verify)  # SFTP, checked by the helper (no exec)
        digests = [hashlib.sha256(data).hexdigest() for data, _, _ in files]
        payload = [{"path": path, "mode": mode, "sha256": digest, "data_b64": base64.b64encode(data).decode("ascii")}
                   for (data, path, mode), digest in zip(files, digests)]
        where = files[0][1]
        try:
            self.call("install", {"files": payload}, VERIFY_TIMEOUT_S, f"writing {where}")
        except NoLine:
            raise TransferFailed(f"cannot write {where}: no answer within {VERIFY_TIMEOUT_S:g}s",
                                 host=self.label) from None
        except HelperRefused as e:  # the helper's words: cannot write PATH: why, or a sha256 mismatch
            if e.kind == "fenced":
                raise  # the lease is no longer ours: the lock's guard reports it as the lost lock
            raise TransferFailed(e.said, host=self.label) from None
        return digests

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Read by the helper: one round trip (SFTP: a session of its own, then open/stat/read/close each)."""
        if limit > INLINE_MAX:
            return self.inner.read(path, offset, limit)
        reply = self._once_more(lambda: self._file_call("read", {"path": path, "offset": offset, "limit": limit},
                                                        f"read {path}"))
        try:
            return base64.b64decode(str(reply.get("data_b64") or ""), validate=True)
        except ValueError:
            raise TransferFailed(f"read {path}: the helper answered {str(reply)[:120]}", host=self.label) from None

    def size(self, path: str) -> int | None:
        size = self._once_more(lambda: self._file_call("size", {"path": path}, f"stat {path}")).get("size")
        return size if isinstance(size, int) else None

    def _http(self, fields: dict[str, Any], timeout: float) -> dict[str, Any]:
        return self.call("http", fields, timeout + REPLY_MARGIN_S,
                         f"HTTP {fields['method']} {fields['address']}:{fields['port']}{fields['path']}")

    @staticmethod
    def _once_more(attempt: Callable[[], _T]) -> _T:
        """A request that changes nothing: when the conversation broke under it (a dropped link), once more on a
        new one (the next request starts a new helper), as a direct-tcpip channel or SFTP reconnected before."""
        try:
            return attempt()
        except ConnectFailed:
            return attempt()

    def _file_call(self, op: str, fields: dict[str, Any], what: str) -> dict[str, Any]:
        """A request on a file: NotFound for a missing one, TransferFailed for other failures (as over SFTP)."""
        try:
            return self.call(op, fields, VERIFY_TIMEOUT_S, what)
        except NoLine:
            raise TransferFailed(f"{what}: no answer within {VERIFY_TIMEOUT_S:g}s", host=self.label) from None
        except HelperRefused as e:
            if e.kind == "notfound":
                raise NotFound(f"{self.label}: {e.said}") from None
            raise TransferFailed(f"{what}: {e.said}", host=self.label) from None

    def request(self, method: str, port: int, path: str, *, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 5.0, address: str = "127.0.0.1") -> HttpReply:
        """HTTP sent by the helper from the target (as a direct-tcpip channel would reach it): one round trip
        instead of two, and it works where sshd forbids forwarding."""
        fields: dict[str, Any] = {"method": method, "address": address, "port": port, "path": path,
                                  "headers": headers or {}, "timeout": timeout}
        if body is not None:
            fields["body_b64"] = base64.b64encode(body).decode("ascii")
        try:
            if method in ("GET", "HEAD"):
                reply = self._once_more(lambda: self._http(fields, timeout))
            else:
                reply = self._http(fields, timeout)
        except NoLine:
            raise EndpointUnreachable(f"HTTP {method} {address}:{port}{path} timed out", host=self.label) from None
        except HelperRefused as e:
            if e.kind != "unreachable":
                raise
            raise EndpointUnreachable(e.said, host=self.label) from None
        try:
            data = base64.b64decode(str(reply.get("body_b64") or ""), validate=True)
            heads = {str(k): str(v) for k, v in reply.get("headers") or []}
            return HttpReply(int(reply["status"]), data, heads)
        except (KeyError, TypeError, ValueError):
            raise EndpointUnreachable(f"HTTP {method} {address}:{port}{path}: the helper answered "
                                      f"{str(reply)[:120]}", host=self.label) from None

    def spawn(self, cmd: str) -> Session:
        return self.inner.spawn(cmd)

    def close(self) -> None:
        """End the conversation (the helper exits on EOF); the connection itself is the inner remote's."""
        with self._lock:
            self._closed = True
            self._dead = self._dead or "the conversation was closed"
            self._close_session()


class ProgramStream:
    """A program op's child as a Session (what an exec channel running it was): `send` feeds its stdin (one `feed`
    request, answered before the next), `readline` its stdout+stderr lines (None once it ended, or the helper did),
    `close` closes its stdin (it ends, as it did when its channel went). The conversation goes on meanwhile."""

    def __init__(self, conv: Conversation, op: str) -> None:
        self._conv = conv
        self._lines: deque[str | None] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self._ended = False    # its end came (or the helper's): nothing is sent for it any more
        started = conv.send(op, {}, stream=self)
        self._id = started.rid
        try:
            conv.wait(started, FEED_WAIT_S, f"starting the helper's {op}")
        except BaseException:
            conv.forget(self._id)
            raise

    def arrived(self, line: str | None) -> None:
        with self._ready:
            self._lines.append(line)
            self._ended = self._ended or line is None
            self._ready.notify_all()

    def send(self, data: bytes) -> None:
        if self._closed:
            raise RemoteError("session closed", host=self._conv.label)
        if self._ended:
            return  # its lines say how it ended (a request to a new helper would only start one for nothing)
        fields = {"stream": self._id, "data_b64": base64.b64encode(data).decode("ascii")}
        try:
            self._conv.call("feed", fields, FEED_WAIT_S, "writing to the helper's program")
        except HelperRefused:
            pass  # it ended already: its lines say how (as bytes sent down a channel whose command ended)

    def readline(self, timeout: float) -> str | None:
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self._lines), timeout):
                raise NoLine(f"no output line within {timeout:g}s", host=self._conv.label)
            line = self._lines[0]
            if line is not None:
                self._lines.popleft()
            return line

    def close(self) -> None:
        if self._closed or self._ended:
            self._closed = True
            return
        self._closed = True
        try:  # not waited for: a close never blocks (its reply, or the error of a program that ended, is dropped)
            self._conv.send("feed", {"stream": self._id, "eof": True})
        except RemoteError:
            pass  # the conversation is gone, and the program with it


class LeaseSession:
    """The lease program's line protocol (deployer/box/lock.py speaks it) over the helper's typed lease requests:
    the first line answers the take (`LOCKED|BUSY|LOST {json}`), `HB` -> `OK <s>`|`LOST {json}`, `RELEASE` ->
    `RELEASED`. Each sent word is one request; readline waits for the oldest answer."""

    def __init__(self, conv: Conversation, take: dict[str, Any]) -> None:
        self._conv = conv
        self._token = str(take["token"])
        self._queue: deque[tuple[_Pending, str]] = deque([(conv.send("lease_take", take), "take")])
        self._closed = False

    def send(self, data: bytes) -> None:
        if self._closed:
            raise RemoteError("session closed", host=self._conv.label)
        for word in data.decode("ascii", "replace").split():
            if word in ("HB", "RELEASE"):
                waiting = self._conv.send("lease_beat", {"token": self._token, "release": word == "RELEASE"})
                self._queue.append((waiting, word))

    def readline(self, timeout: float) -> str | None:
        if not self._queue:
            raise NoLine("no request waits for an answer", host=self._conv.label)
        waiting, what = self._queue[0]
        try:
            reply = self._conv.wait(waiting, timeout, f"the deployment lock ({what})")
        except HelperRefused as e:  # the helper could not do it (a lock file it cannot open): said as the program did
            self._queue.popleft()
            return f"lease: {e.said}"
        self._queue.popleft()
        word, data = str(reply.get("word") or ""), reply.get("data")
        if word == "OK":
            return f"OK {(data or {}).get('lease_s', '')}"
        if word == "RELEASED":
            return word
        return f"{word} {json.dumps(data if isinstance(data, dict) else {}, sort_keys=True)}"

    def close(self) -> None:
        self._closed = True   # the helper keeps the lease file open until RELEASE or the conversation's end


class BareHelper(ProgramHelper):
    """A bare connection's helper (SSHRemote.helper, LocalRemote.helper): ProgramHelper's one program per request,
    and the requests that last (the lease, a program op) on a helper conversation of their own, which closing their
    session ends."""

    def lease(self, path: str, holder: dict[str, Any], token: str, lease_s: float, mode: str,
              from_holder: str = "") -> Session:
        """The lease held by a helper of its own (one exec channel, as the lease program's was): its `lease_take`
        and `lease_beat`, as a Conversation's; closing the session ends that helper (the lease expires unless
        released, as when the program's channel went)."""
        conv = self._conversation()
        try:
            return _Owning(conv.lease(path, holder, token, lease_s, mode, from_holder), conv)
        except BaseException:
            conv.close()
            raise

    def program(self, op: str) -> Session:
        """A program op (fetch, push) run by a helper of its own (one exec channel, as the `-c` program's was);
        closing the session ends the program and that helper."""
        conv = self._conversation()
        try:
            return _Owning(conv.program(op), conv)
        except BaseException:
            conv.close()
            raise

    def _conversation(self) -> Conversation:
        return Conversation.open(self.remote, wait=False)


class _Owning:
    """A Session of a conversation of its own: closing it closes that conversation too (its helper ends)."""

    def __init__(self, inner: Session, conv: Conversation) -> None:
        self.inner, self.conv = inner, conv

    def readline(self, timeout: float) -> str | None:
        return self.inner.readline(timeout)

    def send(self, data: bytes) -> None:
        self.inner.send(data)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.conv.close()


# What nologin(8) and friends print instead of running a command: the account may not log in at all.
REFUSED_LOGIN = ("This account is currently not available", "nologin", "account is disabled")


def start_hint(said: list[str], label: str) -> str:
    """Why a helper that never said hello most likely did not start, from what the target printed instead."""
    user = label.partition("@")[0] if "@" in label else "USER"
    if any(marker.lower() in line.lower() for line in said for marker in REFUSED_LOGIN):
        return (f"the account's login shell refuses logins (nologin): give {user} a shell (e.g. "
                f"`usermod -s /bin/bash {shlex.quote(user)}` on the target) or deploy as another user")
    return "the target needs python3 (>= 3.8) on the login shell's PATH"


def _json(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
