"""`deploy status` exits like `systemctl is-active`: 0 only while the deployment serves, and a documented code
for each way it does not (README, exit codes). Real sshd, real supervisor, stand-in engine; JSON always printed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, write_profile
from sshbed import SSHD

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def status(sshd: SSHD, tmp_path: Path, *names: str) -> tuple[int, Any]:
    """`deploy status [NAME] --json` as a monitor runs it: from a laptop with only the alias and the name."""
    r = deploy("status", *names, "--json", "--host", "deployer-test", "--workdir", str(tmp_path / "work"),
               home=tmp_path / "monitor", env={"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)})
    assert "Traceback" not in r.stderr
    data = json.loads(r.stdout) if r.stdout.strip() else None
    if isinstance(data, dict) and data.get("event") == "error":  # a failed --json command's last (only) line
        assert data["code"] == r.returncode and r.returncode != 0, data
        return r.returncode, None
    return r.returncode, data


def wait_status(sshd: SSHD, tmp_path: Path, name: str, want: str, deadline_s: float = 45.0) -> tuple[int, Any]:
    """Poll `status NAME` until its row says `want`: at most 60 polls and `deadline_s` (a status under load takes
    seconds: a count alone would outlast the test's timeout)."""
    end = time.monotonic() + deadline_s
    code, row = status(sshd, tmp_path, name)
    for _ in range(60):
        if (row and row["status"] == want) or time.monotonic() > end:
            break
        time.sleep(0.5)
        code, row = status(sshd, tmp_path, name)
    assert row and row["status"] == want, row
    return code, row


def up(tmp_path: Path, sshd: SSHD, name: str, **kw: Any) -> None:
    prof = write_profile(tmp_path, sshd, name=name, **kw)
    r = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert r.returncode == 0, r.stderr


def signal_engine(sshd: SSHD, tmp_path: Path, name: str, sig: str) -> None:
    from contextlib import closing

    from deployer.remote.connect import connect

    code, row = status(sshd, tmp_path, name)
    with closing(connect(sshd.spec())) as remote:
        remote.run(f"kill -{sig} {int(row['pid'])}")


def test_serving_then_hung_then_stopped(tmp_path: Path, sshd: SSHD) -> None:
    up(tmp_path, sshd, "svc")
    code, row = status(sshd, tmp_path, "svc")
    assert (code, row["status"], row["healthy"], row["serving"]) == (0, "ready", True, True)

    signal_engine(sshd, tmp_path, "svc", "STOP")  # a hung engine: the process lives, /health never answers
    try:
        code, row = status(sshd, tmp_path, "svc")
        assert (code, row["status"], row["healthy"], row["serving"]) == (6, "ready", False, False)
    finally:
        signal_engine(sshd, tmp_path, "svc", "CONT")
    assert status(sshd, tmp_path, "svc")[0] == 0  # serving again

    prof = tmp_path / "svc.yaml"
    assert deploy("down", str(prof), home=tmp_path / "h").returncode == 0
    code, row = status(sshd, tmp_path, "svc")
    assert (code, row["status"], row["serving"]) == (8, "stopped", False)


def test_crashed_and_crash_looping_are_5(tmp_path: Path, sshd: SSHD) -> None:
    crash = {"STANDIN_MODE": "crash_after_ready", "STANDIN_CRASH_AFTER_S": "0.5"}
    up(tmp_path, sshd, "dies", env=crash, extra={"restart": {"policy": "no", "grace_s": 2}})
    up(tmp_path, sshd, "loops", env=crash, extra={"restart": {"policy": "on-failure", "max": 1,
                                                              "backoff_s": [0.2, 0.2], "grace_s": 2}})
    up(tmp_path, sshd, "fine")
    code, row = wait_status(sshd, tmp_path, "dies", "exited")
    assert code == 5 and row["last_crash"] and row["serving"] is False
    code, row = wait_status(sshd, tmp_path, "loops", "crashloop")
    assert code == 5 and row["restarts"] == 1

    # every deployment on the host: the worst wins, and the rows are all printed
    code, rows = status(sshd, tmp_path)
    assert code == 5
    assert {r["name"]: r["serving"] for r in rows} == {"dies": False, "loops": False, "fine": True}
    assert deploy("down", str(tmp_path / "fine.yaml"), home=tmp_path / "h").returncode == 0


def test_no_such_deployment_is_7(tmp_path: Path, sshd: SSHD) -> None:
    code, row = status(sshd, tmp_path, "never-deployed")
    assert code == 7 and row is None  # its --json error line is checked by status()
    code, rows = status(sshd, tmp_path)  # nothing at all under the workdir
    assert code == 7 and rows == []


def test_a_crash_the_policy_recovered_from_says_why(tmp_path: Path, sshd: SSHD) -> None:
    """restarts: 1 and serving again: status exits 0 and its last_crash carries the crash's diagnosis (at 3 a.m. the
    count alone does not say whether to worry); a crash-looped one's does too."""
    # Each start serves 4 s, then crashes: a window a status poll hits even when a status takes 2 s under load (with
    # 1 s, a loaded run's polls missed every window until the crash loop: the test's 120 s ran out).
    crash = {"STANDIN_MODE": "crash_after_ready", "STANDIN_CRASH_AFTER_S": "4.0"}
    up(tmp_path, sshd, "comesback", env=crash,
       extra={"restart": {"policy": "on-failure", "max": 3, "backoff_s": [0.2, 0.2], "grace_s": 2}})
    row: Any = None
    end = time.monotonic() + 45
    for _ in range(90):  # bounded in count and time, until the first restart serves
        code, row = status(sshd, tmp_path, "comesback")
        if (row and row["restarts"] >= 1 and row["status"] == "ready" and code == 0) or time.monotonic() > end:
            break
        time.sleep(0.25)
    assert row and row["restarts"] >= 1 and row["last_crash"], row
    why = row["last_crash"].get("diagnosis")
    assert why and why["signature"] not in (None, "unknown"), row["last_crash"]
    code, row = wait_status(sshd, tmp_path, "comesback", "crashloop")
    assert code == 5 and row["last_crash"]["diagnosis"] == row["diagnosis"], row
