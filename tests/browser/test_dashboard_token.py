"""The dashboard's credential in a real headless Chromium (issue 35): once the printed URL is opened, no request to a
server on another port of 127.0.0.1 carries the token (no cookie, no header, no URL; that page's script finds it in
no storage it can read), and the browser's history (its History database, after the browser has quit) holds no
token, nor does any other file of the browser's profile: the URL it keeps carries a one-time ticket, spent. The sign-in here waits for the page's data, not for any
one mechanism, so the tests judge whichever way the dashboard lets the browser in."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from conftest import FAST
from dashboard_chrome import chrome, missing
from deployer.dashboard import DashboardServer, StaticSource, running
from live_checks import fresh_tab, rows_by_name, wait_for

SNOOP = """<!doctype html><title>another port</title><script>
(async function () {
  const seen = {cookie: document.cookie, local: JSON.stringify(Object.assign({}, window.localStorage)),
                session: JSON.stringify(Object.assign({}, window.sessionStorage))};
  try {
    const r = await fetch("http://127.0.0.1:DASHBOARD/api/overview", {credentials: "include"});
    seen.overview = r.status + " " + (await r.text()).slice(0, 200);
  } catch (e) { seen.overview = "refused: " + e; }
  await fetch("/report?seen=" + encodeURIComponent(JSON.stringify(seen)));
  document.title = "reported";
})();
</script>"""


class SnoopServer(ThreadingHTTPServer):
    """Stand-in for a page any local user serves on another port: records every request the browser makes to it
    (request line and headers) and what its script could read."""

    daemon_threads = True

    def __init__(self, dashboard_port: int) -> None:
        super().__init__(("127.0.0.1", 0), SnoopHandler)
        self.page = SNOOP.replace("DASHBOARD", str(dashboard_port)).encode()
        self.requests: list[str] = []
        self.reports: list[dict[str, str]] = []


class SnoopHandler(BaseHTTPRequestHandler):
    server: SnoopServer

    def do_GET(self) -> None:  # noqa: N802
        self.server.requests.append(f"{self.requestline}\n{self.headers}")
        url = urlsplit(self.path)
        if url.path == "/report":
            self.server.reports.append(json.loads(parse_qs(url.query)["seen"][0]))
        body = self.server.page if url.path == "/" else b""
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture()
def dashboard_and_snoop(source: StaticSource) -> Iterator[tuple[DashboardServer, SnoopServer]]:
    with running(source, FAST) as dashboard:
        snoop = SnoopServer(dashboard.port)
        thread = threading.Thread(target=snoop.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        thread.start()
        try:
            yield dashboard, snoop
        finally:
            snoop.shutdown()
            snoop.server_close()
            thread.join(timeout=5)


def open_and_wait_for_data(browser: Any, dashboard: DashboardServer) -> None:
    """Open the printed URL as a person would and wait until the overview shows its rows."""
    browser.get(dashboard.url)
    wait_for(browser, lambda b: len(rows_by_name(b)) == 4, "the overview's rows")


def visit_snoop(browser: Any, snoop: SnoopServer) -> dict[str, str]:
    """The other port's page, in the dashboard's tab and in a new one; what its script could read (the last)."""
    for new_tab in (False, True):
        if new_tab:
            browser.switch_to.new_window("tab")
        browser.get(f"http://127.0.0.1:{snoop.server_address[1]}/")
        wait_for(browser, lambda b: b.title == "reported", "the other port's report")
    return snoop.reports[-1]


def test_no_request_to_another_port_carries_the_token(browser: Any,
                                                      dashboard_and_snoop: tuple[DashboardServer, SnoopServer]) -> None:
    dashboard, snoop = dashboard_and_snoop
    fresh_tab(browser)
    open_and_wait_for_data(browser, dashboard)
    seen = visit_snoop(browser, snoop)
    assert snoop.requests and len(snoop.reports) == 2
    for request in snoop.requests:
        assert dashboard.token not in request, request
        assert "cookie:" not in request.lower(), request
        assert "authorization:" not in request.lower(), request
    assert dashboard.token not in json.dumps(snoop.reports)
    assert seen["cookie"] == "" and seen["local"] == "{}" and seen["session"] == "{}", seen
    assert not seen["overview"].startswith("200"), seen     # its script cannot read the dashboard's data either


def test_the_browsers_history_keeps_no_token(tmp_path: Path, source: StaticSource) -> None:
    why = missing()
    if why is not None:
        pytest.skip(why)
    profile = tmp_path / "chromium-profile"
    browser = chrome(user_data_dir=str(profile))
    try:
        with running(source, FAST) as dashboard:
            printed = dashboard.url
            open_and_wait_for_data(browser, dashboard)
            assert dashboard.token not in browser.current_url
            kept = browser.execute_cdp_cmd("Page.getNavigationHistory", {})["entries"]
            assert all(dashboard.token not in json.dumps(e) for e in kept), kept
            browser.get("about:blank")
            token = dashboard.token
    finally:
        browser.quit()                                 # the history database is written out as the browser quits
    db = sqlite3.connect(f"file:{profile / 'Default' / 'History'}?mode=ro", uri=True)
    try:
        urls = [row[0] for row in db.execute("SELECT url FROM urls")]
    finally:
        db.close()
    assert any(u.startswith(printed.split("#")[0]) for u in urls), urls   # the history was written
    assert not [u for u in urls if token in u], urls
    for name in ("History", "History-journal"):
        path = profile / "Default" / name
        assert not path.exists() or token.encode() not in path.read_bytes(), name
    holding = [p for p in profile.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert holding == [], holding          # nor anywhere else the browser keeps on disk (cookies, storage, cache)
