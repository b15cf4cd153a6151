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

from deploy_helpers import crash_looping_deployment, healed_deployment  # noqa: E402
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


RED = ("rgba(207, 34, 46, 1)", "rgba(255, 235, 233, 1)")   # style.css: --bad on the red badge's background


def colours(element: Any) -> tuple[str, str]:
    return element.value_of_css_property("color"), element.value_of_css_property("background-color")


@pytest.fixture(scope="module")
def crash_looping(tmp_path_factory: pytest.TempPathFactory, sshd: Any) -> Iterator[tuple[Path, Path]]:
    with crash_looping_deployment(tmp_path_factory.mktemp("loop"), sshd, "liveloop") as made:
        yield made


def test_a_crash_looping_deployment_of_a_host_shows_a_red_badge_its_diagnosis_and_engine_version(
        browser: Any, crash_looping: tuple[Path, Path], sshd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every deployment of a host (`deploy dashboard --host H --workdir W`), issue 36: the crash-looping one's row
    and page show what `deploy status` shows: the crash loop in red, the last crash's diagnosis, the engine and
    the version its profile names."""
    from selenium.webdriver.common.by import By

    prof, home = crash_looping
    monkeypatch.setenv("DEPLOYER_HOME", str(home))
    monkeypatch.setenv("DEPLOYER_SSH_CONFIG", str(sshd.ssh_config))
    host, workdir, read = "deployer-test", str(prof.parent / "work"), Mode(read_only=True, remembered=False)
    status = resolve(str(prof), mode=read).status().rows[0]
    diagnosis = status.shown_diagnosis
    assert status.status == "crashloop" and diagnosis is not None and diagnosis.signature, status
    source = LiveSource([watched(resolve(None, host, workdir, mode=read),
                                 named=lambda name: resolve(name, host, workdir, mode=read))])
    with kept_open(), running(source, FAST) as server:
        fresh_tab(browser)
        base = open_dashboard(browser, server.url)
        key, cells = check_row(browser, "liveloop", "crashloop", "sglang")
        assert cells[6] == "0.5.10" and diagnosis.signature in cells[14], cells
        state = browser.find_element(By.CSS_SELECTOR, "#overview tbody tr[data-key='%s'] .state" % key)
        assert colours(state) == RED, state.text
        browser.get(f"{base}/deployment?key={key}")
        wait_for(browser, lambda b: b.find_element(By.ID, "crash-loop").is_displayed(), "the crash-loop badge")
        for badge in (browser.find_element(By.ID, "crash-loop"), browser.find_element(By.ID, "state")):
            assert colours(badge) == RED, badge.text
        assert browser.find_element(By.ID, "crash-loop").text == "crash loop"
        assert browser.find_element(By.ID, "state").text == "crashloop, not serving"
        why = browser.find_element(By.ID, "status-diagnosis")
        assert why.is_displayed() and diagnosis.signature in why.text and diagnosis.summary in why.text, why.text
        shown = {dd.get_attribute("data-field"): dd.text
                 for dd in browser.find_elements(By.CSS_SELECTOR, "#summary dd")}
        assert (shown["engine"], shown["version"], shown["crash-loop"]) == ("sglang", "0.5.10", "yes"), shown
        assert shown["model"] == "Qwen/Qwen3-8B" and shown["restarts"] == "1" and shown["last-crash"], shown
