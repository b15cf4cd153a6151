"""Network faults between deployer and its target, on a host in its own network namespace (tests/netbed.py):
a frozen link shorter than the lock's lease, a partition longer than it while a colleague on the box acts, and
packet loss. Each case checks what serves afterwards, what the lock says, and that nothing leaked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from faultbed import (
    SECRET, assert_lock_free, assert_nothing_leaked, deploy_in, inside_profile, lease, secret_env, start_deploy,
    status_of, wait_for_event,
)
from deploy_helpers import deploy, write_profile
from netbed import NetHost

pytestmark = pytest.mark.integration

SLOW = {"STANDIN_MODE": "slow", "STANDIN_STEP_S": "1.0", "HF_TOKEN": "${FAULT_SECRET}"}


def profile_on(net: NetHost, tmp_path: Path, name: str, env: dict[str, str] | None = None) -> Path:
    return write_profile(tmp_path, net.sshd, name=name, env=env or SLOW,
                         extra={"health": {"interval_s": 0.5, "startup_timeout_s": 120, "stall_timeout_s": 60}})


def test_a_frozen_link_shorter_than_the_lease_mid_up_is_ridden_out(tmp_path: Path, net: NetHost) -> None:
    home, work = tmp_path / "h", tmp_path / "work"
    prof = profile_on(net, tmp_path, "frozen-link")
    env = secret_env(lease_s=20)
    up = start_deploy("up", str(prof), "--json", "--skip-preflight", home=home, env=env)
    try:
        wait_for_event(up, '"event": "phase"')
        net.partition()  # TCP stays up, nothing gets through: the heartbeat and the watch hear nothing
        time.sleep(3)
        net.heal()
        out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err.decode()[-3000:]
    assert b"Traceback" not in err
    st = status_of(prof, home, env)
    assert st["status"] == "ready" and st["healthy"]
    assert_lock_free(work, "frozen-link")
    assert_nothing_leaked(work, home, "frozen-link", serving=True)
    assert deploy("down", str(prof), home=home, env=env).returncode == 0
    assert_nothing_leaked(work, home, "frozen-link", serving=False)


def test_partition_longer_than_the_lease_a_colleague_takes_over_and_up_stops(tmp_path: Path, net: NetHost) -> None:
    """Our link is cut mid-up; after the lease expires a colleague on the GPU box runs `down` (it must be let in,
    saying from whom); when the link heals, our `up` must stop without touching the target again."""
    home, work = tmp_path / "h", tmp_path / "work"
    prof = profile_on(net, tmp_path, "partition")
    env = secret_env(lease_s=8)
    up = start_deploy("up", str(prof), "--json", "--skip-preflight", home=home, env=env)
    try:
        wait_for_event(up, '"event": "phase"')
        holder = lease(work, "partition")
        net.partition()
        cut = time.monotonic()
        early = deploy_in(net, "down", str(inside_profile(prof, net)), home=tmp_path / "colleague", env=env)
        assert time.monotonic() - cut < 7, "too slow to test the refusal within the lease"
        assert early.returncode == 4 and "locked by" in early.stderr and "(up)" in early.stderr, early.stderr
        time.sleep(max(0.0, cut + 8.5 - time.monotonic()))  # the lease runs out: no heartbeat gets through
        taken = deploy_in(net, "down", str(inside_profile(prof, net)), home=tmp_path / "colleague", env=env)
        assert taken.returncode == 0, taken.stderr
        assert f"took over the deployment lock from {holder['owner']} pid {holder['pid']} (up)" in taken.stderr
        assert "its lease expired" in taken.stderr
        net.heal()
        out, err = up.communicate(timeout=120)
    finally:
        net.heal()
        if up.poll() is None:
            up.kill()
    text = err.decode()
    assert up.returncode == 4 and "Traceback" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("error: ") and "lost the deployment lock" in last, last
    assert "stopped without changing anything more" in last
    # the colleague's `down` stands: nothing was restarted behind their back
    time.sleep(1)
    st = status_of(prof, home, env)
    assert st["status"] == "stopped" and not st["healthy"], st
    assert_lock_free(work, "partition")
    assert_nothing_leaked(work, home, "partition", serving=False)
    history = deploy("history", str(prof), home=home, env=env).stdout
    assert "lock-taken-over" in history and "(up)" in history and "(down)" in history
    assert SECRET not in history


def test_packet_loss_does_not_break_up(tmp_path: Path, net: NetHost) -> None:
    home, work = tmp_path / "h", tmp_path / "work"
    prof = profile_on(net, tmp_path, "lossy", env={"HF_TOKEN": "${FAULT_SECRET}"})
    env = secret_env(lease_s=10)
    net.loss(10)
    try:
        proc = deploy("up", str(prof), "--skip-preflight", home=home, env=env, timeout=180)
    finally:
        net.heal()
    assert proc.returncode == 0, proc.stderr
    assert status_of(prof, home, env)["healthy"]
    assert_lock_free(work, "lossy")
    assert_nothing_leaked(work, home, "lossy", serving=True)
    assert deploy("down", str(prof), home=home, env=env).returncode == 0


def test_link_down_is_a_quick_clear_error_and_changes_nothing(tmp_path: Path, net: NetHost) -> None:
    home, work = tmp_path / "h", tmp_path / "work"
    prof = profile_on(net, tmp_path, "linkdown", env={"HF_TOKEN": "${FAULT_SECRET}"})
    env = secret_env(lease_s=10)
    assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
    net.link(False)  # the route goes; the blackhole answers at once
    try:
        t0 = time.monotonic()
        down = deploy("down", str(prof), home=home, env=env, timeout=60)
        took = time.monotonic() - t0
    finally:
        net.heal()
    assert down.returncode == 3 and "Traceback" not in down.stderr, down.stderr
    assert down.stderr.strip().splitlines()[-1].startswith("error: ") and took < 30
    st = status_of(prof, home, env)  # link back: the engine served on, untouched
    assert st["status"] == "ready" and st["healthy"] and st["lock"] is None
    assert_nothing_leaked(work, home, "linkdown", serving=True)
    assert deploy("down", str(prof), home=home, env=env).returncode == 0
