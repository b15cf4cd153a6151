"""The dashboard's server (deployer/dashboard/server.py) over real sockets: the credential (a one-time ticket traded
for the token, which is accepted only as an `Authorization: Bearer` header: 401 without, 403 wrong; never a cookie,
never the URL), 127.0.0.1 only, the Host check, the CSP and other headers on every answer, read-only, and what
leaves it: escaped, control sequences stripped, secrets masked."""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from importlib.resources import files
from pathlib import Path

import pytest

from deployer.dashboard import (
    DashboardConfig, DashboardServer, DeploymentDetail, OverviewRow, StaticSource, running,
)
from deployer.dashboard.server import CSP
from deployer.secrets import remember

KEY = "tiny@box"
SECRET = "hf_dashboardsecret0123456789"
HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)> & "quotes"'


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


def ask(server: DashboardServer, path: str, *, token: str | None = None, host: str | None = None,
        method: str = "GET", address: str = "127.0.0.1", headers: dict[str, str] | None = None) -> Answer:
    conn = http.client.HTTPConnection(address, server.port, timeout=10)
    headers = {"Host": host or f"127.0.0.1:{server.port}", **(headers or {})}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, headers=headers)
        r = conn.getresponse()
        return Answer(r.status, r.headers, r.read())
    finally:
        conn.close()


def ticket_of(url: str) -> str:
    assert "#ticket=" in url, url
    return url.split("#ticket=", 1)[1]


def signed_in(server: DashboardServer) -> str:
    """The token the page gets for the printed URL's ticket (what it then sends as `Authorization: Bearer`)."""
    r = ask(server, "/api/session", headers={"X-Deployer-Ticket": ticket_of(server.url)})
    assert r.status == 200 and "Set-Cookie" not in r.headers
    token = r.json()
    assert isinstance(token, dict)
    return str(token["token"])


@pytest.fixture()
def source() -> StaticSource:
    remember([SECRET])
    row = OverviewRow(key=KEY, name="tiny", host=f"me@box {SECRET}", status="ready", serving=True, engine="stand-in")
    detail = DeploymentDetail.from_json({"row": row.to_json(), "attempts": [
        {"run_id": "r1", "outcome": "crashed", "detail": f"died \x1b[31mred\x1b[0m {HOSTILE}",
         "diagnosis": {"signature": "cuda-oom", "summary": "OOM", "evidence": [f"token {SECRET}"]},
         "change": {"args": {"mem_fraction_static": 0.8}, "reason": "less"}}]})
    log = (f"line one\n{HOSTILE}\n\x1b]0;title\x07\x1b[1mbold\x1b[0m\x07\x08 end\n"
           f"loading 10%\rloading 100%\nserver_args=ServerArgs(api_key='sk-abcdef123456', port=1)\n"
           f"env HF_TOKEN={SECRET}\n")
    return StaticSource([row], {KEY: detail}, {KEY: log})


@pytest.fixture()
def server(source: StaticSource) -> Iterator[DashboardServer]:
    with running(source, DashboardConfig(min_interval_s=0.0)) as s:
        yield s


DATA = ["/api/overview", f"/api/deployment?key={KEY}", f"/api/log?key={KEY}", "/api/nothing"]
PUBLIC = ["/", "/deployment?key=tiny@box", "/static/app.js", "/static/style.css"]


@pytest.mark.parametrize("path", DATA)
def test_data_without_the_token_header_is_401_and_no_data(server: DashboardServer, path: str) -> None:
    r = ask(server, path)
    assert r.status == 401
    assert r.headers["Content-Type"].startswith("text/plain")
    assert b"tiny" not in r.body and b"box" not in r.body


@pytest.mark.parametrize("path", DATA)
def test_a_wrong_token_is_403_and_no_data(server: DashboardServer, path: str) -> None:
    r = ask(server, path, token="not-it")
    assert r.status == 403 and b"tiny" not in r.body


@pytest.mark.parametrize("path", DATA)
def test_the_token_anywhere_but_the_header_opens_nothing(server: DashboardServer, path: str) -> None:
    """Never a cookie (browsers send cookies to every port of 127.0.0.1), never the URL (history, logs)."""
    token = signed_in(server)
    sep = "&" if "?" in path else "?"
    assert ask(server, f"{path}{sep}token={token}").status == 401
    for cookie in (f"deployer_dashboard_{server.port}={token}", f"token={token}"):
        assert ask(server, path, headers={"Cookie": cookie}).status == 401
    assert ask(server, path, headers={"Authorization": token}).status == 401         # no scheme
    assert ask(server, path, headers={"Authorization": f"Basic {token}"}).status == 401


@pytest.mark.parametrize("path", PUBLIC)
def test_pages_and_static_files_hold_no_data_and_need_no_token(server: DashboardServer, path: str) -> None:
    r = ask(server, path)
    assert r.status == 200 and b"tiny" not in r.body and b"me@box" not in r.body
    assert server.token.encode() not in r.body and "Set-Cookie" not in r.headers


def test_the_printed_url_holds_a_one_time_ticket_not_the_token(server: DashboardServer) -> None:
    first = server.url
    assert first.startswith(f"http://127.0.0.1:{server.port}/#ticket=") and server.token not in first
    said: list[str] = []
    server.announce = said.append
    r = ask(server, "/api/session", headers={"X-Deployer-Ticket": ticket_of(first)})
    assert r.status == 200 and r.json() == {"token": server.token}
    assert r.headers["Cache-Control"] == "no-store" and "Set-Cookie" not in r.headers
    again = ask(server, "/api/session", headers={"X-Deployer-Ticket": ticket_of(first)})  # spent
    assert again.status == 403 and server.token.encode() not in again.body
    assert server.url != first and said == [f"opened in a browser; to open it in another one: {server.url}"]
    assert ask(server, "/api/session").status == 403
    assert ask(server, f"/api/session?ticket={ticket_of(server.url)}").status == 403  # the header only
    assert ask(server, "/api/session", headers={"X-Deployer-Ticket": ticket_of(server.url)}).status == 200
    assert len(server.token) >= 40 and len(ticket_of(server.url)) >= 40


def test_with_the_token_the_pages_and_data_are_served(server: DashboardServer) -> None:
    token = signed_in(server)
    page = ask(server, "/", token=token)
    assert page.status == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'src="/static/app.js"' in page.body
    assert ask(server, "/static/app.js").headers["Content-Type"].startswith("text/javascript")
    data = ask(server, "/api/overview", token=token).json()
    assert isinstance(data, dict) and [r["key"] for r in data["rows"]] == [KEY]
    assert ask(server, "/api/overview", headers={"Authorization": f"bearer  {token}"}).status == 200
    assert ask(server, "/api/deployment?key=nope", token=token).status == 404
    assert ask(server, "/api/deployment?key=../../etc/passwd", token=token).status == 400
    assert ask(server, "/static/../server.py", token=token).status == 404


@pytest.mark.parametrize("path,token,status", [
    ("/api/overview", None, 401), ("/api/overview", "bad", 403), ("/", None, 200), ("/api/overview", "good", 200),
    ("/nothing", "good", 404), ("/favicon.ico", None, 204), ("/api/session", None, 403),
])
def test_every_answer_carries_the_csp_and_the_other_headers(server: DashboardServer, path: str,
                                                            token: str | None, status: int) -> None:
    sent = {"good": signed_in(server), "bad": "bad", None: None}[token]
    r = ask(server, path, token=sent)
    assert r.status == status
    assert r.headers["Content-Security-Policy"] == CSP
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Referrer-Policy"] == "no-referrer"
    assert r.headers["X-Frame-Options"] == "DENY"
    assert r.headers["Cache-Control"] == "no-store"


def test_the_csp_allows_only_self_and_no_inline_code() -> None:
    rules = dict(rule.strip().split(" ", 1) for rule in CSP.split(";"))
    assert rules["default-src"] == "'none'"
    for kind in ("script-src", "style-src", "connect-src", "img-src"):
        assert rules[kind] == "'self'"
    assert "unsafe" not in CSP and "http" not in CSP and "*" not in CSP
    assert rules["frame-ancestors"] == "'none'"


def test_it_is_read_only(server: DashboardServer) -> None:
    token = signed_in(server)
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        assert ask(server, "/api/overview", token=token, method=method).status == 405


def test_another_host_name_is_refused_even_with_the_token(server: DashboardServer) -> None:
    """A page of another site whose name is rebound to 127.0.0.1 (DNS rebinding) gets nothing."""
    token = signed_in(server)
    assert ask(server, "/api/overview", token=token, host=f"evil.example:{server.port}").status == 403
    assert ask(server, "/", host="evil.example").status == 403
    assert ask(server, "/api/session", host="evil.example",
               headers={"X-Deployer-Ticket": ticket_of(server.url)}).status == 403
    assert ask(server, "/api/overview", token=token, host=f"localhost:{server.port}").status == 200


def _listening(port: int) -> list[str]:
    """The local addresses of the IPv4 and IPv6 sockets listening on `port` (from /proc/net/tcp*)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                found.append(address)
    return found


def test_it_listens_only_on_127_0_0_1_by_default(server: DashboardServer) -> None:
    assert DashboardConfig().address == "127.0.0.1"
    assert server.server_address[0] == "127.0.0.1"
    assert _listening(server.port) == ["0100007F"]  # 127.0.0.1, little-endian; not 0.0.0.0, not ::
    with pytest.raises(OSError):  # another loopback address of this machine is not served
        socket.create_connection(("127.0.0.2", server.port), timeout=2).close()


def test_another_address_only_when_named(source: StaticSource) -> None:
    with running(source, DashboardConfig(address="127.0.0.3")) as s:
        assert _listening(s.port) == ["0300007F"]
        assert s.url.startswith(f"http://127.0.0.3:{s.port}/#ticket=")
        r = ask(s, "/api/session", address="127.0.0.3", host=f"127.0.0.3:{s.port}",
                headers={"X-Deployer-Ticket": ticket_of(s.url)})
        assert r.status == 200


def test_nothing_it_sends_holds_markup_control_sequences_or_secrets(server: DashboardServer) -> None:
    token = signed_in(server)
    for path in ("/api/overview", f"/api/deployment?key={KEY}", f"/api/log?key={KEY}"):
        body = ask(server, path, token=token).body
        assert b"<" not in body and b">" not in body and b"&" not in body, path  # \u003c etc.
        text = body.decode()
        assert SECRET not in text and "sk-abcdef123456" not in text, path
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]|\\u001b|\\u0007|\\u0008", text), path
    detail = ask(server, f"/api/deployment?key={KEY}", token=token).json()
    assert isinstance(detail, dict)
    assert detail["row"]["host"] == "me@box ***"
    assert detail["attempts"][0]["detail"] == f"died red {HOSTILE}"  # the text itself, for textContent
    assert detail["attempts"][0]["diagnosis"]["evidence"] == ["token ***"]
    log = ask(server, f"/api/log?key={KEY}", token=token).json()
    assert isinstance(log, dict)
    assert log["lines"] == ["line one", HOSTILE, "bold end", "loading 100%",
                            "server_args=ServerArgs(api_key='***', port=1)", "env HF_TOKEN=***"]


def test_the_log_is_read_on_from_an_offset(server: DashboardServer, source: StaticSource) -> None:
    token = signed_in(server)
    first = ask(server, f"/api/log?key={KEY}", token=token).json()
    assert isinstance(first, dict)
    source.append_log(KEY, "new line\nhalf")
    more = ask(server, f"/api/log?key={KEY}&offset={first['end']}", token=token).json()
    assert isinstance(more, dict)
    assert more["lines"] == ["new line"] and more["start"] == first["end"] and more["end"] == more["size"] - 4


def test_no_access_log_line_carries_the_token(server: DashboardServer, capfd: pytest.CaptureFixture[str]) -> None:
    token = signed_in(server)
    ask(server, "/api/overview", token=token)
    ask(server, "/api/overview", token=token + "x")
    out, err = capfd.readouterr()
    assert token not in out + err


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script":
            self._in_script = True
            if not names.get("src", "").startswith("/static/"):
                self.problems.append(f"script without a /static/ src: {attrs}")
        if tag == "style" or "style" in names:
            self.problems.append(f"inline style: {tag} {attrs}")
        self.problems += [f"inline handler {k} on {tag}" for k in names if k.startswith("on")]
        for value in names.values():
            if value and re.match(r"(https?:)?//", value):
                self.problems.append(f"outside resource: {value}")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append("inline script")


@pytest.mark.parametrize("page", ["index.html", "deployment.html"])
def test_the_pages_have_no_inline_code_and_nothing_from_elsewhere(page: str) -> None:
    parser = _Markup()
    parser.feed(files("deployer.dashboard").joinpath("static").joinpath(page).read_text())
    assert parser.problems == []


def test_the_script_sets_text_never_html() -> None:
    script = files("deployer.dashboard").joinpath("static").joinpath("app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setAttribute(\"style\"", "http://", "https://"):
        if sink == "http://" and "http://www.w3.org/2000/svg" in script:
            script = script.replace("http://www.w3.org/2000/svg", "")
        assert sink not in script, sink


def test_the_demo_command_prints_the_url_first_and_serves_it(tmp_path: Path) -> None:
    """`python -m deployer.dashboard --demo`: the first stdout line is the URL (127.0.0.1, a ticket), it serves."""
    import subprocess
    import sys
    from urllib.parse import urlsplit

    proc = subprocess.Popen([sys.executable, "-m", "deployer.dashboard", "--demo"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = urlsplit(proc.stdout.readline().strip())
        assert (url.scheme, url.hostname, url.path) == ("http", "127.0.0.1", "/")
        assert re.fullmatch(r"ticket=[A-Za-z0-9_-]{40,}", url.fragment) and not url.query
        conn = http.client.HTTPConnection("127.0.0.1", url.port, timeout=10)
        conn.request("GET", "/api/session", headers={"X-Deployer-Ticket": url.fragment[len("ticket="):]})
        token = json.loads(conn.getresponse().read())["token"]
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", url.port, timeout=10)
        conn.request("GET", "/api/overview", headers={"Authorization": f"Bearer {token}"})
        rows = json.loads(conn.getresponse().read())["rows"]
        conn.close()
        assert {r["engine"] for r in rows} >= {"stand-in", "vllm"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
