"""`deploy dashboard`'s live source in a real headless Chromium: a stand-in deployment on the real sshd bed, healed
once (SGLang 0.5.10's Mamba + MTP failure), read through the Deployment interface over one kept connection.
The real-engine row is checked by the real-engine tier (tests/real_engines/test_vllm_lifecycle.py) with the same
checks (live_checks.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from live_checks import check_page, check_row, fresh_tab, open_dashboard, wait_for
from conftest import FAST

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from deploy_helpers import healed_deployment  # noqa: E402
from deployer.dashboard import running  # noqa: E402
from deployer.dashboard.live import LiveSource, watched  # noqa: E402
from deployer.deployments.resolve import Mode, resolve  # noqa: E402
from deployer.remote.connect import kept_open  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def healed(tmp_path_factory: pytest.TempPathFactory, sshd: Any) -> Iterator[tuple[Path, Path]]:
    with healed_deployment(tmp_path_factory.mktemp("live"), sshd, "livedemo") as made:
        yield made


def test_a_live_stand_in_deployment_its_healed_attempt_and_its_log(
        browser: Any, healed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from selenium.webdriver.common.by import By

    prof, home = healed
    monkeypatch.setenv("DEPLOYER_HOME", str(home))
    deployment = resolve(str(prof), mode=Mode(read_only=True, remembered=False))
    run_dir = Path(deployment.status().to_json()["run_dir"])
    with kept_open(), running(LiveSource([watched(deployment)]), FAST) as server:
        fresh_tab(browser)
        base = open_dashboard(browser, server.url)
        key, cells = check_row(browser, "livedemo", "ready", "sglang")
        assert cells[1] == "deployment" and cells[2] == f"root@127.0.0.1:{deployment.known_profile().target.port}"
        check_page(browser, base, key, ["args", "loading weights", "weights loaded", "allocating cache",
                                        "capturing cuda graphs", "http up", "ready"],
                   "The server is fired up and ready to roll!", run_dir / "engine.log")
        first = browser.find_elements(By.CSS_SELECTOR, "#timeline li.attempt")[0]
        assert "healed" in first.get_attribute("class").split()
        assert "mamba-spec-needs-extra-buffer" in first.text
        assert "mamba_scheduler_strategy = extra_buffer" in first.text
        assert "SGLANG_ENABLE_SPEC_V2" in first.text
        wait_for(browser, lambda b: "ready, serving" in b.find_element(By.ID, "state").text, "the state line")
