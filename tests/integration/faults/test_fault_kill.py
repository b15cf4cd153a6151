"""kill -9 of `deploy` at named points of `up`, and of the target's supervisor; two deployments on one port.
Each case checks what serves afterwards, what the lock says, and that nothing was lost or leaked."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from faultbed import assert_lock_free, assert_nothing_leaked, current_run, secret_env, start_deploy, status_of
from faultbed import host_pid, wait_for_event
from deploy_helpers import deploy, free_port, write_profile

pytestmark = pytest.mark.integration

ENV = {"HF_TOKEN": "${FAULT_SECRET}"}
SLOW = {**ENV, "STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.4"}


@pytest.mark.parametrize("point", ["attempt", "pushed", "phase"])
def test_deploy_killed_at_a_named_point_the_rerun_takes_over_and_converges(tmp_path: Path, sshd: object,
                                                                           point: str) -> None:
    """`attempt`: lock held, nothing pushed yet; `pushed`: run dir written, engine not started; `phase`: the
    engine is loading under the watch."""
    home, work, env = tmp_path / "h", tmp_path / "work", secret_env()
    name = f"kill-{point}"
    prof = write_profile(tmp_path, sshd, name=name, env=SLOW)
    up = start_deploy("up", str(prof), "--json", "--skip-preflight", home=home, env=env)
    wait_for_event(up, f'"event": "{point}"')
    up.send_signal(signal.SIGKILL)
    up.communicate(timeout=10)
    held = json.loads((work / name / "lock").read_text())
    assert held["pid"] == up.pid and held["expires_at"] > time.time()  # the lease outlives its holder...
    again = deploy("up", str(prof), "--skip-preflight", home=home, env=env)
    assert again.returncode == 0, again.stderr  # ...but a rerun on the same machine sees the holder is gone
    assert f"pid {up.pid} (up)" in again.stderr and "that process is gone" in again.stderr
    st = status_of(prof, home, env)
    assert st["status"] == "ready" and st["healthy"] and Path(st["run_dir"]) == current_run(work, name)
    assert_lock_free(work, name)
    assert_nothing_leaked(work, home, name, serving=True)
    assert deploy("down", str(prof), home=home, env=env).returncode == 0
    assert_nothing_leaked(work, home, name, serving=False)


def _supervisor_pid(work: Path, name: str) -> int:
    run = current_run(work, name)
    assert run is not None
    return host_pid(int(json.loads((run / "state.json").read_text())["supervisor_pid"]), work / name)


def test_supervisor_killed_down_still_stops_the_engine(tmp_path: Path, sshd: object) -> None:
    home, work, env = tmp_path / "h", tmp_path / "work", secret_env()
    prof = write_profile(tmp_path, sshd, name="supkill", env=ENV)
    assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
    os.kill(_supervisor_pid(work, "supkill"), signal.SIGKILL)
    row = status_of(prof, home, env)
    assert row["healthy"] and not row["serving"], row  # the engine itself answers on, but nothing watches it
    assert row["supervisor"]["state"] == "dead", row["supervisor"]
    down = deploy("down", str(prof), home=home, env=env)
    assert down.returncode == 0, down.stderr
    assert_lock_free(work, "supkill")
    assert_nothing_leaked(work, home, "supkill", serving=False)


def test_supervisor_killed_up_puts_the_engine_back_under_supervision(tmp_path: Path, sshd: object) -> None:
    home, work, env = tmp_path / "h", tmp_path / "work", secret_env()
    prof = write_profile(tmp_path, sshd, name="supback", env=ENV)
    assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
    os.kill(_supervisor_pid(work, "supback"), signal.SIGKILL)
    try:
        assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
        supervisor = _supervisor_pid(work, "supback")
        os.kill(supervisor, 0)  # a live supervisor covers the engine again
        assert_nothing_leaked(work, home, "supback", serving=True)
    finally:
        deploy("down", str(prof), home=home, env=env)


def test_two_deployments_on_one_port_only_one_is_ready(tmp_path: Path, sshd: object) -> None:
    home, work, env = tmp_path / "h", tmp_path / "work", secret_env()
    port = free_port()
    fast = write_profile(tmp_path, sshd, name="port-a", port=port, env={**ENV, "STANDIN_STEP_S": "0.2"})
    slow = write_profile(tmp_path, sshd, name="port-b", port=port, env={**ENV, "STANDIN_MODE": "slow",
                                                                        "STANDIN_STEP_S": "1.5"})
    a = start_deploy("up", str(fast), "--skip-preflight", home=home, env=env)
    b = start_deploy("up", str(slow), "--skip-preflight", home=home, env=env)
    try:
        _, err_a = a.communicate(timeout=120)
        _, err_b = b.communicate(timeout=120)
        # The port is claimed when an engine starts (not when it is ready): whichever started first wins, even
        # the slower one, and the other is refused before it loads anything.
        codes = {"port-a": a.returncode, "port-b": b.returncode}
        assert sorted(codes.values()) == [0, 4], (err_a.decode(), err_b.decode())
        winner, loser = sorted(codes, key=lambda n: codes[n])
        last = (err_a if loser == "port-a" else err_b).decode().strip().splitlines()[-1]
        assert last.startswith("error: ") and f"port {port} taken by " in last and f"deployment {winner} " in last
        profs = {"port-a": fast, "port-b": slow}
        won = status_of(profs[winner], home, env)
        assert won["status"] == "ready" and won["healthy"]
        # Refused by the port check before its push, the loser has no run at all (status 7); refused by the
        # supervisor's port claim after it, its run is not serving.
        lost = deploy("status", str(profs[loser]), "--json", home=home, env=env)
        assert lost.returncode in (5, 7, 8) and "Traceback" not in lost.stderr, (lost.returncode, lost.stderr)
        if lost.returncode != 7:
            row = json.loads(lost.stdout)
            assert row["status"] not in ("ready", "running") and not row["healthy"], row
        assert_lock_free(work, "port-a")
        assert_lock_free(work, "port-b")
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
        deploy("down", str(fast), home=home, env=env)
        deploy("down", str(slow), home=home, env=env)


def _supervisor_alive(work: Path, name: str) -> bool:
    try:
        os.kill(_supervisor_pid(work, name), 0)
        return True
    except (AssertionError, ProcessLookupError):
        return False


def test_supervisor_killed_during_the_watch_up_does_not_report_an_unsupervised_ready(tmp_path: Path,
                                                                                    sshd: object) -> None:
    home, work, env = tmp_path / "h", tmp_path / "work", secret_env()
    prof = write_profile(tmp_path, sshd, name="supwatch", env=SLOW)
    up = start_deploy("up", str(prof), "--json", "--skip-preflight", home=home, env=env)
    try:
        wait_for_event(up, '"event": "phase"')
        os.kill(_supervisor_pid(work, "supwatch"), signal.SIGKILL)
        out, err = up.communicate(timeout=120)
        assert b'"event": "supervisor-lost"' in out, (out[-3000:], err[-2000:])  # noticed, not by chance
        assert up.returncode != 0 or _supervisor_alive(work, "supwatch")
    finally:
        if up.poll() is None:
            up.kill()
        assert deploy("down", str(prof), home=home, env=env).returncode == 0
        assert_nothing_leaked(work, home, "supwatch", serving=False)
