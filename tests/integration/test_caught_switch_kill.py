"""kill -9 of `deploy up` between the two calls of a switch (deployer/box/switch.py): `current` already names the
new run, whose start was never asked for (issue 33's audit: no test killed the client there).

The client is the real CLI over the real sshd, in a process of its own whose `switch.start` kills that process
with SIGKILL instead of starting (after noting the run it was about to start): the kill lands exactly between
`set_current` and `start`, not somewhere near them. What must be true after: in a replace, the target's guard
finds `current` on a run that never started, starts the version that served again and points `current` back
at it; on a first `up`, `status` says nothing serves (never "ready") and the next `up` takes over the dead
client's lock and serves. Either way the lock ends released."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from deploy_helpers import REPO, deploy, free_port, write_profile  # noqa: E402
from faultbed import assert_lock_free, current_run, guard_of  # noqa: E402

from deployer.supervisor.base import pid_alive  # noqa: E402

pytestmark = pytest.mark.integration

# `deploy` whose first switch dies by SIGKILL after `current` moved and before the start (the note: that run)
KILLED_BEFORE_START = """
import os, signal, sys
import deployer.box.switch as switch

def start_killed(remote, run):
    with open(os.environ["KILL_NOTE"], "w") as note:
        note.write(run.path)
    os.kill(os.getpid(), signal.SIGKILL)

switch.start = start_killed
from deployer.cli.main import main
main(sys.argv[1:])
"""


def up_killed_before_start(prof: Path, home: Path, note: Path) -> subprocess.CompletedProcess[str]:
    """`deploy up` killed -9 between `set_current` and `start`; the run it was about to start is in `note`."""
    done = subprocess.run([sys.executable, "-c", KILLED_BEFORE_START, "up", str(prof), "--skip-preflight"],
                          capture_output=True, text=True, timeout=120, cwd=str(REPO),
                          env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home),
                               "HOME": str(home), "KILL_NOTE": str(note)})
    assert done.returncode == -9, (done.returncode, done.stderr[-3000:])
    assert note.exists(), "the switch was never reached"
    return done


def status(prof: Path, home: Path) -> tuple[int, dict[str, Any]]:
    out = deploy("status", str(prof), "--json", home=home)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, dict(json.loads(out.stdout))


def wait_status(prof: Path, home: Path, code: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    got, st = status(prof, home)
    while got != code and time.monotonic() < deadline:
        time.sleep(0.5)
        got, st = status(prof, home)
    assert got == code, (got, st)
    return st


def test_kill_9_between_current_and_start_of_a_replace_the_guard_serves_the_previous_version(
        tmp_path: Path, sshd: Any) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", "caught-switch-replace"
    port = free_port()
    v1 = write_profile(tmp_path, sshd, name=name, port=port, file="v1.yaml")
    v2 = write_profile(tmp_path, sshd, name=name, port=port, file="v2.yaml", env={"STANDIN_NOTE": "v2"})
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    old_run = current_run(work, name)
    note = tmp_path / "killed-at"
    up_killed_before_start(v2, home, note)
    new_run = Path(note.read_text())
    assert new_run != old_run
    guard = guard_of(work, name)  # armed before the stop; repairs once the client is gone for a few seconds
    st = wait_status(v1, home, 0, timeout=60)
    assert Path(st["run_dir"]) == old_run and current_run(work, name) == old_run, st
    assert not (new_run / "state.json").exists()  # the run `current` named at the kill was never started
    deadline = time.monotonic() + 10
    while pid_alive(guard) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(guard)
    assert_lock_free(work, name)
    assert not (work / name / "replace-intent.json").exists()
    shown = deploy("history", str(v1), home=home).stdout
    assert "repaired an interrupted replace" in shown and "started the previous version" in shown, shown
    again = deploy("up", str(v2), "--skip-preflight", home=home)  # the next command converges to what it asks
    assert again.returncode == 0, again.stderr[-3000:]
    assert status(v2, home)[0] == 0
    assert deploy("down", str(v2), home=home).returncode == 0


def test_kill_9_between_current_and_start_of_a_first_up_status_is_honest_and_the_next_up_serves(
        tmp_path: Path, sshd: Any) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", "caught-switch-first"
    prof = write_profile(tmp_path, sshd, name=name)
    note = tmp_path / "killed-at"
    up_killed_before_start(prof, home, note)
    run = Path(note.read_text())
    assert current_run(work, name) == run and not (run / "state.json").exists()  # no guard: nothing served before
    code, st = status(prof, home)
    assert (code, st["status"], st.get("healthy")) == (5, "absent", False), (code, st)
    again = deploy("up", str(prof), "--skip-preflight", home=home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "that process is gone" in again.stderr, again.stderr  # the dead client's lease, taken over
    code, st = status(prof, home)
    assert code == 0 and st["status"] == "ready" and Path(st["run_dir"]) == current_run(work, name), st
    assert_lock_free(work, name)
    assert deploy("down", str(prof), home=home).returncode == 0
