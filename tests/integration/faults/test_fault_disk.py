"""Disk full on the target: the workdir on a small tmpfs, filled up at the worst moments. Each case checks what
serves afterwards, what the lock says, and that nothing was lost or leaked."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultbed import (SECRET, assert_lock_free, assert_nothing_leaked, lease, secret_env, start_deploy, status_of,
                      wait_for_event)
from deploy_helpers import deploy, write_profile
from deployer.box.lock import DeploymentLock
from deployer.profile.loader import load_profile
from deployer.box.push import layout_for
from deployer.remote.connect import connect
from sshbed import SSHD, small_disk_sshd

pytestmark = pytest.mark.integration

ENV = {"HF_TOKEN": "${FAULT_SECRET}"}


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[tuple[SSHD, Path]]:
    """An 8 MB tmpfs workdir, mounted before the sshd starts (its PID namespace copies the mounts)."""
    with small_disk_sshd(tmp_path) as (bed, disk):
        yield bed, disk / "work"


def fill(disk: Path, leave: int = 0) -> Path:
    """Write until ENOSPC, then give back `leave` bytes; returns the filler (delete it to free the space)."""
    filler = disk.parent / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (16 << 10))
        except OSError as e:
            assert e.errno == errno.ENOSPC
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def test_on_a_full_disk_the_lock_is_taken_refused_and_released(tmp_path: Path, small_disk: tuple[SSHD, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    sshd, work = small_disk
    home, env = tmp_path / "h", secret_env()
    prof = write_profile(tmp_path, sshd, name="fulllock", env=ENV, workdir=work)
    assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
    filler = fill(work)
    monkeypatch.setenv("FAULT_SECRET", SECRET)
    profile = load_profile(prof)
    remote = connect(sshd.spec())
    try:
        layout = layout_for(remote, profile)
        with DeploymentLock(remote, layout, "on a full disk"):  # the lease is rewritten in place: no new blocks
            held = lease(work, "fulllock")
            assert held["command"] == "on a full disk" and held["expires_at"] > held["renewed_at"]
            refused = deploy("down", str(prof), home=home, env=env)
            assert refused.returncode == 4 and "(on a full disk)" in refused.stderr, refused.stderr
        assert lease(work, "fulllock").get("released_at")  # intact JSON, released
    finally:
        remote.close()
    assert status_of(prof, home, env)["healthy"]  # nothing was lost meanwhile
    assert_nothing_leaked(work, home, "fulllock", serving=True)
    filler.unlink()
    assert deploy("down", str(prof), home=home, env=env).returncode == 0
    assert_nothing_leaked(work, home, "fulllock", serving=False)


def test_down_on_a_full_disk_stops_the_engine(tmp_path: Path, small_disk: tuple[SSHD, Path]) -> None:
    sshd, work = small_disk
    home, env = tmp_path / "h", secret_env()
    prof = write_profile(tmp_path, sshd, name="fulldown", env=ENV, workdir=work)
    assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
    filler = fill(work)
    try:
        down = deploy("down", str(prof), home=home, env=env)
        assert down.returncode == 0, down.stderr
        assert_lock_free(work, "fulldown")
        assert_nothing_leaked(work, home, "fulldown", serving=False)
    finally:
        filler.unlink()
        deploy("down", str(prof), home=home, env=env)


def test_first_up_onto_a_full_disk_fails_with_one_line_and_leaves_nothing(
        tmp_path: Path, small_disk: tuple[SSHD, Path]) -> None:
    sshd, work = small_disk
    home, env = tmp_path / "h", secret_env()
    work.mkdir()
    filler = fill(work)
    prof = write_profile(tmp_path, sshd, name="fullfirst", env=ENV, workdir=work)
    proc = deploy("up", str(prof), "--skip-preflight", home=home, env=env)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr  # the target's code, never 3's
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert not list(work.rglob("*.part")), "half-written uploads left behind"
    assert_lock_free(work, "fullfirst")
    assert_nothing_leaked(work, home, "fullfirst", serving=False)
    filler.unlink()


def test_a_full_disk_is_named_as_such(tmp_path: Path, small_disk: tuple[SSHD, Path]) -> None:
    sshd, work = small_disk
    work.mkdir()
    filler = fill(work)
    prof = write_profile(tmp_path, sshd, name="fullname", env=ENV, workdir=work)
    try:
        proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h", env=secret_env())
        assert proc.returncode == 4, (proc.returncode, proc.stderr)
        assert "space" in proc.stderr.strip().splitlines()[-1].lower(), proc.stderr
    finally:
        filler.unlink()


def test_a_new_version_on_a_nearly_full_disk_keeps_the_old_one_serving(
        tmp_path: Path, small_disk: tuple[SSHD, Path]) -> None:
    sshd, work = small_disk
    home, env = tmp_path / "h", secret_env()
    prof = write_profile(tmp_path, sshd, name="fullnew", env=ENV, workdir=work)
    assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
    before = status_of(prof, home, env)
    filler = fill(work, leave=32 << 10)  # room to take the lock and refresh the supervisor, not for a new run
    try:
        proc = deploy("up", str(prof), "--skip-preflight", "--set", "engine.args.enable_metrics=true", home=home,
                      env=env)
        assert proc.returncode == 4 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
        after = status_of(prof, home, env)
        assert after["healthy"] and after["pid"] == before["pid"] and after["run_dir"] == before["run_dir"]
        assert_lock_free(work, "fullnew")
    finally:
        filler.unlink()
        deploy("down", str(prof), home=home, env=env)


def test_a_disk_that_fills_just_after_the_push_is_named_a_full_disk(
        tmp_path: Path, small_disk: tuple[SSHD, Path]) -> None:
    """Issue 22 (7): the disk fills between the push and the start: the old version is stopped, the new one and the
    restore of the old both die. The exit code is the target's (4), not the connection's (3), and the one line says
    the disk is full and what to do, not "exit code None"."""
    sshd, work = small_disk
    home, env = tmp_path / "h", secret_env()
    prof = write_profile(tmp_path, sshd, name="fullafter", env=ENV, workdir=work)
    assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
    up = start_deploy("up", str(prof), "--skip-preflight", "--json", "--set", "engine.args.enable_metrics=true",
                      home=home, env=env)
    filler = None
    try:
        got = wait_for_event(up, '"event": "pushed"')
        filler = fill(work)
        out, err = up.communicate(timeout=180)
        text = err.decode()
        last = text.strip().splitlines()[-1]
        assert up.returncode == 4, (up.returncode, text[-3000:], (got + out)[-3000:])
        assert "Traceback" not in text and "exit code None" not in text, text[-3000:]
        assert last.startswith("error: ") and "no space left" in last.lower() and "free" in last.lower(), last
    finally:
        if up.poll() is None:
            up.kill()
        if filler is not None:
            filler.unlink()
        deploy("down", str(prof), home=home, env=env)
