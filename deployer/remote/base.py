"""The remote seam: the one interface every step uses to act on a target host.

`remote.connect.connect(spec)` returns a `Remote`: `SSHRemote` (remote/ssh/connection.py, one SSH connection
per host, reused for every call), `LocalRemote` (remote/local.py, for `host: local`) or, in tests, `FakeRemote`
(remote/fake.py). Those are the transports: what the helper conversation (remote/conversation.py) needs of them is
`spawn` (its one exec channel), `put_all` (bulk uploads, checked by the helper's `hasher`), `read` (large reads)
and `close`. The Conversation is itself a `Remote` and the one target client: every call a typed request to the
target-side helper; its `helper` member holds the helper's own requests (a bare connection's runs one program per
request: remote/oneshot.py). They raise only
classes from deployer.errors (plus the RemoteError subclasses defined here); no paramiko, socket or subprocess
exception crosses this seam.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from collections.abc import Sequence
from collections.abc import Callable
from typing import Any, Protocol

from deployer.errors import CommandFailed, RemoteError, TargetError

FILE_WAIT_S = 30.0
REMOVE_WAIT_S = 120.0


@dataclass(frozen=True)
class Result:
    """What a finished command left behind."""

    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class DiskFacts:
    """Free bytes under a folder (None: it cannot be stat'ed) and each file's sha256 (None: missing/unreadable)."""

    free: int | None
    digests: list[str | None]


@dataclass(frozen=True)
class NewDir:
    """`mkdir`'s answer: made, or not (too little space: `free` bytes)."""

    made: bool
    free: int | None


class EndpointUnreachable(RemoteError):
    """Nothing listening on the port on the target, or the HTTP exchange failed or timed out."""


class CommandTimedOut(CommandFailed):
    """A remote command ran past its timeout; `result` holds the output captured so far (exit_code -1)."""

    def __init__(self, result: Result, timeout: float, *, host: str | None = None) -> None:
        super().__init__(result, host=host)
        self.timeout = timeout
        detail = f": {' | '.join(self.tail)}" if self.tail else ""
        self.message = f"{host + ': ' if host else ''}command {result.command!r} timed out after {timeout:g}s{detail}"
        self.args = (self.message,)


class HelperRefused(TargetError):
    """A request the helper answered with ok false: its own words (`said`) and the kind of failure (`kind`:
    notfound, unreachable, os, lease, unsafe, ...), which the typed requests turn into the seam's errors."""

    def __init__(self, message: str, said: str, kind: str) -> None:
        super().__init__(message)
        self.said, self.kind = said, kind


class NoLine(RemoteError):
    """A Session's readline got no line within its timeout (the session itself may be fine)."""


class Session(Protocol):
    """A long-running remote command with an open stdin (used for the deployment lock).

    stdout and stderr arrive merged, in one stream.
    """

    def readline(self, timeout: float) -> str | None:
        """One output line (without the newline); None at EOF; RemoteError if none came within timeout."""
        ...

    def send(self, data: bytes) -> None:
        """Write to the command's stdin; RemoteError if the session is gone."""
        ...

    def close(self) -> None:
        """Close stdin (the command sees EOF) and the channel; idempotent."""
        ...


class LineReader:
    """Splits a command's output into lines for a Session; subclasses supply `_recv`."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._buf = b""
        self._eof = False
        self._closed = False

    def _recv(self, wait: float) -> bytes | None:
        """Up to 64 KiB within `wait` seconds: None if nothing came yet, b"" at EOF."""
        raise NotImplementedError

    def readline(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf and not self._eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoLine(f"no output line within {timeout:g}s", host=self._label)
            chunk = self._recv(left)
            if chunk is not None:
                self._eof = not chunk
                self._buf += chunk
        if not self._buf:
            return None
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", errors="replace")


# fsync + sha256 of uploaded temp files on the target, in one request (a helper's `verify`): None for an unreadable one.
Hasher = Callable[[Sequence[str], float], "list[str | None]"]


class Helper(Protocol):
    """The typed requests of the target-side helper, a Remote's `helper`: a Conversation answers them in its helper
    process (remote/conversation.py), a bare connection with one program each (remote/oneshot.py), the lock's
    GuardedHelper after its check (box/lock.py). Each subclasses it and gives `call` and the five requests that
    need its own state; the file requests below come with it, each one `call` with a typed reply instead of a shell
    line (the ones that change something take `within`, the deployment dir: the helper refuses a path outside it or
    a symlink on the way, kind "unsafe")."""

    def supervise(self, argv: Sequence[str], timeout: float) -> Result:
        """A supervisor command (its exit code and output; the caller checks them)."""
        ...

    def snapshot(self, argv: Sequence[str], timeout: float) -> dict[str, Any]:
        """snapshot's `snapshot ARGV`, read by the helper."""
        ...

    def lease(self, path: str, holder: dict[str, Any], token: str, lease_s: float, mode: str,
              from_holder: str = "") -> Session:
        """The deployment lock's lease held by the helper: a Session speaking the lease program's lines."""
        ...

    def mkdirs(self, path: str, owned_from: str) -> None:
        """base.make_dirs; HelperRefused (kind "unsafe" for a chain another user controls) on failure."""
        ...

    def program(self, op: str) -> Session:
        """A program op of the helper's (fetch, push: protocol.Op.program) running for as long as it
        takes: a Session over its stdin and its stdout+stderr lines; closing it ends the program."""
        ...

    def call(self, op: str, fields: dict[str, Any], wait_s: float, what: str) -> dict[str, Any]:
        """One request of the helper's (the file ops below are built on it); the helper's errors: HelperRefused,
        NoLine, ..."""
        ...

    # the file requests (supervisor/files.py answers them), built here on `call` for every helper: a new
    # one is its row in protocol.OPS, its function there, and its method here
    def _ask(self, op: str, fields: dict[str, Any], what: str, wait_s: float = FILE_WAIT_S) -> dict[str, Any]:
        try:
            return self.call(op, fields, wait_s, what)
        except NoLine:
            raise TargetError(f"{what}: no answer from the deployer helper within {wait_s:g}s") from None

    def link(self, path: str, target: str, within: str) -> None:
        """`path` atomically replaced by a symlink to `target` (relative to its folder; the old link not followed)."""
        self._ask("link", {"path": path, "target": target, "within": within}, f"pointing {path} at {target}")

    def readlink(self, path: str) -> str | None:
        """Where the symlink `path` points; None when it is missing or not a symlink."""
        target = self._ask("readlink", {"path": path}, f"reading the link {path}").get("target")
        return target if isinstance(target, str) else None

    def remove(self, paths: list[str], within: str) -> int:
        """Remove files, symlinks and whole dirs below `within` (none followed, missing ones fine): how many went."""
        if not paths:
            return 0
        reply = self._ask("remove", {"paths": list(paths), "within": within}, f"removing {paths[0]}", REMOVE_WAIT_S)
        return int(reply.get("removed") or 0)

    def disk(self, path: str, files: list[str]) -> DiskFacts:
        """The free bytes under `path` and the sha256 of each of `files`, in one request."""
        reply = self._ask("disk", {"path": path, "files": list(files)}, f"reading the disk under {path}")
        free, digests = reply.get("free"), reply.get("digests") or []
        return DiskFacts(free if isinstance(free, int) else None,
                         [d if isinstance(d, str) else None for d in digests][:len(files)])

    def mkdir(self, path: str, within: str, need: int) -> NewDir:
        """A new 0700 dir `path` below `within`, made only when `need` bytes are free there (HelperRefused, kind
        "exists", when it exists)."""
        reply = self._ask("mkdir", {"path": path, "within": within, "need": need}, f"creating {path}")
        free = reply.get("free")
        return NewDir(bool(reply.get("made")), free if isinstance(free, int) else None)

    def listdir(self, path: str) -> list[str] | None:
        """The folder's entries, sorted, hidden ones left out; None when it cannot be listed."""
        names = self._ask("listdir", {"path": path}, f"listing {path}").get("names")
        return [str(n) for n in names] if isinstance(names, list) else None

    def find_bytes(self, path: str, needle: bytes, offset: int = 0) -> int | None:
        """The file offset of the first `needle` at or after `offset` (None: not found)."""
        reply = self._ask("find_bytes", {"path": path, "needle_b64": base64.b64encode(needle).decode("ascii"),
                                         "offset": offset}, f"searching {path}", 60.0)
        at = reply.get("at")
        return at if isinstance(at, int) else None

    def kernel_log(self, lines: int = 300) -> str:
        """The kernel ring buffer's last lines ("" when the target does not let this user read it)."""
        return str(self._ask("kernel_log", {"lines": lines}, "reading the kernel log").get("text") or "")

    def listen(self, port: int, peers: int, timeout_s: float) -> int:
        """Listen on 0.0.0.0:`port` until `peers` connections came or `timeout_s` passed: how many came
        (HelperRefused, kind "bind", when the port cannot be bound)."""
        reply = self._ask("listen", {"port": port, "peers": peers, "timeout_s": timeout_s},
                          f"listening on port {port}", timeout_s + FILE_WAIT_S)
        return int(reply.get("accepted") or 0)

    def reach(self, address: str, port: int, timeout_s: float) -> str | None:
        """Connect to `address`:`port`, again until `timeout_s`: None once it answered, else the last error."""
        reply = self._ask("reach", {"address": address, "port": port, "timeout_s": timeout_s},
                          f"connecting to {address}:{port}", timeout_s + FILE_WAIT_S)
        return None if reply.get("reached") else str(reply.get("error") or "no answer")

    def lease_show(self, path: str) -> dict[str, Any]:
        """The lock's lease as the target's clock judges it (`held`, `expires_in`, ...; {"held": False}: no file)."""
        lease = self._ask("lease_show", {"path": path}, f"reading the lock {path}").get("lease")
        if not isinstance(lease, dict):
            raise TargetError(f"reading the lock {path}: the deployer helper answered no lease")
        return lease

    def runs(self, path: str) -> dict[str, Any]:
        """Retention's summary of the runs dir `path`: {"runs": [{id, hash, ready, status, env}], "current"}."""
        return self._ask("runs", {"path": path}, f"listing the runs of {path}", 60.0)


class Transport(Protocol):
    """What the helper conversation needs of a connection (httpx's transport, for the target): its one exec channel
    (`spawn`), bulk uploads and large reads that do not fit a request, and `close`. SSHRemote, LocalRemote and
    FakeRemote are transports (and, for the callers that still take a bare connection, Remotes)."""

    label: str

    def spawn(self, cmd: str) -> Session:
        ...

    def put_all(self, files: Sequence[tuple[bytes, str, int]], hasher: Hasher | None = None) -> list[str]:
        ...

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        ...

    def close(self) -> None:
        ...


class Remote(Protocol):
    """The target as every step uses it; the one implementation that always talks to the helper is the
    Conversation (remote/conversation.py), the lock's Guarded wraps it."""

    label: str

    @property
    def helper(self) -> Helper:
        """The target-side helper's typed requests (supervise, snapshot, lease, mkdirs)."""
        ...

    def run(
        self, cmd: str, *, timeout: float = 60.0, check: bool = True, stdin: bytes | None = None
    ) -> Result:
        """Run a shell command line (callers quote with shlex.quote). check=True: non-zero -> CommandFailed."""
        ...

    def put(self, data: bytes, path: str, mode: int = 0o644) -> str:
        """Atomically replace `path` with `data` at `mode`; returns the verified sha256 hex."""
        ...

    def put_all(self, files: Sequence[tuple[bytes, str, int]], hasher: Hasher | None = None) -> list[str]:
        """`put` for several (data, path, mode): each replaced atomically, all verified in one round trip (by
        `hasher` when given: a helper's request); nothing is renamed into place before every file has verified
        (the temps are removed on failure)."""
        ...

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Up to `limit` bytes from `offset`; b"" at or after EOF; errors.NotFound if the file is missing."""
        ...

    def size(self, path: str) -> int | None:
        """The file's size in bytes, None if it does not exist."""
        ...

    def request(
        self,
        method: str,
        port: int,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 5.0,
        address: str = "127.0.0.1",
    ) -> HttpReply:
        """Real HTTP/1.1 to address:port as the target reaches it (default its loopback); EndpointUnreachable
        when nothing answers."""
        ...

    def spawn(self, cmd: str) -> Session:
        ...

    def close(self) -> None:
        ...
