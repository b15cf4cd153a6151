"""A hung target *through the helper* (issue 22, 10): the command's target-side helper SIGSTOPped (the box
swapping to death, a cgroup frozen) while `status` asks it, while `up` watches through it and while `logs -f`
follows through it. Each command ends in bounded time with one clear error line and a non-zero exit; nothing
waits forever on a helper that never answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import REPO, deploy, write_profile
from deployer.remote.program import payload_bundle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.slow("waits out what a user waits: the lease (30 s) and the 60 s answer bound")]

BOUND_S = 150.0  # measured: status 37 s, up 84 s (the lease's 30 s, then its clean-up), logs -f 63 s; plus a loaded box


def descends(pid: int, root: int) -> bool:
    for _ in range(64):
        if pid == root:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def helpers(sshd: Any) -> set[int]:
    """The helper processes (by their program's cached file name) that this sshd runs now, by host pid."""
    marker = f"helper-{payload_bundle()[1]}.py".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read() and descends(int(entry), sshd.proc.pid):
                        found.add(int(entry))
            except OSError:
                continue
    return found


@contextmanager
def stopping_new_helpers(sshd: Any, before: set[int]) -> Iterator[list[int]]:
    """SIGSTOP every helper that was not running before as soon as it appears; SIGCONT them at the end."""
    stopped: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid in helpers(sshd) - before - set(stopped):
                try:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                except ProcessLookupError:
                    pass
            done.wait(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield stopped
    finally:
        done.set()
        thread.join(5)
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def start(*argv: str, home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "deployer.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home),
                                 "HOME": os.environ.get("HOME", "/root")})


def assert_one_clear_line(proc: subprocess.Popen[str], began: float, err: str, host: str) -> str:
    """Non-zero, within the bound, and one `error:` line that names the host."""
    took = time.monotonic() - began
    assert proc.returncode not in (0, None) and took < BOUND_S, (proc.returncode, took, err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and host in last, last
    return last


def sshd_host(prof: Path) -> str:
    target = yaml.safe_load(prof.read_text())["target"]
    return f"{target['host']}:{target['port']}"


@pytest.fixture()
def serving(tmp_path: Path, sshd: Any) -> Iterator[Path]:
    prof = write_profile(tmp_path, sshd, name="hungh")
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h").returncode == 0
    yield prof
    deploy("down", str(prof), home=tmp_path / "h")


def test_status_through_a_stopped_helper_ends_with_one_line(tmp_path: Path, sshd: Any, serving: Path) -> None:
    """Stopped as it starts, with status's snapshot request already sent with the exec."""
    with stopping_new_helpers(sshd, helpers(sshd)) as stopped:
        began = time.monotonic()
        proc = start("status", str(serving), home=tmp_path / "h")
        out, err = proc.communicate(timeout=BOUND_S + 30)
        assert stopped, "no helper was stopped"
    print(assert_one_clear_line(proc, began, err, sshd_host(serving)), f"({time.monotonic() - began:.1f}s)")


def test_up_watching_through_a_stopped_helper_ends_with_one_line(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="hungw", env={"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.5"})
    home = tmp_path / "h"
    up = start("up", str(prof), "--skip-preflight", "--json", home=home)
    try:
        assert up.stdout is not None
        began = time.monotonic()
        got = ""
        while '"event": "phase"' not in got and time.monotonic() - began < 60:
            got += up.stdout.readline()
        assert '"event": "phase"' in got, got[-2000:]
        with stopping_new_helpers(sshd, set()) as stopped:
            began = time.monotonic()
            out, err = up.communicate(timeout=BOUND_S + 30)
            assert stopped, "no helper was stopped"
        print(assert_one_clear_line(up, began, err, sshd_host(prof)), f"({time.monotonic() - began:.1f}s)")
    finally:
        if up.poll() is None:
            up.kill()
        deploy("down", str(prof), home=home)


def test_logs_follow_through_a_stopped_helper_ends_with_one_line(tmp_path: Path, sshd: Any, serving: Path) -> None:
    proc = start("logs", str(serving), "-f", "-n", "3", home=tmp_path / "h")
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first, "logs -f printed nothing"
        with stopping_new_helpers(sshd, set()) as stopped:
            began = time.monotonic()
            out, err = proc.communicate(timeout=BOUND_S + 30)
            assert stopped, "no helper was stopped"
        print(assert_one_clear_line(proc, began, err, sshd_host(serving)), f"({time.monotonic() - began:.1f}s)")
    finally:
        if proc.poll() is None:
            proc.kill()
