"""Ctrl-C, SIGTERM and kill -9 of `deploy up` at named points of a replace, over the real sshd (issue 22 finding 5,
and finding 10's Ctrl-C give-up): nothing is left half done, the lock is released, and `status` never reads an
interrupted replace as a deliberate `down` (exit 8)."""

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
from faultbed import assert_lock_free, current_run, guard_of, start_deploy, wait_for_event  # noqa: E402

from deployer.supervisor.base import pid_alive  # noqa: E402

pytestmark = pytest.mark.integration

STOPPING = "to replace it"  # the line `up` says just before it stops the serving version


def replace_pair(tmp_path: Path, sshd: Any, name: str) -> tuple[Path, Path]:
    """v1 takes 3 s to stop (it drains), v2 loads slowly: an interrupt lands inside the stop, or the load."""
    port = free_port()
    v1 = write_profile(tmp_path, sshd, name=name, port=port, env={"STANDIN_DRAIN_S": "3"}, file="v1.yaml",
                       extra={"restart": {"grace_s": 10}})
    v2 = write_profile(tmp_path, sshd, name=name, port=port, env={"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.5"},
                       file="v2.yaml", extra={"restart": {"grace_s": 10}})
    return v1, v2


def status(prof: Path, home: Path) -> tuple[int, dict[str, Any]]:
    out = deploy("status", str(prof), "--json", home=home)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, dict(json.loads(out.stdout))


def wait_serving(prof: Path, home: Path, timeout: float = 40) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    code, st = status(prof, home)
    while code != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        code, st = status(prof, home)
    assert code == 0, st
    return st


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_the_stop_of_a_replace_brings_back_the_stopped_version(
        tmp_path: Path, sshd: Any, how: signal.Signals) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", f"intr-stop-{how.name.lower()}"
    v1, v2 = replace_pair(tmp_path, sshd, name)
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    old_run = current_run(work, name)
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home)
    try:
        wait_for_event(up, STOPPING)
        time.sleep(0.5)  # inside the stop (v1 drains for 3 s)
        sent = time.monotonic()
        up.send_signal(how)
        out, err = up.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if up.poll() is None:
            up.kill()
    text = out.decode() + err.decode()
    assert up.returncode == 130 and "Traceback" not in text, text[-3000:]
    assert "started the previous version" in text and "again" in text, text[-3000:]
    assert took < 10 + 5 + 35, took  # the stop's grace, the port wait, the start: the interrupt's bound
    assert_lock_free(work, name)  # released, SIGTERM as Ctrl-C
    assert current_run(work, name) == old_run
    st = wait_serving(v1, home)
    assert Path(st["run_dir"]) == old_run


def test_sigterm_of_up_while_it_watches_releases_the_lock_and_leaves_the_new_version_loading(
        tmp_path: Path, sshd: Any) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", "intr-term"
    prof = write_profile(tmp_path, sshd, name=name, env={"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.5"})
    up = start_deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    try:
        wait_for_event(up, '"event": "phase"')
        up.send_signal(signal.SIGTERM)
        out, err = up.communicate(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, (up.returncode, err.decode()[-2000:])
    assert err.decode().strip().splitlines()[-1].startswith("interrupted")
    assert_lock_free(work, name)
    assert deploy("down", str(prof), home=home).returncode == 0  # no wait for a lease


def test_kill_9_during_the_stop_of_a_replace_the_target_starts_the_previous_version_again_by_itself(
        tmp_path: Path, sshd: Any) -> None:
    """No further command but reads: the target-side guard notices the client is gone, takes the lock, starts v1
    again from its run dir, records it in the lock's history and releases the lock, within stop + load + 10 s."""
    home, work, name = tmp_path / "h", tmp_path / "work", "intr-kill"
    v1, v2 = replace_pair(tmp_path, sshd, name)
    began = time.monotonic()
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    load_s = time.monotonic() - began  # v1's whole first up: more than its load
    old_run = current_run(work, name)
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home)
    try:
        wait_for_event(up, STOPPING)
        guard = guard_of(work, name)
        time.sleep(0.5)  # inside the stop (v1 drains for 3 s), which goes on on the target without us
        killed = time.monotonic()
        up.send_signal(signal.SIGKILL)
        up.communicate(timeout=10)
    finally:
        if up.poll() is None:
            up.kill()
    st = wait_serving(v1, home, timeout=3 + load_s + 10)
    took = time.monotonic() - killed
    assert Path(st["run_dir"]) == old_run and current_run(work, name) == old_run, st
    assert took < 3 + load_s + 10, (took, load_s)
    deadline = time.monotonic() + 10
    while pid_alive(guard) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(guard)  # its work done, it left
    assert_lock_free(work, name)
    assert not (work / name / "replace-intent.json").exists()
    shown = deploy("history", str(v1), home=home).stdout
    assert "repaired an interrupted replace" in shown and "its client was gone" in shown, shown
    down = deploy("down", str(v1), home=home)
    assert down.returncode == 0
    assert status(v1, home) == (8, status(v1, home)[1]) and status(v1, home)[1]["status"] == "stopped"


def test_the_guard_leaves_a_replacement_that_finished_alone(tmp_path: Path, sshd: Any) -> None:
    """A replace that ends normally disarms its guard: the guard is gone, nothing is started again."""
    home, work, name = tmp_path / "h", tmp_path / "work", "intr-guard-done"
    v1, v2 = replace_pair(tmp_path, sshd, name)
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home)
    try:
        wait_for_event(up, STOPPING)
        guard = guard_of(work, name)
        out, err = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err.decode()[-3000:]
    new_run = current_run(work, name)
    deadline = time.monotonic() + 5
    while pid_alive(guard) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(guard)
    assert not (work / name / "replace-intent.json").exists()
    assert current_run(work, name) == new_run
    assert deploy("down", str(v2), home=home).returncode == 0


def test_a_down_of_an_interrupted_replace_makes_it_a_deliberate_stop(tmp_path: Path, sshd: Any) -> None:
    """With the target's guard gone too (killed here; a reboot does the same), the replace stays interrupted
    (exit 5, never 8) until a `down` makes it a deliberate stop."""
    home, work, name = tmp_path / "h", tmp_path / "work", "intr-down"
    v1, v2 = replace_pair(tmp_path, sshd, name)
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home)
    wait_for_event(up, STOPPING)
    os.kill(guard_of(work, name), signal.SIGKILL)
    time.sleep(0.5)
    up.send_signal(signal.SIGKILL)
    up.communicate(timeout=10)
    deadline = time.monotonic() + 20
    while status(v1, home)[1]["status"] != "interrupted" and time.monotonic() < deadline:
        time.sleep(0.3)
    code, st = status(v1, home)
    assert (code, st["status"]) == (5, "interrupted"), st  # not 8: nobody asked for a stop
    assert deploy("down", str(v1), home=home).returncode == 0
    code, st = status(v1, home)
    assert (code, st["status"]) == (8, "stopped"), st


def test_ctrl_c_with_the_targets_helper_frozen_still_ends_within_the_bound(tmp_path: Path, fresh_sshd: Any) -> None:
    """The target's helper frozen (SIGSTOP) while `up` watches: the clean-up's requests (the lock's release) get no
    answer; Ctrl-C still ends `deploy` within the interrupt's bound (20 s), and the next command on this machine
    does not wait for the lease. (The give-up itself: tests/unit/test_interrupt_bound.py.)"""
    home, work, name = tmp_path / "h", tmp_path / "work", "intr-hang"
    prof = write_profile(tmp_path, fresh_sshd, name=name, env={"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.5"})
    up = start_deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    frozen: list[int] = []
    try:
        wait_for_event(up, '"event": "phase"')
        assert fresh_sshd.proc is not None
        frozen = helpers_under(fresh_sshd.proc.pid)
        assert frozen, "no helper process found"
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(1)
        sent = time.monotonic()
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, err.decode()[-2000:]
    assert err.decode().strip().splitlines()[-1].startswith("interrupted"), err.decode()[-2000:]
    assert took < 22, took
    # the thawed helper may still act on the RELEASE it was sent; if not, this machine sees the holder is gone:
    # either way the next command needs no wait for the lease (30 s)
    t0 = time.monotonic()
    again = deploy("down", str(prof), home=home)
    assert again.returncode == 0 and time.monotonic() - t0 < 20, again.stderr


def helpers_under(root: int) -> list[int]:
    """The target-side helpers (`python3 -c LOADER .../helper-HASH.py`) that descend from the sshd `root`."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue

    def below(pid: int) -> bool:
        for _ in range(64):
            if pid == root:
                return True
            pid = parents.get(pid, 0)
            if pid <= 1:
                return False
        return False

    found = []
    for pid in parents:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"helper-" in cmd and below(pid):
            found.append(pid)
    return found
