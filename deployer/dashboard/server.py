"""The dashboard's HTTP server: standard library only (`http.server`), read-only, behind a per-run token.

- Bound to 127.0.0.1 unless the caller names another address (`DashboardConfig.address`); the port is the
  caller's or a free one.
- The credential never rides in a cookie (browsers send cookies to every port of 127.0.0.1) nor stays in a URL:
  the printed URL (`http://127.0.0.1:PORT/#ticket=...`) carries a one-time ticket in its fragment (never sent
  over the wire); the page trades it once (`GET /api/session`, header `X-Deployer-Ticket`) for the run's token
  (`secrets.token_urlsafe`), keeps that in sessionStorage (this origin, this tab) and sends it on every data
  request as `Authorization: Bearer <token>`. A spent ticket opens nothing, so the URL the browser's history
  keeps is worthless; the next ticket is announced (`announce`: `deploy dashboard` prints it) for another
  browser. Data without the header: 401, with a wrong token: 403, no data either way. The pages and static
  files hold no data and are served to anyone on the right Host.
- While bound to a loopback address, a request whose Host header names another host is refused (403): a page
  of another site that rebinds its name to 127.0.0.1 gets nothing, the pages included.
- Every response carries a strict Content-Security-Policy (self only, no inline script or style), nosniff,
  no-referrer, no framing and no caching.
- Pages: `/` (overview), `/deployment?key=K`; data: `/api/overview`, `/api/deployment?key=K`,
  `/api/log?key=K[&offset=N][&max_bytes=N]`. JSON only from the source's typed values, through `shown`.
- Limits: every query parameter checked (dashboard/query.py: a one-line 400); one log read at most 256 KiB and a
  page's attempts at most `MAX_ATTEMPTS`, whatever is asked; connections bounded in number and idle time, answered
  by a fixed number of threads (dashboard/doorway.py); a source that does not answer in time is a one-line 504
  (`NoAnswer`); http.server's own refusals and anything unexpected are one plain line too, never a traceback.
"""

from __future__ import annotations

import hmac
import io
import ipaddress
import math
import secrets
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib.resources import files
from typing import Any
from urllib.parse import urlsplit

from deployer.dashboard.doorway import Doorway
from deployer.dashboard.query import BadQuery, key_of, log_request, params
from deployer.dashboard.shown import json_bytes, shown, shown_log_lines, shown_text
from deployer.dashboard.source import DashboardSource, NoAnswer, Throttled

LOOPBACK = "127.0.0.1"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
}
PAGES = {"/": "index.html", "/deployment": "deployment.html"}
STATIC = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
TICKET_HEADER = "X-Deployer-Ticket"
MAX_ATTEMPTS = 100                 # the newest attempts a deployment page shows


@dataclass(frozen=True)
class DashboardConfig:
    """Where to listen and how often the page refreshes (the page reads `refresh_s` and `log_poll_s` from
    /api/overview); `min_interval_s`: the floor under how often the source is asked. The connections: at most
    `max_connections` open, each closed when its request has not arrived `idle_timeout_s` after it opened, answered
    by `workers` threads, each answer's sending bounded by `send_timeout_s`."""

    address: str = LOOPBACK
    port: int = 0
    refresh_s: float = 5.0
    log_poll_s: float = 1.0
    min_interval_s: float = 2.0
    workers: int = 8
    max_connections: int = 256
    idle_timeout_s: float = 10.0
    send_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("refresh_s", "log_poll_s", "idle_timeout_s", "send_timeout_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds above 0, not {value}")
        if self.workers < 1 or self.max_connections < self.workers:
            raise ValueError("workers must be at least 1 and max_connections at least workers")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class DashboardServer(HTTPServer):
    """One dashboard: its source (throttled), its token, its config, its connections (a `Doorway`)."""

    request_queue_size = 128

    def __init__(self, source: DashboardSource, config: DashboardConfig = DashboardConfig()) -> None:
        self.source = Throttled(source, config.min_interval_s)
        self.config = config
        self.token = secrets.token_urlsafe(32)
        self.announce: Callable[[str], None] | None = None   # told the next URL once a ticket is spent
        self._ticket = secrets.token_urlsafe(32)
        self._ticket_lock = threading.Lock()
        if ":" in config.address:
            self.address_family = socket.AF_INET6
        self.doorway: Doorway | None = None
        super().__init__((config.address, config.port), DashboardHandler)  # OSError: cannot listen there
        self.doorway = Doorway(self._answer, _refuse, workers=config.workers,
                               max_connections=config.max_connections, idle_timeout_s=config.idle_timeout_s)

    def process_request(self, request: Any, client_address: Any) -> None:
        """An accepted connection waits in the doorway for its request (no thread of its own meanwhile)."""
        assert self.doorway is not None  # made in __init__ before serving
        self.doorway.admit(request, client_address)

    def server_close(self) -> None:
        super().server_close()
        if self.doorway is not None:
            self.doorway.stop()

    def _answer(self, sock: socket.socket, address: tuple[str, int], head: bytes) -> None:
        """One request whose head has arrived (a worker thread)."""
        try:
            sock.setblocking(True)
            sock.settimeout(self.config.send_timeout_s)
            DashboardHandler(_Arrived(sock, head), address, self)  # type: ignore[arg-type]
        except OSError:
            pass  # the page went away, or stopped reading: nothing to tell anyone
        except Exception as exc:  # noqa: BLE001 (a bug: one line, never a traceback; the connection is closed)
            sys.stderr.write(f"dashboard: could not answer a request: {type(exc).__name__}: {exc}"[:300] + "\n")

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def base_url(self) -> str:
        host = str(self.server_address[0])
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def url(self) -> str:
        """The address to open, with the one-time ticket that lets one browser tab in."""
        with self._ticket_lock:
            return f"{self.base_url}/#ticket={self._ticket}"

    def exchange(self, ticket: str | None) -> str | None:
        """The run's token for the unspent ticket (which is then spent, and the next one announced), else None."""
        with self._ticket_lock:
            if ticket is None or not hmac.compare_digest(ticket.encode(), self._ticket.encode()):
                return None
            self._ticket = secrets.token_urlsafe(32)
            url = f"{self.base_url}/#ticket={self._ticket}"
        if self.announce is not None:
            self.announce(f"opened in a browser; to open it in another one: {url}")
        return self.token

    def allowed_host(self, header: str | None) -> bool:
        """A Host header this server answers: any while bound to a chosen non-loopback address, else only
        its own loopback names (DNS rebinding)."""
        if not _is_loopback(str(self.server_address[0])):
            return True
        names = {f"{n}:{self.port}" for n in (LOOPBACK, "localhost", "[::1]", str(self.server_address[0]))}
        return (header or "").lower() in names

    def handle_error(self, request: Any, client_address: Any) -> None:
        """An error while accepting: one line, never a traceback."""
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError):
            sys.stderr.write(f"dashboard: {type(error).__name__}: {error}"[:300] + "\n")

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())


@dataclass(frozen=True)
class _Arrived:
    """A connection and its request's head, read by the doorway."""

    sock: socket.socket
    head: bytes


class _SendAll:
    """The handler's `wfile`: every write sent whole (within the socket's timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.closed = False

    def write(self, data: bytes) -> int:
        self._sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _refuse(sock: socket.socket, status: int, text: str) -> None:
    """A one-line answer straight from the doorway (too many connections, too long a head), then closed."""
    phrase = HTTPStatus(status).phrase
    body = f"{status} {phrase}: {text}\n".encode()
    head = [f"HTTP/1.0 {status} {phrase}", "Content-Type: text/plain; charset=utf-8", "Connection: close",
            *(f"{k}: {v}" for k, v in SECURITY_HEADERS.items()), f"Content-Length: {len(body)}"]
    try:
        sock.settimeout(1.0)
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    except OSError:
        pass


class DashboardHandler(BaseHTTPRequestHandler):
    """One request: host check, token check, then a page, a static file or JSON."""

    server: DashboardServer
    request: _Arrived  # type: ignore[assignment]
    server_version = "deployer-dashboard"

    def setup(self) -> None:
        """The request's head as read by the doorway (a GET has no body); answers sent whole."""
        self.connection = self.request.sock
        self.rfile = io.BytesIO(self.request.head)  # type: ignore[assignment]
        self.wfile = _SendAll(self.request.sock)  # type: ignore[assignment]

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._answer()

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self._plain(HTTPStatus.METHOD_NOT_ALLOWED, "read-only")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST  # OPTIONS: a cross-origin preflight is refused too

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a bad request line, too long a header, an unknown method): one plain line
        with the usual headers, not its HTML page."""
        self.close_connection = True
        status = HTTPStatus(code)
        self._plain(status, message or status.description)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """No access log: a request line may hold the token."""

    def _answer(self) -> None:
        url = urlsplit(self.path)
        if not self.server.allowed_host(self.headers.get("Host")):
            self._plain(HTTPStatus.FORBIDDEN, "wrong host")
        elif self._public(url.path):
            return
        elif url.path == "/api/session":
            self._session()
        elif (refusal := self._token_refusal()) is not None:
            self._plain(*refusal)
        else:
            self._data(url.path, url.query)

    def _public(self, path: str) -> bool:
        """Answer a page, a static file or the icon (no data in any), when `path` is one."""
        if path in PAGES:
            self._resource(PAGES[path], "text/html; charset=utf-8")
        elif path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        elif path.startswith("/static/") and path[len("/static/"):] in STATIC:
            name = path[len("/static/"):]
            self._resource(name, STATIC[name])
        else:
            return False
        return True

    def _session(self) -> None:
        """The token, for the one-time ticket of the printed URL (sent as a header, never in the address)."""
        token = self.server.exchange(self.headers.get(TICKET_HEADER))
        if token is None:
            self._plain(HTTPStatus.FORBIDDEN, "this address was used already: open the newest one the dashboard "
                                              "printed")
        else:
            self._send(HTTPStatus.OK, json_bytes({"token": token}), "application/json; charset=utf-8")

    def _token_refusal(self) -> tuple[HTTPStatus, str] | None:
        """Why the request's `Authorization: Bearer` header does not let it in (401: none, 403: wrong), or None."""
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return HTTPStatus.UNAUTHORIZED, "open the URL the dashboard printed (it lets the page in)"
        if not self.server.token_ok(given.strip()):
            return HTTPStatus.FORBIDDEN, "wrong token"
        return None

    def _data(self, path: str, query: str) -> None:
        """A data route's JSON: 404 for no such route or row, 400 for a bad query, 504 for no answer in time."""
        routes: dict[str, tuple[Callable[[dict[str, str]], Any], tuple[str, ...]]] = {
            "/api/overview": (self._overview, ()), "/api/deployment": (self._detail, ("key",)),
            "/api/log": (self._log, ("key", "offset", "max_bytes"))}
        if path not in routes:
            self._plain(HTTPStatus.NOT_FOUND, "not found")
            return
        answer, allowed = routes[path]
        try:
            value = answer(params(query, allowed))
        except BadQuery as exc:
            self._plain(HTTPStatus.BAD_REQUEST, str(exc))
            return
        except NoAnswer as exc:
            self._plain(HTTPStatus.GATEWAY_TIMEOUT, shown_text(str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 (a source's bug: one line each side, never a traceback)
            line = shown_text(f"{type(exc).__name__}: {exc}")[:300]
            sys.stderr.write(f"dashboard: {path}: {line}\n")
            self._plain(HTTPStatus.INTERNAL_SERVER_ERROR, line)
            return
        if value is None:
            self._plain(HTTPStatus.NOT_FOUND, "no such deployment")
        else:
            self._send(HTTPStatus.OK, json_bytes(value), "application/json; charset=utf-8")

    def _overview(self, query: dict[str, str]) -> Any:
        config = self.server.config
        rows = [row.to_json() for row in self.server.source.overview()]
        return {"rows": shown(rows), "refresh_s": config.refresh_s, "log_poll_s": config.log_poll_s}

    def _detail(self, query: dict[str, str]) -> Any:
        detail = self.server.source.detail(key_of(query))
        if detail is None:
            return None
        config = self.server.config
        data = detail.to_json()
        data["attempts"] = data["attempts"][-MAX_ATTEMPTS:]   # oldest first: the newest kept
        return {**shown(data), "refresh_s": config.refresh_s, "log_poll_s": config.log_poll_s}

    def _log(self, query: dict[str, str]) -> Any:
        key, request = key_of(query), log_request(query)
        chunk = self.server.source.log(key, request)
        if chunk is None:
            return None
        return {**shown(chunk.to_json()), "lines": shown_log_lines(chunk.lines)}

    def _resource(self, name: str, content_type: str) -> None:
        body = files("deployer.dashboard").joinpath("static").joinpath(name).read_bytes()
        self._send(HTTPStatus.OK, body, content_type)

    def _plain(self, status: HTTPStatus, text: str) -> None:
        self._send(status, f"{status.value} {status.phrase}: {text}\n".encode(), "text/plain; charset=utf-8")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self._finish_headers(len(body))
        if self.command != "HEAD":
            self.wfile.write(body)

    def _finish_headers(self, length: int) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()


def serve_until_interrupted(server: DashboardServer, say: Callable[[str], None]) -> None:
    """The foreground way: the URL (its ticket included) said first, then serving until Ctrl-C; each later ticket
    said when the one before is spent."""
    say(server.url)
    server.announce = say
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@contextmanager
def running(source: DashboardSource, config: DashboardConfig = DashboardConfig()) -> Iterator[DashboardServer]:
    """A dashboard serving from a background thread until the block ends."""
    server = DashboardServer(source, config)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="dashboard",
                              daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
