"""Fencing over the real sshd (issue 22 finding 3): an operation whose lock was broken cannot start, stop or bring
back anything afterwards, whatever it was doing, and says it lost the lock; a supervisor does not restart its
engine while someone else holds the deployment's lock."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from deploy_helpers import deploy, free_port, write_profile  # noqa: E402
from faultbed import host_pid, start_deploy, wait_for_event  # noqa: E402
from netbed import processes_under  # noqa: E402
from deployer.profile.loader import load_profile  # noqa: E402
from deployer.remote.connect import connect  # noqa: E402
from deployer.box.lock import DeploymentLock  # noqa: E402
from deployer.box.push import layout_for, prepare  # noqa: E402

pytestmark = pytest.mark.integration

# a long lease: the lost `up`'s heartbeat (every 20 s) cannot hear LOST before its next action; only the target's
# fence stops it
LONG_LEASE = {"DEPLOYER_LOCK_LEASE_S": "120"}
# the named steps of a replace: attempt 1 begins (lock held), the new run dir is pushed, the serving version is
# being stopped, the new engine loads under the watch
POINTS = {"attempt": '"event": "attempt"', "pushed": '"event": "pushed"',
          "stopping": "to replace it", "phase": '"event": "phase"'}


def running(work: Path, name: str) -> list[int]:
    return processes_under(work / name)


@pytest.mark.parametrize("point", list(POINTS))
def test_an_up_whose_lock_was_broken_starts_nothing_afterwards_and_says_it_lost_the_lock(
        tmp_path: Path, sshd: Any, point: str) -> None:
    home, work, name, port = tmp_path / "h", tmp_path / "work", f"fence-{point}", free_port()
    slow = {"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.3"}
    v1 = write_profile(tmp_path, sshd, name=name, port=port, env=slow, file="v1.yaml")
    v2 = write_profile(tmp_path, sshd, name=name, port=port, env={**slow, "VERSION": "2"}, file="v2.yaml")
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home, env=LONG_LEASE)
    try:
        wait_for_event(up, POINTS[point])
        up.send_signal(signal.SIGSTOP)  # frozen right there: the break lands between two of its steps
        broke = deploy("down", str(v2), "--break-lock", home=home, env=LONG_LEASE)
        assert broke.returncode == 0 and "broke the deployment lock" in broke.stderr, broke.stderr
        stopped_at = time.monotonic()
        up.send_signal(signal.SIGCONT)
        out, err = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
    text = err.decode()
    assert up.returncode == 4, (up.returncode, text[-3000:])
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: lost the deployment lock"), text[-3000:]
    assert "Traceback" not in text and "brought back" not in errors[0].replace("not brought back", ""), text
    # nothing of the deployment runs after the break, and nothing comes back later (no supervisor restart either)
    while time.monotonic() < stopped_at + 4:
        assert not running(work, name), "something started after the lock was broken"
        time.sleep(0.3)
    st = deploy("status", str(v2), "--json", home=home)
    assert st.returncode == 8 and json.loads(st.stdout)["status"] == "stopped", st.stdout  # as `down` left it


def test_a_supervisor_does_not_restart_its_engine_while_another_holds_the_lock(tmp_path: Path, sshd: Any) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", "fence-restart"
    prof = write_profile(tmp_path, sshd, name=name, extra={"restart": {"grace_s": 3, "policy": "always",
                                                                        "backoff_s": [0.2, 1]}})
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    run = (work / name / "current").resolve()

    def kill_engine() -> None:
        state = json.loads((run / "state.json").read_text())
        os.killpg(host_pid(int(state["pgid"]), work / name), signal.SIGKILL)  # its pid in the sshd's namespace

    def status_after(seconds: float) -> str:
        time.sleep(seconds)
        return str(json.loads((run / "state.json").read_text())["status"])

    engine = host_pid(int(json.loads((run / "state.json").read_text())["pid"]), work / name)
    assert b"DEPLOYER_LEASE_TOKENS" not in Path(f"/proc/{engine}/environ").read_bytes()  # the supervisor's only
    kill_engine()  # nobody holds the lock: the policy restarts it
    deadline = time.monotonic() + 30
    state: dict[str, Any] = {}
    while not (state.get("status") == "ready" and state.get("restarts") == 1) and time.monotonic() < deadline:
        time.sleep(0.2)
        state = json.loads((run / "state.json").read_text())
    assert state["status"] == "ready" and state["restarts"] == 1, state
    remote = connect(sshd.spec())
    try:
        layout = layout_for(remote, load_profile(prof))
        prepare(remote, layout)
        with DeploymentLock(remote, layout, "someone else"):
            kill_engine()
            assert status_after(3) == "exited"  # not restarted under another's lock
            assert "not restarted: the deployment lock is held by" in (run / "supervisor.log").read_text()
    finally:
        remote.close()
    assert not running(work, name)
