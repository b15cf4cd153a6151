"""The dashboard's HTTP server: standard library only (`ThreadingHTTPServer`), read-only, behind a per-run token.

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
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qs, urlsplit

from deployer.dashboard.model import LogRequest
from deployer.dashboard.shown import json_bytes, shown, shown_log_lines
from deployer.dashboard.source import DashboardSource, Throttled, valid_key

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


@dataclass(frozen=True)
class DashboardConfig:
    """Where to listen and how often the page refreshes (the page reads `refresh_s` and `log_poll_s` from
    /api/overview); `min_interval_s`: the floor under how often the source is asked."""

    address: str = LOOPBACK
    port: int = 0
    refresh_s: float = 5.0
    log_poll_s: float = 1.0
    min_interval_s: float = 2.0


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class DashboardServer(ThreadingHTTPServer):
    """One dashboard: its source (throttled), its token, its config."""

    daemon_threads = True

    def __init__(self, source: DashboardSource, config: DashboardConfig = DashboardConfig()) -> None:
        self.source = Throttled(source, config.min_interval_s)
        self.config = config
        self.token = secrets.token_urlsafe(32)
        self.announce: Callable[[str], None] | None = None   # told the next URL once a ticket is spent
        self._ticket = secrets.token_urlsafe(32)
        self._ticket_lock = threading.Lock()
        if ":" in config.address:
            self.address_family = socket.AF_INET6
        super().__init__((config.address, config.port), DashboardHandler)

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
        """A page closed mid-answer is no error worth a traceback; anything else is reported as usual."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())


class DashboardHandler(BaseHTTPRequestHandler):
    """One request: host check, token check, then a page, a static file or JSON."""

    server: DashboardServer
    server_version = "deployer-dashboard"

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
        query = parse_qs(url.query)
        if not self.server.allowed_host(self.headers.get("Host")):
            self._plain(HTTPStatus.FORBIDDEN, "wrong host")
        elif self._public(url.path):
            return
        elif url.path == "/api/session":
            self._session()
        elif (refusal := self._token_refusal()) is not None:
            self._plain(*refusal)
        else:
            self._route(url.path, query)

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

    def _route(self, path: str, query: dict[str, list[str]]) -> None:
        api: dict[str, Callable[[dict[str, list[str]]], Any]] = {
            "/api/overview": self._overview, "/api/deployment": self._detail, "/api/log": self._log}
        if path in api:
            value = api[path](query)
            if value is None:
                self._plain(HTTPStatus.NOT_FOUND, "no such deployment")
            else:
                self._send(HTTPStatus.OK, json_bytes(value), "application/json; charset=utf-8")
        else:
            self._plain(HTTPStatus.NOT_FOUND, "not found")

    def _overview(self, query: dict[str, list[str]]) -> Any:
        config = self.server.config
        rows = [row.to_json() for row in self.server.source.overview()]
        return {"rows": shown(rows), "refresh_s": config.refresh_s, "log_poll_s": config.log_poll_s}

    def _detail(self, query: dict[str, list[str]]) -> Any:
        key = _key(query)
        detail = self.server.source.detail(key) if key else None
        if detail is None:
            return None
        config = self.server.config
        return {**shown(detail.to_json()), "refresh_s": config.refresh_s, "log_poll_s": config.log_poll_s}

    def _log(self, query: dict[str, list[str]]) -> Any:
        key = _key(query)
        offset, max_bytes = _int(query, "offset"), _int(query, "max_bytes")
        request = LogRequest(offset=offset, **({"max_bytes": max_bytes} if max_bytes else {}))
        chunk = self.server.source.log(key, request) if key else None
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


def _key(query: dict[str, list[str]]) -> str | None:
    key = (query.get("key") or [""])[0]
    return key if valid_key(key) else None


def _int(query: dict[str, list[str]], name: str) -> int | None:
    raw = (query.get(name) or [""])[0]
    return int(raw) if raw.isdigit() else None


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
