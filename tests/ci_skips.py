"""A pytest plugin of this suite: under CI=true every skipped test is reported as failed.

CI installs everything every tier needs (sshd, network namespaces, chromium, the real engines' venvs), so a skip
there means a missing install step or a test that hides, never "not applicable here". Tests written for another
release are deselected instead (tests/sglang_real/sglang_release.py), and a tier that selects no test fails on its
own (pytest's exit 5). Loaded by tests/conftest.py; tests/unit/test_suite_isolation.py runs it on a probe file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every skip is a failure: {reason}"
