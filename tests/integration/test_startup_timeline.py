"""The startup timeline end to end (issue 26, item 3): real sshd, real supervisor, the stand-in engine. Four starts
of one profile with `startup_timeout_s: auto`: the first three derive the fallback deadline (no history), the
fourth shows the prediction from the three before (read from the target's records) and a deadline derived from
them; `history` shows each attempt's phases with their durations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_fourth_start_is_predicted_from_the_three_before(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="timeline", extra={"health": {"interval_s": 0.2,
                                                                            "startup_timeout_s": "auto",
                                                                            "stall_timeout_s": 20}})
    try:
        for start in range(1, 4):
            up = deploy("up", str(prof), "--skip-preflight", "--force", home=home)
            assert up.returncode == 0, up.stderr[-3000:]
            assert "startup_timeout_s auto: no 3 earlier starts: the default 30m = 30m" in up.stderr, up.stderr
            assert "predicted" not in up.stderr, (start, up.stderr)
        fourth = deploy("up", str(prof), "--skip-preflight", "--force", "--json", home=home)
        assert fourth.returncode == 0, fourth.stderr[-3000:]
        evs = events(fourth.stdout)
        (predicted,) = [e for e in evs if e["event"] == "prediction"]
        assert predicted["starts"] == 3 and predicted["attempt"] == 1
        assert predicted["summary"].startswith("last 3 starts: ready in ")
        assert "download 0" in predicted["summary"] and "load " in predicted["summary"]
        low, high = predicted["ready"]
        assert 0 < low <= high < 60
        assert predicted["phases"]["download"] == [0.0, 0.0]
        assert predicted["startup_timeout_s"] == 300.0          # 2 x slowest + 2m, at least 5m: the floor
        auto = [e["message"] for e in evs if e["event"] == "info" and "startup_timeout_s auto" in e["message"]]
        assert auto and "2 x the slowest of the last 3 starts" in auto[0], auto
        report = evs[-1]
        (attempt,) = report["attempts"]
        assert attempt["timeline"]["ready_s"] > 0 and attempt["start_key"]["args_hash"]
        outcome = json.loads((Path(report["run_dir"]) / "outcome.json").read_text())
        assert outcome["timeline"] == attempt["timeline"] and outcome["start_key"]["host"].startswith("root@")

        text = deploy("up", str(prof), "--skip-preflight", "--force", home=home)   # the console says it too
        assert text.returncode == 0 and "predicted: last 3 starts: ready in " in text.stderr, text.stderr

        history = deploy("history", str(prof), home=home)
        assert history.returncode == 0, history.stderr
        shown = [line.strip() for line in history.stdout.splitlines() if line.strip().startswith("phases:")]
        assert len(shown) == 5, history.stdout
        assert all("start " in line and "load " in line and "-> ready at " in line for line in shown), shown
        as_json = json.loads(deploy("history", str(prof), "--json", home=home).stdout)
        assert all(row["timeline"]["phases"] for row in as_json if row.get("kind") == "attempt")
    finally:
        deploy("down", str(prof), home=home)
