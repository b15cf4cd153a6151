"""`http_exchange`: one HTTP/1.1 request and its response over a socket-like object that is already connected (a
socket, a paramiko direct-tcpip channel): the transports' own `request` (remote/local.py, remote/ssh/connection.py).

Its own module, imported by those `request`s where they run: http.client (with the email and ssl modules it
imports, ~12 ms) is not on the way to a connection, and a command that asks for HTTP through the target's helper
(deployer.remote.conversation: every command's) never imports it for this.
"""

from __future__ import annotations

import http.client
from typing import Any

from deployer.remote.base import EndpointUnreachable, HttpReply


class _PresetHTTPConnection(http.client.HTTPConnection):
    """http.client over an already-open socket-like object (a socket or a paramiko channel)."""

    def __init__(self, sock: Any, port: int, timeout: float, address: str = "127.0.0.1") -> None:
        super().__init__(address, port, timeout=timeout)
        self.sock = sock

    def connect(self) -> None:  # the socket is already connected
        pass

    def close(self) -> None:
        # http.client closes the socket as soon as it sees "Connection: close", before the body is read;
        # a closed paramiko channel drops what it buffered. http_exchange closes the socket when done.
        self.sock = None
        super().close()


def http_exchange(
    sock: Any,
    method: str,
    port: int,
    path: str,
    body: bytes | None,
    headers: dict[str, str] | None,
    timeout: float,
    label: str,
    errors: tuple[type[BaseException], ...] = (),
    address: str = "127.0.0.1",
) -> HttpReply:
    """One HTTP/1.1 request/response over `sock`; any failure -> EndpointUnreachable. Closes `sock`."""
    conn = _PresetHTTPConnection(sock, port, timeout, address)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return HttpReply(resp.status, data, {k.lower(): v for k, v in resp.getheaders()})
    except Exception as e:
        if not isinstance(e, (OSError, EOFError, http.client.HTTPException, *errors)):
            raise
        why = "timed out" if isinstance(e, TimeoutError) else f"failed: {type(e).__name__}: {e}"
        raise EndpointUnreachable(f"HTTP {method} {address}:{port}{path} {why}", host=label) from None
    finally:
        conn.close()
        sock.close()
