"""Red team, issue #34 finding 3: two Ctrl-C 0.3 s apart inside the stop of a replace.

The first interrupt starts the clean-up that brings the stopped version back; the second cuts it short. The client
still disarmed the target's guard on its way out and released the lock, so the guard logged "disarmed: the client
finished the replace", which was false: nothing served. Now the client disarms only once its bring-back finished (a
cut-short one leaves the guard armed), and the guard finishes a replace whose lock was released while it was still
armed (a `--no-rollback` failure, which disarms, is left as the client decided: tests/integration/test_oncall.py)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from deploy_helpers import deploy  # noqa: E402
from faultbed import assert_lock_free, current_run, guard_of, start_deploy, wait_for_event  # noqa: E402
from test_interrupts import STOPPING, replace_pair, wait_serving  # noqa: E402

from deployer.supervisor.base import pid_alive  # noqa: E402

pytestmark = pytest.mark.integration


def test_a_second_ctrl_c_inside_the_stop_never_skips_the_guard(tmp_path: Path, sshd: Any) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", "intr-twice"
    v1, v2 = replace_pair(tmp_path, sshd, name)
    began = time.monotonic()
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    load_s = time.monotonic() - began
    old_run = current_run(work, name)
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home)
    try:
        wait_for_event(up, STOPPING)
        guard = guard_of(work, name)
        time.sleep(0.5)  # inside the stop (v1 drains for 3 s)
        up.send_signal(signal.SIGINT)
        time.sleep(0.3)
        up.send_signal(signal.SIGINT)  # cuts the bring-back short
        out, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, err.decode()[-3000:]
    st = wait_serving(v1, home, timeout=3 + load_s + 10 + 30)
    assert current_run(work, name) == old_run and st["run_dir"] == str(old_run), st
    log = (work / name / "repair.log").read_text()
    assert "disarmed: the client finished the replace\n" not in log, log
    deadline = time.monotonic() + 10
    while pid_alive(guard) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(guard), log
    assert_lock_free(work, name)
    assert deploy("down", str(v1), home=home).returncode == 0
