"""Browser tests of the dashboard: a real headless Chromium (tests/browser/dashboard_chrome.py) against a real
dashboard server over a StaticSource. Skipped, saying why, without chromium; a failure under CI=true."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

import pytest

from dashboard_chrome import chrome, missing
from deployer.dashboard import DashboardConfig, DashboardServer, StaticSource, running

DEMO = files("deployer.dashboard").joinpath("demo")
FAST = DashboardConfig(refresh_s=0.5, log_poll_s=0.5, min_interval_s=0.2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)


def demo_data() -> dict[str, Any]:
    """The packaged demo (a stand-in deployment, a real-vLLM-shaped one, a fleet replica, a node) as dicts."""
    deployments = DEMO.joinpath("deployments")
    logs = DEMO.joinpath("logs")
    return {
        "overview": json.loads(DEMO.joinpath("overview.json").read_text()),
        "deployments": {p.name[:-len(".json")]: json.loads(p.read_text()) for p in deployments.iterdir()
                        if p.name.endswith(".json")},
        "logs": {p.name[:-len(".log")]: p.read_text() for p in logs.iterdir() if p.name.endswith(".log")},
    }


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    why = missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    driver = chrome()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture()
def source() -> StaticSource:
    return StaticSource.from_json(demo_data())


@pytest.fixture()
def dashboard(source: StaticSource) -> Iterator[DashboardServer]:
    with running(source, FAST) as server:
        yield server
