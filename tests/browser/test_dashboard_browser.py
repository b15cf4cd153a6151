"""The dashboard in a real headless Chromium (issue 27): the overview's deployments and their states, a healed
attempt on the timeline, the log view following new lines, a hostile log line shown as text, no token -> refused,
a second tab let in by the first, listening only on 127.0.0.1. The data is the packaged demo (StaticSource); a real source is the integrator's."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

from deployer.dashboard import DashboardServer, StaticSource
from live_checks import fresh_tab, open_dashboard

STANDIN, REAL = "tiny-standin@box-a", "qwen3-vllm@gpu-box"
WAIT_S = 15.0


def wait_for(browser: Any, condition: Callable[[Any], Any], message: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(condition, message)


def fresh(browser: Any) -> None:
    """A new tab alone (its sessionStorage empty), no cookies, and the console log read empty."""
    fresh_tab(browser)
    browser.get_log("browser")


def sign_in(browser: Any, server: DashboardServer, path: str = "/") -> None:
    """Open the printed URL (its ticket traded for the token the tab keeps), then `path`; the console log of
    earlier pages dropped."""
    fresh(browser)
    open_dashboard(browser, server.url)
    if path != "/":
        browser.get(f"http://127.0.0.1:{server.port}{path}")


def text_of(browser: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def console_errors(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e.get("level") == "SEVERE"]


def overview_rows(browser: Any) -> dict[str, list[str]]:
    """Each row's cells, read in one script (a refresh between two reads cannot mix two versions)."""
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#overview tbody tr')).map(function (r) {"
        " return [r.dataset.key, Array.from(r.cells).map(function (c) { return c.innerText; })]; });")
    return {key: cells for key, cells in rows}


def test_overview_shows_a_stand_in_and_a_real_engine_deployment_with_their_states(
        browser: Any, dashboard: DashboardServer) -> None:
    sign_in(browser, dashboard)
    wait_for(browser, lambda b: len(overview_rows(b)) == 4, "the overview's four rows")
    rows = overview_rows(browser)
    standin, real = rows[STANDIN], rows[REAL]
    assert standin[:7] == ["tiny-standin", "deployment", "deploy@box-a", "stand-in", "ready", "yes", "0.5.23"]
    assert standin[7:] == ["tiny-standin", "1h 30m", "0", "1834", "412.7", "37.5", "812", ""]
    assert real[:7] == ["qwen3-vllm", "deployment", "root@gpu-box", "vllm", "crashed", "no", "0.33.0"]
    assert real[7:10] == ["Qwen/Qwen3-8B", "", "3"] and real[10:14] == ["", "", "", ""]  # absent metrics: blank
    assert real[14] == "cuda-illegal-memory-access: a GPU kernel fault (illegal memory access)"   # the last failure
    assert rows["chat-fleet-r0@gpu-1"][1] == "replica r0" and rows["big-nodes-n1@gpu-7"][1] == "node 1"
    assert console_errors(browser) == []  # no CSP violation, no failed request


def test_the_timeline_shows_the_healed_attempt_and_what_the_heal_changed(
        browser: Any, dashboard: DashboardServer) -> None:
    from selenium.webdriver.common.by import By

    sign_in(browser, dashboard, f"/deployment?key={STANDIN}")
    wait_for(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, "#timeline li.attempt")) == 2, "two attempts")
    first, second = browser.find_elements(By.CSS_SELECTOR, "#timeline li.attempt")
    assert "healed" in first.get_attribute("class").split()
    assert "outcome-crashed" in first.get_attribute("class").split()
    assert "cuda-oom-cuda-graph" in first.text and "healed:" in first.text
    assert "mem_fraction_static = 0.81 (from engine resolved 0.871)" in first.text
    assert "cuda_graph_max_bs = null (removed)" in first.text
    phases = [p.text for p in first.find_elements(By.CSS_SELECTOR, ".phase")]
    assert phases == ["start", "load_weights", "kv_cache", "cuda_graph"]
    assert "outcome-ready" in second.get_attribute("class").split() and "current" in second.text
    assert text_of(browser, "#state") == "ready, serving"
    gpus = browser.find_elements(By.CSS_SELECTOR, "#memory figure.gpu")
    assert len(gpus) == 2 and len(gpus[0].find_elements(By.CSS_SELECTOR, "svg rect")) == 6  # 5 parts + headroom
    assert "Mamba state 6.0 GiB" in gpus[0].text and "headroom" in gpus[0].text
    drift = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#drift tbody tr")]
    assert drift == ["context_length 65536 32768 changed", "enable_foo true (not reported) unknown"]
    assert console_errors(browser) == []


def test_the_rollback_of_the_real_engine_deployment_is_on_its_page(
        browser: Any, dashboard: DashboardServer) -> None:
    sign_in(browser, dashboard, f"/deployment?key={REAL}")
    wait_for(browser, lambda b: "rolled back" in text_of(b, "#rollbacks"), "the rollback")
    assert "rolled back to 20261201T180000-1 (ready)" in text_of(browser, "#rollbacks")
    assert text_of(browser, "#state") == "crashed, not serving"
    from selenium.webdriver.common.by import By

    (folded,) = browser.find_elements(By.CSS_SELECTOR, "#timeline details.traceback")
    assert "run_busy_loop" not in folded.text  # folded until asked for
    folded.find_element(By.TAG_NAME, "summary").click()
    wait_for(browser, lambda b: "engine_core.run_busy_loop()" in text_of(b, "#timeline details.traceback"),
             "the unfolded traceback")


def test_the_log_view_follows_new_lines_and_searches(browser: Any, dashboard: DashboardServer,
                                                     source: StaticSource) -> None:
    from selenium.webdriver.common.by import By

    sign_in(browser, dashboard, f"/deployment?key={STANDIN}")
    wait_for(browser, lambda b: "ready to roll" in text_of(b, "#log"), "the log's tail")
    source.append_log(STANDIN, "[2026-12-01 22:13:00] Decode batch. #running-req: 3, gen throughput (token/s): 388.1\n")
    wait_for(browser, lambda b: "gen throughput (token/s): 388.1" in text_of(b, "#log"), "the appended line")
    source.append_log(STANDIN, "a partial li")
    source.append_log(STANDIN, "ne, finished later\n")
    wait_for(browser, lambda b: "a partial line, finished later" in text_of(b, "#log"), "the line finished later")
    assert "a partial li\n" not in text_of(browser, "#log") + "\n"
    search = browser.find_element(By.ID, "search")
    search.send_keys("throughput")
    wait_for(browser, lambda b: text_of(b, "#log-count") == "1 of 9 lines match", "the search")
    assert text_of(browser, "#log").startswith("[2026-12-01 22:13:00] Decode batch.")


def test_a_hostile_log_line_is_shown_as_text_and_runs_nothing(browser: Any, dashboard: DashboardServer,
                                                              source: StaticSource) -> None:
    from selenium.webdriver.common.by import By

    hostile = ('<script>window.pwned = 1</script><img src=x onerror="document.title=\'pwned\'">'
               '\x1b]8;;http://evil.example\x07click\x1b]8;;\x07 \x1b[31mred\x1b[0m')
    source.append_log(STANDIN, hostile + "\n")
    sign_in(browser, dashboard, f"/deployment?key={STANDIN}")
    wait_for(browser, lambda b: "window.pwned" in text_of(b, "#log"), "the hostile line")
    lines = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#log .line")]
    assert lines[-1] == '<script>window.pwned = 1</script><img src=x onerror="document.title=\'pwned\'">click red'
    assert lines[-2] == "[2026-12-01 22:12:02] request prompt=\"<script>alert('hostile')</script>\" finished"
    assert browser.find_elements(By.CSS_SELECTOR, "#log script, #log img, #log a") == []
    assert browser.execute_script("return window.pwned === undefined") is True
    assert browser.title != "pwned"
    assert "api_key='***'" in lines[0]  # the engine's secret flag masked as the CLI masks it
    assert console_errors(browser) == []


def test_without_the_token_the_browser_is_refused(browser: Any, dashboard: DashboardServer) -> None:
    fresh(browser)
    for path in ("/api/overview", f"/api/log?key={STANDIN}"):
        browser.get(f"http://127.0.0.1:{dashboard.port}{path}")
        assert text_of(browser, "body").startswith("401 Unauthorized"), path
    for path in ("/", f"/deployment?key={STANDIN}", "/#ticket=not-the-ticket"):
        fresh(browser)
        browser.get(f"http://127.0.0.1:{dashboard.port}{path}")
        wait_for(browser, lambda b: "refused (401)" in text_of(b, "#error"), f"the refusal on {path}")
        assert "tiny-standin" not in browser.page_source
    assert browser.get_cookies() == []


def test_a_second_tab_is_let_in_by_the_first_and_a_spent_address_by_none(
        browser: Any, dashboard: DashboardServer) -> None:
    sign_in(browser, dashboard)
    spent = browser.execute_cdp_cmd("Page.getNavigationHistory", {})["entries"][-1]["userTypedURL"]
    assert "#ticket=" in spent and dashboard.token not in spent
    wait_for(browser, lambda b: len(overview_rows(b)) == 4, "the overview's rows")
    browser.switch_to.new_window("tab")      # no opener, its own sessionStorage: the first tab hands it the token
    browser.get(f"http://127.0.0.1:{dashboard.port}/deployment?key={STANDIN}")
    wait_for(browser, lambda b: "ready to roll" in text_of(b, "#log"), "the second tab's log")
    fresh(browser)                           # a tab alone: none of the dashboard is left to hand the token on
    browser.get(spent)                       # the address the history kept: its ticket is spent
    wait_for(browser, lambda b: "refused (401)" in text_of(b, "#error"), "the spent address refused")
    assert browser.current_url == f"http://127.0.0.1:{dashboard.port}/"


def _other_addresses() -> list[str]:
    """Addresses of this machine other than 127.0.0.1: 127.0.0.2 (loopback, but not what the server bound) and
    the address of the default route when there is one."""
    found = ["127.0.0.2"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the kernel only picks a route
            found.append(probe.getsockname()[0])
        except OSError:
            pass
    return [a for a in found if a != "127.0.0.1"]


@pytest.mark.parametrize("address", _other_addresses())
def test_the_server_listens_only_on_127_0_0_1(browser: Any, dashboard: DashboardServer, address: str) -> None:
    assert dashboard.server_address[0] == "127.0.0.1"
    from selenium.common.exceptions import WebDriverException

    fresh(browser)
    with pytest.raises(WebDriverException, match="ERR_CONNECTION_REFUSED"):
        browser.get(f"http://{address}:{dashboard.port}/")
    assert browser.get_cookies() == []
    with pytest.raises(OSError):
        socket.create_connection((address, dashboard.port), timeout=2).close()
