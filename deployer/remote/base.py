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

import time
from dataclasses import dataclass
from collections.abc import Sequence
from collections.abc import Callable
from typing import Any, Protocol

from deployer.errors import CommandFailed, RemoteError, TargetError

LOCAL = "local"


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
class TargetSpec:
    """Everything needed to reach a host. Unset fields fall back to ~/.ssh/config, then to ssh's defaults."""

    host: str  # hostname, ~/.ssh/config alias, or "local"
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None  # default ~/.ssh/known_hosts (or the config's UserKnownHostsFile)
    ssh_config: str | None = None  # default ~/.ssh/config; env DEPLOYER_SSH_CONFIG overrides the default
    trust_new_host: bool = False  # record an unknown host's key instead of refusing
    connect_timeout: float = 10.0

    @property
    def label(self) -> str:
        """`user@host:port` for messages, leaving out what is not set."""
        if self.host == LOCAL:
            return LOCAL
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.host}{port}"


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
    process (remote/conversation.py), a bare connection with one program each (remote/oneshot.py)."""

    def supervise(self, argv: Sequence[str], timeout: float) -> Result:
        """A supervisor command (its exit code and output; the caller checks them)."""
        ...

    def snapshot(self, argv: Sequence[str], timeout: float) -> dict[str, Any]:
        """supervise_snapshot's `snapshot ARGV`, read by the helper."""
        ...

    def lease(self, path: str, holder: dict[str, Any], token: str, lease_s: float, mode: str,
              from_holder: str = "") -> Session:
        """The deployment lock's lease held by the helper: a Session speaking the lease program's lines."""
        ...

    def mkdirs(self, path: str, owned_from: str) -> None:
        """supervise_base.make_dirs; HelperRefused (kind "unsafe" for a chain another user controls) on failure."""
        ...

    def program(self, op: str) -> Session:
        """A program op of the helper's (fetch, push: supervise_protocol.Op.program) running for as long as it
        takes: a Session over its stdin and its stdout+stderr lines; closing it ends the program."""
        ...

    def call(self, op: str, fields: dict[str, Any], wait_s: float, what: str) -> dict[str, Any]:
        """One request of the helper's (the file ops below are built on it: remote/files.py)."""
        ...

    # remote/files.py's FileOps (supervisor/supervise_files.py answers them)
    def link(self, path: str, target: str, within: str) -> None: ...
    def readlink(self, path: str) -> str | None: ...
    def remove(self, paths: list[str], within: str) -> int: ...
    def disk(self, path: str, files: list[str]) -> DiskFacts: ...
    def mkdir(self, path: str, within: str, need: int) -> NewDir: ...
    def listdir(self, path: str) -> list[str] | None: ...
    def find_bytes(self, path: str, needle: bytes, offset: int = 0) -> int | None: ...
    def kernel_log(self, lines: int = 300) -> str: ...
    def lease_show(self, path: str) -> dict[str, Any]: ...
    def runs(self, path: str) -> dict[str, Any]: ...


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
