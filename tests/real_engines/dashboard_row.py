"""The dashboard's real-engine row (issue 27): `deploy dashboard PROFILE` (the command, in its own process) over a
real engine's deployment, looked at in a real headless Chromium with the browser tests' checks
(tests/browser/live_checks.py). Without chromium the check is skipped, saying so, except under CI=true."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))

from dashboard_chrome import chrome, missing  # noqa: E402
from deploy_helpers import REPO  # noqa: E402
from live_checks import check_page, check_row, open_dashboard  # noqa: E402


def assert_dashboard_shows(prof: Path, home: Path, name: str, engine: str, phases: list[str], log_line: str,
                           run_dir: Path) -> None:
    why = missing()
    if why is not None:
        assert os.environ.get("CI") != "true", why
        warnings.warn(f"the dashboard's real-engine row is not checked: {why}")
        return
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEPLOYER_HOME": str(home),
           "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "dashboard", str(prof), "--refresh", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    browser = chrome()
    try:
        assert proc.stdout is not None
        base = open_dashboard(browser, proc.stdout.readline().strip())
        key, _ = check_row(browser, name, "ready", engine)
        check_page(browser, base, key, phases, log_line, run_dir / "engine.log")
    finally:
        browser.quit()
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        finally:
            proc.kill()
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
