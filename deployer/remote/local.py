"""`LocalRemote`: the Remote protocol on this machine, for `host: local` (deployer running on the GPU box).

Same behaviour as SSHRemote: commands run under `bash -c`, uploads are atomic and verified, HTTP goes to
127.0.0.1. A timed-out command is killed with its whole process group.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import selectors
import signal
import socket
import subprocess
from collections.abc import Sequence

from deployer.errors import CommandFailed, NotFound, RemoteError, TransferFailed
from deployer.host import LOCAL
from deployer.remote.base import CommandTimedOut, EndpointUnreachable, Hasher, Helper, HttpReply, LineReader
from deployer.remote.base import Result
from deployer.remote.conversation import BareHelper


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class LocalSession(LineReader):
    """A local process with an open stdin; output (stdout+stderr) read line by line."""

    def __init__(self, cmd: str) -> None:
        super().__init__(LOCAL)
        self._proc = subprocess.Popen(
            ["bash", "-c", cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def _recv(self, wait: float) -> bytes | None:
        out = self._proc.stdout
        if out is None or self._closed:
            return b""
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            if not sel.select(wait):
                return None
        return os.read(out.fileno(), 65536)

    def send(self, data: bytes) -> None:
        stdin = self._proc.stdin
        if self._closed or stdin is None:
            raise RemoteError("session closed", host=LOCAL)
        try:
            stdin.write(data)
            stdin.flush()
        except OSError as e:
            raise RemoteError(f"session lost: {e}", host=LOCAL) from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for stream in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        # Give a command that ends on EOF a moment to do so, so it gets reaped; like ssh, we never kill it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=2.0)


class LocalRemote:
    """The Remote protocol on the local machine."""

    label = LOCAL

    @property
    def helper(self) -> Helper:
        """A bare connection's helper requests: one program each (the Conversation's are its helper's)."""
        return BareHelper(self)

    def run(
        self, cmd: str, *, timeout: float = 60.0, check: bool = True, stdin: bytes | None = None
    ) -> Result:
        proc = subprocess.Popen(
            ["bash", "-c", cmd],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # so a timeout can kill everything the command started
        )
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=2.0)
            except subprocess.TimeoutExpired:  # a daemon outside the group still holds the pipes
                proc.kill()
                out, err = b"", b""
            raise CommandTimedOut(Result(cmd, -1, _text(out), _text(err)), timeout, host=LOCAL) from None
        result = Result(cmd, proc.returncode, _text(out), _text(err))
        if check and not result.ok:
            raise CommandFailed(result, host=LOCAL)
        return result

    def put(self, data: bytes, path: str, mode: int = 0o644) -> str:
        return self.put_all([(data, path, mode)])[0]

    def put_all(self, files: Sequence[tuple[bytes, str, int]], hasher: Hasher | None = None) -> list[str]:
        """Every file to a temp name beside it (fsync, hash: here, so `hasher` is not needed), then each renamed
        into place."""
        digests: list[str] = []
        temps: list[str] = []
        path = files[0][1] if files else ""
        try:
            for data, path, mode in files:
                temps.append(_write_temp(data, path, mode))
                digest, got = hashlib.sha256(data).hexdigest(), _sha256_file(temps[-1])
                if got != digest:
                    raise TransferFailed(f"put {path}: sha256 mismatch (sent {digest}, wrote {got})", host=LOCAL)
                digests.append(digest)
            for (_, path, _), tmp in zip(files, list(temps)):
                os.replace(tmp, path)
                temps.remove(tmp)
        except OSError as e:
            raise TransferFailed(f"put {path}: {e.strerror or e}", host=LOCAL) from None
        finally:
            for tmp in temps:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return digests

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            raise NotFound(f"local: {path}: no such file") from None
        except OSError as e:
            raise TransferFailed(f"read {path}: {e.strerror or e}", host=LOCAL) from None

    def size(self, path: str) -> int | None:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return None
        except OSError as e:
            raise TransferFailed(f"stat {path}: {e.strerror or e}", host=LOCAL) from None

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
        try:
            sock = socket.create_connection((address, port), timeout=timeout)
        except OSError as e:
            why = "nothing listening" if e.errno == errno.ECONNREFUSED else str(e)
            raise EndpointUnreachable(f"{address}:{port}: {why}", host=LOCAL) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        from deployer.remote.http import http_exchange  # only here (deployer/remote/http.py says why)

        return http_exchange(sock, method, port, path, body, headers, timeout, LOCAL, address=address)

    def spawn(self, cmd: str) -> LocalSession:
        try:
            return LocalSession(cmd)
        except OSError as e:
            raise RemoteError(f"cannot start {cmd!r}: {e}", host=LOCAL) from None

    def close(self) -> None:
        pass


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_temp(data: bytes, path: str, mode: int) -> str:
    d, base = os.path.split(path)
    import tempfile  # only for a local put: not on the way to a connection (deploy status)

    fd, tmp = tempfile.mkstemp(dir=d or ".", prefix=f".{base}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp
