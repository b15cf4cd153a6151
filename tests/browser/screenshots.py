"""Screenshots of the dashboard's pages for docs/dashboard.md, from the packaged demo data in headless Chromium:

    .venv/bin/python tests/browser/screenshots.py [OUT_DIR]     (default docs/img)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))   # this checkout's deployer, not an installed one

from conftest import demo_data  # noqa: E402
from dashboard_chrome import chrome, missing  # noqa: E402
from live_checks import open_dashboard  # noqa: E402
from deployer.dashboard import DashboardConfig, StaticSource, running  # noqa: E402

PAGES = {
    "dashboard-overview.png": ("/", "#overview tbody tr"),
    "dashboard-deployment.png": ("/deployment?key=tiny-standin@box-a", "#log .line"),
    "dashboard-rollback.png": ("/deployment?key=qwen3-vllm@gpu-box", "#rollbacks li"),
}


def main(out: Path) -> None:
    why = missing()
    if why is not None:
        sys.exit(why)
    out.mkdir(parents=True, exist_ok=True)
    source = StaticSource.from_json(demo_data())
    driver = chrome(1400, 1000)
    try:
        with running(source, DashboardConfig(refresh_s=1.0, log_poll_s=1.0)) as server:
            open_dashboard(driver, server.url)
            for name, (path, ready) in PAGES.items():
                driver.get(f"http://127.0.0.1:{server.port}{path}")
                for _ in range(100):
                    if driver.execute_script(f"return document.querySelector({ready!r}) !== null"):
                        break
                    time.sleep(0.1)
                height = driver.execute_script("return document.documentElement.scrollHeight")
                driver.set_window_size(1400, max(600, min(int(height) + 40, 2400)))
                time.sleep(0.3)
                driver.save_screenshot(str(out / name))
                print(out / name)
    finally:
        driver.quit()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/img"))
