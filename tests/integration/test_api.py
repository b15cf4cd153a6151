"""deployer.api, in process, against the real sshd test bed and the stand-in engine: the README's example calls
(load, deployment, render, status, up, down), typed reports back, and no local SQLite history by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import write_profile
from deployer import api
from deployer.errors import NotFound
from deployer.watch.watcher import Event

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_the_readme_example_against_the_sshd_bed(tmp_path: Path, sshd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DEPLOYER_HOME", str(home))
    path = write_profile(tmp_path, sshd, name="apidemo")

    profile = api.load(path)
    dep = api.deployment(profile)
    assert "exec" in dep.render() and dep.name == "apidemo"
    with pytest.raises(NotFound):   # nothing deployed yet: the error tree, with its exit code
        dep.status()

    seen: list[Event] = []
    up = dep.up(api.UpOptions(skip_preflight=True), seen.append)
    assert isinstance(up, api.UpReport) and up.status == "ready" and up.run_dir
    assert any(e.kind == "ready" for e in seen)
    assert not (home / "history.sqlite3").exists()      # the API keeps no local history unless asked

    report = api.deployment(str(path)).status()         # a profile file resolves to the same deployment
    assert isinstance(report, api.HostStatus) and report.exit_code == 0
    assert report.to_json()["status"] == "ready" and report.to_json()["run_dir"] == up.run_dir

    history = dep.history()
    assert isinstance(history, api.HistoryReport) and history.to_json()[0]["outcome"] == "ready"

    down = dep.down()
    assert isinstance(down, api.HostDown) and down.to_json()["was_running"] is True
    assert dep.status().exit_code == 8                  # stopped, as `deploy status` exits
