"""Debian's chromium, headless, driven by Selenium through Debian's chromedriver (the same release, so the two
always agree; nothing is downloaded: `playwright install` and Selenium Manager cannot reach the network here).

`missing()` says why the browser tests cannot run (None when they can); `chrome()` starts one browser.
DEPLOYER_CHROMIUM / DEPLOYER_CHROMEDRIVER name other executables.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

CHROMIUM = os.environ.get("DEPLOYER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DEPLOYER_CHROMEDRIVER", "/usr/bin/chromedriver")
INSTALL = "apt-get install -y chromium chromium-driver  (or: make test-browser as root)"


def missing() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.access(path, os.X_OK) or shutil.which(path)):
            return f"{path} not found (Debian package {package}): {INSTALL}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


def chrome(width: int = 1400, height: int = 1000, user_data_dir: str | None = None) -> Any:
    """A headless Chromium whose console log (CSP violations included) can be read back; its profile (history
    and all) in `user_data_dir` when given, else a temporary one of chromedriver's."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-extensions", "--no-first-run", "--disable-background-networking",
                f"--window-size={width},{height}", *([f"--user-data-dir={user_data_dir}"] if user_data_dir else [])):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
