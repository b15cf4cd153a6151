"""`SSHRemote`: the Remote protocol over one paramiko connection per host, reused for every call.

The socket is ours (TCP_NODELAY, keepalive, TCP_USER_TIMEOUT: see /work/shared/ssh-notes.md), host keys
are checked against known_hosts (never AutoAdd), transient connect errors are retried a bounded number of
times, auth and host-key errors never. Commands run on raw exec channels of the connection's transport so
that timeouts are exact and no helper threads are involved; HTTP goes over direct-tcpip channels.
Every paramiko/socket error is translated into deployer.errors here. paramiko (~80 ms to import) is imported
where it is used, so commands that never dial (`host: local`, --help) do not pay for it. Fabric is not used: what
this module needs is below its Connection (our own socket options, raw exec channels with exact timeouts,
direct-tcpip channels, RejectPolicy), which only wraps paramiko's SSHClient; its import cost is not the reason
(fabric 3.2.3 on paramiko 5.1: +4 ms, measured 2026-12-01; README "Dependencies").
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deployer.errors import AuthFailed, CommandFailed, ConnectFailed, NotFound, RemoteError, TransferFailed
from deployer.remote.base import (
    CommandTimedOut,
    EndpointUnreachable,
    Hasher,
    Helper,
    HttpReply,
    Result,
)
from deployer.host import TargetSpec
from deployer.remote.conversation import BareHelper
from deployer.remote.ssh.channel import SSHSession, collect, send_stdin, text
from deployer.remote.ssh.config import (
    check_identity,
    encrypted_key_error,
    Resolved,
    host_key_policy,
    known_hosts_name,
    mismatch_error,
    resolve,
    split_hop,
)

if TYPE_CHECKING:
    import paramiko

CONNECT_TRIES = 3
MIN_TRY_S = 0.2  # a retry late in the budget still gets this long for its handshake
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
KEEPALIVE_S = 5
CHANNEL_TIMEOUT_S = 5.0
SFTP_TIMEOUT_S = 30.0  # a hung host (TCP alive, sshd frozen) answers nothing: only this notices it
PUT_MIN_TIMEOUT_S = 60.0
PUT_BYTES_PER_S = 10 << 20  # allow 10 MB/s before an upload counts as hung


class _Link:
    """One SSH connection: the client, and its SFTP session once one was opened (reused, as for every call)."""

    def __init__(self, client: paramiko.SSHClient, sock: Any) -> None:
        self.client = client
        self.sock = sock
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def transport(self) -> paramiko.Transport | None:
        return self.client.get_transport()

    @property
    def is_connected(self) -> bool:
        transport = self.transport
        return transport is not None and transport.is_active()

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
        return self._sftp

    def close(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
        with contextlib.suppress(Exception):
            self.client.close()
        with contextlib.suppress(Exception):
            self.sock.close()


class SSHRemote:
    """The Remote protocol over SSH. `open()` connects; calls reconnect once if the link dropped."""

    def __init__(self, spec: TargetSpec, *, proxy_jump: str | None = None) -> None:
        self.spec = spec
        self.resolved: Resolved = resolve(spec, proxy_jump)
        self.label = self.resolved.label
        self.handshakes = 0  # SSH connections made so far (one per open/reconnect)
        self._conn: _Link | None = None
        self._jump: SSHRemote | None = None
        self._encrypted: list[str] = []  # identity files that need a passphrase (so: the agent)
        self._lock = threading.Lock()
        # paramiko's SFTPClient is not safe for concurrent calls (two threads read each other's replies off its one
        # channel, and fabric creates it lazily, unlocked): every SFTP operation holds this, one at a time.
        self._sftp_lock = threading.RLock()

    @property
    def helper(self) -> Helper:
        """A bare connection's helper requests: one program each (the Conversation's are its helper's)."""
        return BareHelper(self)

    def __enter__(self) -> SSHRemote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connection -------------------------------------------------------------------------------

    def open(self) -> None:
        """Connect now (bounded retries for transient errors); no-op if already connected."""
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return
            self._drop()
            self._conn = self._connect_with_retries()
            self.handshakes += 1

    def _connect_with_retries(self) -> _Link:
        """Transient errors are retried, all tries within one connect_timeout: the timeout bounds the whole
        handshake (a silent sshd used to take 2x, a second try after the first one's banner timeout)."""
        from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay
        from tenacity import wait_exponential

        budget = self.spec.connect_timeout
        deadline = time.monotonic() + budget
        retrying = Retrying(
            stop=stop_after_attempt(CONNECT_TRIES) | stop_after_delay(budget * 0.9),
            wait=wait_exponential(multiplier=0.2, max=1.0),
            retry=retry_if_exception_type(ConnectFailed),
            reraise=True,
        )
        return retrying(lambda: self._connect_once(deadline))

    def _connect_once(self, deadline: float) -> _Link:
        import paramiko

        # paramiko logs channel/transport failures itself; we report them as errors, so keep it quiet.
        logging.getLogger("paramiko").addHandler(logging.NullHandler())
        r = self.resolved
        self._encrypted = [path for path in r.identity_files if check_identity(path, self.label)]
        sock = self._dial()
        timeout = max(MIN_TRY_S, deadline - time.monotonic())  # banner, auth: what is left of the one budget
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(host_key_policy(r.known_hosts, self.spec.trust_new_host, self.label))
        link = _Link(client, sock)
        try:
            self._load_known_hosts(client)
            client.connect(r.hostname, port=r.port, username=r.user, sock=sock, timeout=timeout,
                           banner_timeout=timeout, auth_timeout=timeout, channel_timeout=CHANNEL_TIMEOUT_S,
                           key_filename=list(r.identity_files),  # type: ignore[arg-type]  # str or list (its docs)
                           look_for_keys=not r.identity_files,
                           allow_agent=True)
        except Exception as e:
            link.close()
            raise self._translate_connect_error(e) from None
        assert link.transport is not None
        link.transport.set_keepalive(KEEPALIVE_S)
        return link

    def _load_known_hosts(self, client: paramiko.SSHClient) -> None:
        """The user's file (the one trust-new-host appends to) and, read-only, the system-wide one."""
        path = self.resolved.known_hosts
        try:
            if os.path.exists(SYSTEM_KNOWN_HOSTS):
                client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
            if os.path.exists(path):
                client.load_host_keys(path)
        except OSError as e:
            raise RemoteError(f"cannot read known_hosts: {e}", host=self.label) from None

    def _dial(self) -> Any:
        """A connected socket-like object: TCP with our options, a channel through the ProxyJump hop, or the
        ProxyCommand's stdin/stdout."""
        r = self.resolved
        if r.proxy_jump:
            return self._dial_via_jump(r.proxy_jump)
        if r.proxy_command:
            return self._dial_via_command(r.proxy_command)
        try:
            sock = socket.create_connection((r.hostname, r.port), timeout=self.spec.connect_timeout)
        except OSError as e:
            raise ConnectFailed(f"cannot reach {r.hostname}:{r.port}: {e.strerror or e}", host=self.label) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # a dead link fails fast instead of hanging for minutes
            ms = int(max(3.0, self.spec.connect_timeout) * 1000)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, ms)
        return sock

    def _dial_via_command(self, command: str) -> Any:
        """paramiko's ProxyCommand runs `command` under /bin/sh-like splitting; we run it under sh -c, as ssh
        does, so pipes and quoting in the config work."""
        import paramiko

        try:
            return paramiko.ProxyCommand(f"/bin/sh -c {shlex.quote('exec ' + command)}")
        except (paramiko.SSHException, OSError) as e:
            raise ConnectFailed(f"ProxyCommand {command!r} did not start: {e}", host=self.label) from None

    def _dial_via_jump(self, hops: str) -> Any:
        import paramiko

        *before, last = [h.strip() for h in hops.split(",")]
        user, host, port = split_hop(last)
        if self._jump is None:
            hop_spec = TargetSpec(
                host=host,
                user=user,
                port=port,
                known_hosts=self.spec.known_hosts,
                ssh_config=self.spec.ssh_config,
                trust_new_host=self.spec.trust_new_host,
                connect_timeout=self.spec.connect_timeout,
            )
            self._jump = SSHRemote(hop_spec, proxy_jump=",".join(before) if before else None)
        self._jump.open()
        r = self.resolved
        try:
            return self._jump._transport().open_channel(
                "direct-tcpip", (r.hostname, r.port), ("127.0.0.1", 0), timeout=self.spec.connect_timeout
            )
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise ConnectFailed(f"cannot reach {r.hostname}:{r.port} via {last}: {e}", host=self.label) from None

    def _translate_connect_error(self, e: Exception) -> Exception:
        import paramiko

        if isinstance(e, RemoteError):
            return e
        if isinstance(e, paramiko.BadHostKeyException):
            name = known_hosts_name(self.resolved.hostname, self.resolved.port)
            return mismatch_error(e, self.resolved.known_hosts, name, self.label)
        auth_failed = isinstance(e, paramiko.AuthenticationException) or "No authentication methods" in str(e)
        if auth_failed and self._encrypted:
            return encrypted_key_error(self._encrypted, self.resolved.user, self.label)
        if auth_failed:
            keys = ", ".join(self.resolved.identity_files) or "default keys/agent"
            missing = "".join(f"; ssh config's IdentityFile {path} does not exist"
                              for path in self.resolved.missing_identities)
            return AuthFailed(f"authentication as {self.resolved.user} failed (tried {keys}{missing}): {e}",
                              host=self.label)
        if isinstance(e, (paramiko.SSHException, EOFError, OSError)):
            why = str(e) or type(e).__name__
            if "banner" in why.lower() or "No existing session" in why:  # TCP connected, sshd said nothing
                why = f"no SSH answer within {self.spec.connect_timeout:g}s (sshd hung or overloaded)"
            if self.resolved.proxy_command:
                return ConnectFailed(f"SSH handshake through ProxyCommand {self.resolved.proxy_command!r} failed: "
                                     f"{e or type(e).__name__} (the command's own errors are above)", host=self.label)
            return ConnectFailed(f"SSH handshake failed: {why}", host=self.label)
        return e

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def _transport(self) -> paramiko.Transport:
        if self._conn is None or not self._conn.is_connected:
            self.open()
        assert self._conn is not None and self._conn.transport is not None
        transport: paramiko.Transport = self._conn.transport
        return transport

    def _with_reconnect(self, op: Any) -> Any:
        """op(transport); if the link turned out dead, reconnect once and retry. Only for side-effect-free
        steps (opening a channel), never for a command that may have started."""
        import paramiko

        transport = self._transport()
        try:
            return op(transport)
        except (paramiko.SSHException, EOFError, OSError) as e:
            if isinstance(e, paramiko.ChannelException):
                raise
            with self._lock:  # another thread (the lock's heartbeat) may have reconnected already: keep that one
                if self._conn is not None and self._conn.transport is transport:
                    self._drop()
            try:
                return op(self._transport())
            except (paramiko.SSHException, EOFError, OSError) as e2:
                if isinstance(e2, paramiko.ChannelException):
                    raise
                raise ConnectFailed(f"connection lost: {e2 or type(e2).__name__}", host=self.label) from None

    def _session_channel(self) -> paramiko.Channel:
        return self._with_reconnect(lambda t: t.open_session(timeout=CHANNEL_TIMEOUT_S))  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            self._drop()
            if self._jump is not None:
                self._jump.close()
                self._jump = None

    # -- commands -------------------------------------------------------------------------------------

    def run(
        self, cmd: str, *, timeout: float = 60.0, check: bool = True, stdin: bytes | None = None
    ) -> Result:
        deadline = time.monotonic() + timeout
        # sshd makes each command a session leader; the tag lets a timeout find and kill that session.
        tag = f"deployer-run-{uuid.uuid4().hex[:16]}"
        chan = self._session_channel()
        try:
            chan.exec_command(f": {tag}; {cmd}")
            send_stdin(chan, stdin, deadline)
            out, err = bytearray(), bytearray()
            finished = collect(chan, out, err, deadline)
            if not finished and not chan.closed:
                chan.close()
                self._kill_tagged(tag)
                raise CommandTimedOut(Result(cmd, -1, text(out), text(err)), timeout, host=self.label)
            if not finished:
                raise ConnectFailed(f"connection lost while running {cmd!r}", host=self.label)
            result = Result(cmd, chan.recv_exit_status(), text(out), text(err))
        except RemoteError:
            raise
        except Exception as e:  # paramiko/socket trouble mid-command
            raise ConnectFailed(f"running {cmd!r} failed: {e or type(e).__name__}", host=self.label) from None
        finally:
            chan.close()
        if check and not result.ok:
            raise CommandFailed(result, host=self.label)
        return result

    def _kill_tagged(self, tag: str) -> None:
        """SIGKILL the session of a timed-out command (daemons it setsid'ed away survive, as they should).

        The pattern's [n] keeps pgrep from matching the shell that runs this very line. Best effort."""
        pattern = tag.replace("-run-", "-ru[n]-", 1)
        with contextlib.suppress(RemoteError):
            self.run(f'sid=$(pgrep -o -f -- {pattern}) && pkill -KILL -s "$sid"', timeout=5, check=False)

    def spawn(self, cmd: str) -> SSHSession:
        chan = self._session_channel()
        try:
            chan.exec_command(f"exec 2>&1\n{cmd}")  # merged by the remote shell, so lines keep their order
        except Exception as e:
            chan.close()
            raise RemoteError(f"cannot start {cmd!r}: {e}", host=self.label) from None
        return SSHSession(chan, self.label)

    # -- files ----------------------------------------------------------------------------------------

    def put(self, data: bytes, path: str, mode: int = 0o644) -> str:
        """SFTP to a 0600 temp name beside `path`, fsync + sha256 on the target, chmod, posix-rename."""
        return self.put_all([(data, path, mode)])[0]

    def put_all(self, files: Sequence[tuple[bytes, str, int]], hasher: Hasher | None = None) -> list[str]:
        """Every file to a 0600 temp name over the one SFTP session (pipelined), then one exec that fsyncs and
        hashes them all (or `hasher`: a helper conversation's request, no exec channel of its own), then chmod +
        posix-rename each: one login shell for the lot, not one per file."""
        digests = [hashlib.sha256(data).hexdigest() for data, _, _ in files]
        timeout = max(PUT_MIN_TIMEOUT_S, sum(len(data) for data, _, _ in files) / PUT_BYTES_PER_S)
        temps = [_temp_name(path) for _, path, _ in files]
        with self._sftp_lock:
            return self._put_all(files, temps, digests, timeout, hasher)

    def _put_all(self, files: Sequence[tuple[bytes, str, int]], temps: list[str], digests: list[str],
                 timeout: float, hasher: Hasher | None) -> list[str]:
        sftp = self._sftp()
        written: list[str] = []
        where = files[0][1] if files else ""
        try:
            for (data, where, _), tmp in zip(files, temps):
                with sftp.open(tmp, "wx") as f:
                    written.append(tmp)
                    sftp.chmod(tmp, 0o600)  # before any byte lands: secrets are never readable by others
                    f.set_pipelined(True)
                    f.write(data)
            self._verify(temps, digests, timeout, hasher)
            for (_, where, mode), tmp in zip(files, temps):
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, where)
                written.remove(tmp)
        except (OSError, EOFError) as e:
            self._discard(sftp, written)
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise TransferFailed(f"cannot write {where}: {why}", host=self.label) from None
        except TransferFailed:
            self._discard(sftp, written)
            raise
        return digests

    @staticmethod
    def _discard(sftp: paramiko.SFTPClient, temps: list[str]) -> None:
        for tmp in temps:
            with contextlib.suppress(Exception):
                sftp.remove(tmp)

    def _verify(self, temps: list[str], digests: list[str], timeout: float, hasher: Hasher | None) -> None:
        if hasher is not None:
            hashed = hasher(temps, timeout)
            got = [h or "nothing (unreadable)" for h in hashed]
        else:
            got = self._sha256sum(temps, timeout)
        for i, (tmp, digest) in enumerate(zip(temps, digests)):
            seen = got[i] if i < len(got) else "nothing"
            if seen != digest:
                raise TransferFailed(f"sha256 mismatch after upload of {tmp}: got {seen}", host=self.label)

    def _sha256sum(self, temps: list[str], timeout: float) -> list[str]:
        """fsync + hashes in one exec; a failed command gives an entry per file saying so."""
        q = " ".join(shlex.quote(tmp) for tmp in temps)
        try:
            r = self.run(f"sync -- {q} 2>/dev/null || sync; sha256sum -- {q}", timeout=timeout, check=False)
        except CommandTimedOut:
            raise TransferFailed(f"verify {temps[0]}: timed out after {timeout:g}s", host=self.label) from None
        if not r.ok:
            return [f"nothing (exit {r.exit_code})"] * len(temps)
        return [line.split()[0] for line in r.stdout.splitlines() if line.split()]

    def _sftp(self) -> paramiko.SFTPClient:
        def op(_: paramiko.Transport) -> paramiko.SFTPClient:
            assert self._conn is not None
            sftp: paramiko.SFTPClient = self._conn.sftp()
            channel = sftp.get_channel()
            if channel is not None:
                channel.settimeout(SFTP_TIMEOUT_S)
            return sftp

        return self._with_reconnect(op)  # type: ignore[no-any-return]

    def _no_answer(self, what: str) -> ConnectFailed:
        """An SFTP call timed out: the session is in an unknown state, so the next call reconnects."""
        with self._lock:
            self._drop()
        return ConnectFailed(f"{what}: no answer within {SFTP_TIMEOUT_S:g}s (host hung or link dead)",
                             host=self.label)

    def read(self, path: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        with self._sftp_lock:
            return self._read(path, offset, limit)

    def _read(self, path: str, offset: int, limit: int) -> bytes:
        sftp = self._sftp()
        try:
            with sftp.open(path, "rb") as f:
                size = f.stat().st_size or 0
                n = min(limit, size - offset)
                if n <= 0:
                    return b""
                f.seek(offset)
                f.prefetch(offset + n)
                return bytes(f.read(n))
        except socket.timeout:
            raise self._no_answer(f"read {path}") from None
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise NotFound(f"{self.label}: {path}: no such file") from None
            raise TransferFailed(f"read {path}: {e}", host=self.label) from None
        except Exception as e:
            raise TransferFailed(f"read {path}: {e or type(e).__name__}", host=self.label) from None

    def size(self, path: str) -> int | None:
        with self._sftp_lock:
            return self._size(path)

    def _size(self, path: str) -> int | None:
        sftp = self._sftp()
        try:
            return sftp.stat(path).st_size
        except socket.timeout:
            raise self._no_answer(f"stat {path}") from None
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            raise TransferFailed(f"stat {path}: {e}", host=self.label) from None
        except Exception as e:
            raise TransferFailed(f"stat {path}: {e or type(e).__name__}", host=self.label) from None

    # -- HTTP -----------------------------------------------------------------------------------------

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
        import paramiko

        def op(t: paramiko.Transport) -> paramiko.Channel:
            return t.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout)

        try:
            chan = self._with_reconnect(op)
        except paramiko.ChannelException as e:
            if e.code != paramiko.common.OPEN_FAILED_CONNECT_FAILED:
                raise RemoteError(
                    f"sshd refused to forward to {address}:{port} ({e.text})",
                    host=self.label,
                    hint="health checks need AllowTcpForwarding yes (or local) in the target's sshd_config",
                ) from None
            raise EndpointUnreachable(f"{address}:{port}: nothing listening ({e.text})", host=self.label) from None
        chan.settimeout(timeout)
        from deployer.remote.http import http_exchange  # only here (deployer/remote/http.py says why)

        return http_exchange(chan, method, port, path, body, headers, timeout, self.label, (paramiko.SSHException,),
                             address)


def _temp_name(path: str) -> str:
    folder, base = os.path.split(path)
    return os.path.join(folder or ".", f".{base}.{uuid.uuid4().hex[:12]}.part")
