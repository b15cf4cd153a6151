"""The deployment lock over the real sshd: a dropped connection mid-`up`, a frozen client's stale lease, a killed
`deploy`, and --break-lock (issue 10 item 3)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import REPO, deploy, write_profile
from deployer.errors import LockLost
from deployer.box.lock import DeploymentLock
from deployer.profile.loader import load_profile
from deployer.box.push import layout_for, prepare
from deployer.remote.connect import connect

pytestmark = pytest.mark.integration

SHORT_LEASE = {"DEPLOYER_LOCK_LEASE_S": "6"}


def last_error(proc: Any) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), proc.stderr
    return str(lines[-1])


def start_up(prof: Path, home: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", str(prof), "--json", "--skip-preflight"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO),
                            env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home), **(env or {})})


def wait_for_phase(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until `up` reports the engine loading (it holds the lock and watches)."""
    assert proc.stdout is not None
    got, deadline = b"", time.monotonic() + timeout
    while b'"event": "phase"' not in got and time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1)[0]:
            got += os.read(proc.stdout.fileno(), 65536)
    assert b'"event": "phase"' in got, got[-2000:]


def lease_on_target(workdir: Path, name: str) -> dict[str, Any]:
    text = (workdir / name / "lock").read_text().strip()
    return dict(json.loads(text)) if text else {}


def test_dropped_connection_mid_up_retakes_the_lease_and_a_down_meanwhile_is_refused(
        tmp_path: Path, fresh_sshd: Any) -> None:
    home, work = tmp_path / "h", tmp_path / "work"
    prof = write_profile(tmp_path, fresh_sshd, name="drop", env={"STANDIN_MODE": "slow", "STANDIN_STEP_S": "1.5"})
    up = start_up(prof, home, SHORT_LEASE)
    try:
        wait_for_phase(up)
        token = lease_on_target(work, "drop")["token"]
        assert fresh_sshd.drop_connections() >= 1  # the link is gone: every session of `up` dies with it
        down = deploy("down", str(prof), home=home, env=SHORT_LEASE)  # in the gap: must be refused
        out, err = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
    assert down.returncode == 4, (down.stderr, err.decode()[-3000:], up.returncode)
    assert "locked by" in last_error(down) and "(up)" in last_error(down) and " since " in last_error(down)
    text = err.decode() + out.decode()  # with --json, warnings are events on stdout
    assert "Traceback" not in text, text
    # the link came back at once (loopback), well within the lease: the one right outcome is to re-take the same
    # lease and carry on (losing the lock here would mean the retake is broken)
    assert up.returncode == 0, text[-3000:]
    assert "re-took the same deployment lock" in text and "lost the deployment lock" not in text
    assert lease_on_target(work, "drop").get("token") in (None, token)
    st = json.loads(deploy("status", str(prof), "--json", home=home).stdout)
    assert st["status"] == "ready" and st["healthy"]
    # released at the end either way: the next operation needs no wait
    assert deploy("down", str(prof), home=home, env=SHORT_LEASE).returncode == 0


def hold_then_freeze(prof: Path, tmp_path: Path, lease: str) -> subprocess.Popen[str]:
    """A client that takes the lock, says HELD, and then (once frozen and thawed) tries to act."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / 'tests')!r})
        from deployer.errors import LockLost
        from deployer.box.lock import DeploymentLock
        from deployer.remote.connect import target_spec
        from deployer.profile.loader import load_profile
        from deployer.box.push import layout_for, prepare
        from deployer.remote.connect import connect
        profile = load_profile({str(prof)!r})
        remote = connect(target_spec(profile))
        layout = layout_for(remote, profile)
        prepare(remote, layout)
        with DeploymentLock(remote, layout, "frozen up") as lock:
            print("HELD", flush=True)
            sys.stdin.readline()
            try:
                lock.guarded().run("true")
                print("STILL HELD", flush=True)
            except LockLost as e:
                print("LOST " + str(e), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env={"PATH": os.environ["PATH"], "DEPLOYER_LOCK_LEASE_S": lease,
                                 "HOME": os.environ.get("HOME", "/root")})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "HELD", proc.stderr
    return proc


def test_a_frozen_clients_lease_expires_and_is_taken_over_saying_from_whom(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="frozen")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    holder = hold_then_freeze(prof, tmp_path, "8")
    try:
        os.kill(holder.pid, signal.SIGSTOP)  # TCP stays open, the heartbeat stops: a client that vanished
        frozen = time.monotonic()
        refused = deploy("down", str(prof), home=home)
        assert refused.returncode == 4 and f"pid {holder.pid} (frozen up)" in last_error(refused)
        lock = json.loads(deploy("status", str(prof), "--json", home=home).stdout)["lock"]
        assert lock["held"] and lock["pid"] == holder.pid and lock["command"] == "frozen up" and "token" not in lock
        assert time.monotonic() - frozen < 6.5, "too slow to see the lease held"
        time.sleep(max(0.0, frozen + 8.5 - time.monotonic()))  # the lease runs out
        shown = deploy("status", str(prof), home=home).stdout
        assert "lock: expired lease of root@" in shown and "(frozen up)" in shown, shown
        taken = deploy("down", str(prof), home=home)
        assert taken.returncode == 0, taken.stderr
        assert f"took over the deployment lock from root@" in taken.stderr
        assert f"pid {holder.pid} (frozen up)" in taken.stderr and "its lease expired" in taken.stderr
        os.kill(holder.pid, signal.SIGCONT)
        out, _ = holder.communicate("go\n", timeout=30)
        assert out.startswith("LOST lost the deployment lock") and "stopped without changing anything" in out, out
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
    assert json.loads(deploy("status", str(prof), "--json", home=home).stdout)["lock"] is None  # released
    rows = json.loads(deploy("history", str(prof), "--json", home=home).stdout)
    lock_rows = [r for r in rows if r.get("kind") == "lock"]
    assert lock_rows and lock_rows[0]["outcome"] == "lock-taken-over"
    assert "(frozen up)" in lock_rows[0]["detail"] and "lease had expired" in lock_rows[0]["detail"]
    text = deploy("history", str(prof), home=home).stdout
    assert "lock-taken-over" in text and "(frozen up)" in text


def test_break_lock_takes_a_live_lock_is_recorded_and_the_holder_stops(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="breaking")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    profile = load_profile(prof)
    remote = connect(sshd.spec())
    try:
        layout = layout_for(remote, profile)
        prepare(remote, layout)
        with DeploymentLock(remote, layout, "stuck holder") as lock:
            assert deploy("down", str(prof), home=home).returncode == 4
            broke = deploy("down", str(prof), "--break-lock", home=home)
            assert broke.returncode == 0, broke.stderr
            assert "broke the deployment lock held by" in broke.stderr and "(stuck holder)" in broke.stderr
            deadline = time.monotonic() + lock.heartbeat_s * 4 + 5
            with pytest.raises(LockLost, match="lock is now held by|taken over or released"):
                while time.monotonic() < deadline:  # its next heartbeat hears LOST
                    lock.guarded().run("true")
                    time.sleep(0.2)
    finally:
        remote.close()
    rows = json.loads(deploy("history", str(prof), "--json", home=home).stdout)
    broken = [r for r in rows if r.get("kind") == "lock"]
    assert broken and broken[0]["outcome"] == "lock-broken" and "(stuck holder)" in broken[0]["detail"]
    assert "(down)" in broken[0]["detail"]


def test_deploy_killed_mid_up_the_rerun_takes_over_at_once(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="killed", env={"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.3"})
    up = start_up(prof, home)  # the default 30 s lease: the rerun must not wait for it
    wait_for_phase(up)
    up.kill()
    up.wait(timeout=10)
    t0 = time.monotonic()
    again = deploy("up", str(prof), "--skip-preflight", home=home)
    assert again.returncode == 0, again.stderr
    assert f"took over the deployment lock from root@" in again.stderr
    assert f"pid {up.pid} (up)" in again.stderr and "that process is gone" in again.stderr
    assert time.monotonic() - t0 < 25
    assert deploy("down", str(prof), home=home).returncode == 0
