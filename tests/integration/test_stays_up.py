"""Issue 22 end to end over SSH (findings 6, 8, 9b): the default restart policy brings back a crash after ready
and `up` says so; a version that crash-looped after ready is recorded as such, never gone back to, and `down`
silences it; `up` leaves a boot-time start in the user's crontab whose command brings the deployment back after
a reboot, and `down` removes it."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile
from test_oncall import oncall

pytestmark = pytest.mark.integration

FAST = {"backoff_s": [0.2, 0.4], "window_s": 60, "grace_s": 2}


def status_row(sshd: Any, tmp_path: Path, name: str) -> tuple[int, dict[str, Any]]:
    res = oncall(sshd, tmp_path, "status", name, "--json")
    return res.returncode, json.loads(res.stdout)


def state_json(row: dict[str, Any]) -> dict[str, Any]:
    """The supervisor's own record of the row's run (the test host is this machine)."""
    data: dict[str, Any] = json.loads((Path(row["run_dir"]) / "state.json").read_text())
    return data


def wait_row(sshd: Any, tmp_path: Path, name: str, ok: Any, what: str, tries: int = 60) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for _ in range(tries):  # bounded: tries x ~0.5 s
        row = status_row(sshd, tmp_path, name)[1]
        if ok(row):
            return row
        time.sleep(0.5)
    raise AssertionError(f"{what}: {row}")


def test_the_default_policy_restarts_a_crash_after_ready_and_up_says_so(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="keep", extra={"restart": FAST})  # no policy written: the default
    up = deploy("up", str(prof), "--skip-preflight", "--json", home=tmp_path / "h")
    assert up.returncode == 0, up.stderr
    said = events(up.stdout)[-1]["restart"]
    assert said["policy"] == "on-failure" and "restarted on the target" in said["text"], said
    first = status_row(sshd, tmp_path, "keep")[1]
    assert on_target(sshd, f"kill -KILL -- -{state_json(first)['pgid']}").returncode == 0  # the OOM killer, at 3 a.m.
    back = wait_row(sshd, tmp_path, "keep", lambda r: r["status"] == "ready" and r["restarts"] == 1, "restarted")
    assert back["pid"] != first["pid"] and back["healthy"]
    human = deploy("up", str(prof), "--skip-preflight", "--force", home=tmp_path / "h")
    assert human.returncode == 0 and "a crash after ready is restarted on the target" in human.stderr + human.stdout

    opted = write_profile(tmp_path, sshd, name="keep", file="no.yaml", port=first["port"],
                          extra={"restart": {**FAST, "policy": "no"}})
    res = deploy("up", str(opted), "--skip-preflight", "--force", "--json", home=tmp_path / "h")
    assert res.returncode == 0, res.stderr
    assert events(res.stdout)[-1]["restart"]["text"].startswith("a crash after ready stays down (restart.policy: no)")
    assert deploy("down", str(prof), home=tmp_path / "h").returncode == 0


def test_a_version_that_crash_loops_after_ready_is_not_good(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    restart = {**FAST, "max": 1, "stable_s": 0.5}
    good = write_profile(tmp_path, sshd, name="cl", env={"WHICH": "a"}, extra={"restart": restart})
    assert deploy("up", str(good), "--skip-preflight", home=home).returncode == 0
    port = status_row(sshd, tmp_path, "cl")[1]["port"]
    good_hash = wait_row(sshd, tmp_path, "cl", lambda r: state_json(r).get("stable_at"), "a stable")["content_hash"]
    loops = write_profile(tmp_path, sshd, name="cl", file="loops.yaml", port=port, extra={"restart": restart},
                          env={"WHICH": "b", "STANDIN_MODE": "crash_after_ready", "STANDIN_CRASH_AFTER_S": "1.5"})
    assert deploy("up", str(loops), "--skip-preflight", home=home).returncode == 0  # it did reach ready
    row = wait_row(sshd, tmp_path, "cl", lambda r: r["status"] == "crashloop", "crashloop")
    loop_hash = row["content_hash"]

    hist = json.loads(oncall(sshd, tmp_path, "history", "cl", "--json").stdout)
    assert (hist[0]["outcome"], hist[0]["good"]) == ("crashloop", False), hist[0]
    assert hist[0]["detail"].startswith("crash-looped after ready: 1 restarts")
    assert (hist[1]["outcome"], hist[1]["good"]) == ("ready", True)
    refused = oncall(sshd, tmp_path, "restart", "cl")
    assert refused.returncode == 7 and "crash-looped after ready" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr

    down = oncall(sshd, tmp_path, "down", "cl")  # the on-call engineer silences it
    assert down.returncode == 0 and "cl: stopped on" in down.stdout, down.stdout + down.stderr
    code, row = status_row(sshd, tmp_path, "cl")
    assert (code, row["status"]) == (8, "stopped"), row

    third = write_profile(tmp_path, sshd, name="cl", file="c.yaml", port=port, env={"WHICH": "c"},
                          extra={"restart": restart})
    assert deploy("up", str(third), "--skip-preflight", home=home).returncode == 0
    back = oncall(sshd, tmp_path, "rollback", "cl", "--json")
    assert back.returncode == 0, back.stderr
    now = status_row(sshd, tmp_path, "cl")[1]
    assert now["content_hash"] == good_hash != loop_hash and now["healthy"]  # b skipped: it did not stay up
    oncall(sshd, tmp_path, "down", "cl")


def test_a_reboot_brings_the_deployment_back_and_down_removes_the_entry(tmp_path: Path, sshd: Any) -> None:
    table = sshd.dir / "crontab.txt"
    prof = write_profile(tmp_path, sshd, name="boot")
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h").returncode == 0
    first = status_row(sshd, tmp_path, "boot")[1]
    pids = state_json(first)
    mark = f"# deployer-on-boot {tmp_path / 'work' / 'boot'}"
    entries = [line for line in table.read_text().splitlines() if line.endswith(mark)]
    assert len(entries) == 1 and entries[0].startswith("@reboot ") and first["run_dir"] in entries[0]
    # the reboot: every process of the deployment is gone without a word
    assert on_target(sshd, f"kill -KILL {pids['supervisor_pid']}; kill -KILL -- -{pids['pgid']}").returncode == 0
    wait_row(sshd, tmp_path, "boot", lambda r: r["status"] == "lost", "lost")
    booted = on_target(sshd, "env -i PATH=/usr/bin:/bin sh -c " + shlex.quote(entries[0].removeprefix("@reboot ")))
    assert booted.returncode == 0, booted.stderr
    back = wait_row(sshd, tmp_path, "boot", lambda r: r["status"] == "ready" and r["healthy"], "back after boot")
    assert back["pid"] != first["pid"] and back["run_dir"] == first["run_dir"]
    assert oncall(sshd, tmp_path, "down", "boot").returncode == 0
    assert not [line for line in table.read_text().splitlines() if line.endswith(mark)]

    smoked = deploy("smoke", str(prof), "--skip-preflight", home=tmp_path / "h")  # up, a request, stop
    assert smoked.returncode == 0, smoked.stderr[-2000:]
    assert mark not in table.read_text()  # a smoke's deployment does not come back after a reboot

    off = write_profile(tmp_path, sshd, name="boot", file="off.yaml", extra={"restart": {"on_boot": False}})
    assert deploy("up", str(off), "--skip-preflight", home=tmp_path / "h").returncode == 0
    assert mark not in table.read_text()
    oncall(sshd, tmp_path, "down", "boot")


def on_target(sshd: Any, cmd: str) -> subprocess.CompletedProcess[str]:
    """A command on the test host through its sshd (inside its PID namespace: nothing outlives the bed)."""
    return subprocess.run(["ssh", "-F", str(sshd.ssh_config), "deployer-test", cmd], capture_output=True,
                          text=True, timeout=60)
