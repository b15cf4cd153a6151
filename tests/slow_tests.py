"""A pytest plugin of this suite: tests slower than SLOW_S (env, 30 s by default) either say why they are slow
(`@pytest.mark.slow("why")`: they wait out a real timeout, a drain, an install) or are listed at the end of the run
as slow without a reason, to be made faster. Loaded by tests/conftest.py; `make test` passes SLOW_S."""

from __future__ import annotations

import os

import pytest
from _pytest.terminal import TerminalReporter


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow(why): slower than SLOW_S by design; why says what it waits for")


def _limit() -> float:
    try:
        return float(os.environ.get("SLOW_S", "30"))
    except ValueError:
        return 30.0


def slow_without_reason(reports: list[pytest.TestReport], limit: float) -> list[tuple[float, str]]:
    """(seconds, test id) of the tests whose call took over `limit` and that carry no `slow` mark, slowest first."""
    found = [(r.duration, r.nodeid) for r in reports
             if r.when == "call" and r.duration > limit and "slow" not in r.keywords]
    return sorted(found, reverse=True)


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    reports = [r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, [])
               if isinstance(r, pytest.TestReport)]
    found = slow_without_reason(reports, _limit())
    if found:
        terminalreporter.section(f"slower than {_limit():g} s without a reason (make them faster, or mark slow(why))")
        for seconds, nodeid in found:
            terminalreporter.write_line(f"{seconds:7.1f}s {nodeid}")
