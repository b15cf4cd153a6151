"""Checks of the dashboard over real targets in a real Chromium, shared by the browser tests (a stand-in
deployment on the sshd bed) and the real-engine tier (real vLLM): the row, the attempt timeline with its phases,
the log's tail and a line appended to the engine's own log file."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WAIT_S = 30.0


def wait_for(browser: Any, condition: Callable[[Any], Any], message: str, wait_s: float = WAIT_S) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, wait_s, poll_frequency=0.2).until(condition, message)


def text_of(browser: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    found = browser.find_elements(By.CSS_SELECTOR, css)
    return str(found[0].text) if found else ""


def rows_by_name(browser: Any) -> dict[str, tuple[str, list[str]]]:
    """name -> (key, cells) of the overview, read in one script."""
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#overview tbody tr')).map(function (r) {"
        " return [r.dataset.key, Array.from(r.cells).map(function (c) { return c.innerText; })]; });")
    return {cells[0]: (key, cells) for key, cells in rows}


def fresh_tab(browser: Any) -> None:
    """One new tab left (a tab's sessionStorage is its own), on a blank page, with no cookies."""
    old = list(browser.window_handles)
    browser.switch_to.new_window("tab")
    mine = browser.current_window_handle
    for handle in old:
        browser.switch_to.window(handle)
        browser.close()
    browser.switch_to.window(mine)
    browser.get("about:blank")
    browser.execute_cdp_cmd("Network.clearBrowserCookies", {})


def open_dashboard(browser: Any, url: str) -> str:
    """Sign in with the printed URL (the page trades its one-time ticket for the token, kept in the tab's
    sessionStorage, and takes the ticket out of the address); the page's base address."""
    browser.get(url)
    base = url.split("/#", 1)[0]
    wait_for(browser, lambda b: b.current_url == base + "/" and b.execute_script(
        "return window.sessionStorage.getItem('deployer-dashboard-token') !== null"), "the ticket traded")
    return base


def check_row(browser: Any, name: str, status: str, engine: str) -> tuple[str, list[str]]:
    """The overview lists `name` with its state, serving and engine; its key and cells."""
    wait_for(browser, lambda b: name in rows_by_name(b) and rows_by_name(b)[name][1][4] == status,
             f"the row of {name}, {status}")
    key, cells = rows_by_name(browser)[name]
    assert cells[3] == engine and cells[5] == ("yes" if status == "ready" else "no"), cells
    return key, cells


def check_page(browser: Any, base: str, key: str, phases: list[str], log_line: str, log_file: Path) -> None:
    """The deployment page: the current attempt's phases on the timeline, `log_line` in the log's tail, and a
    line appended to `log_file` (the engine log on the target) followed into the page."""
    from selenium.webdriver.common.by import By

    browser.get(f"{base}/deployment?key={key}")
    wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline li.attempt.current"), "the attempt")
    current = browser.find_elements(By.CSS_SELECTOR, "#timeline li.attempt.current")[0]
    shown = [p.text for p in current.find_elements(By.CSS_SELECTOR, ".phase")]
    assert shown == phases, shown
    wait_for(browser, lambda b: log_line in text_of(b, "#log"), f"the log's tail ({log_line})")
    marker = f"appended by the test at {time.time():.3f} <b>not bold</b>"
    with log_file.open("a") as f:
        f.write(marker + "\n")
    wait_for(browser, lambda b: marker in text_of(b, "#log"), "the appended line")
    assert browser.find_elements(By.CSS_SELECTOR, "#log b") == []
