"""Red team, issue #34 finding 3 for a two-node group: two Ctrl-C 0.3 s apart inside the stop of a group replace.

The first interrupt starts the bring-back of the stopped version on every node; the second cuts it short. The same
rules as a single host (test_redteam_interrupts.py): no node's guard is disarmed as if the client had finished, and
the group serves the old version again within stop + load + 10 s (+ the guard's look) with no further command."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from deploy_helpers import deploy  # noqa: E402
from faultbed import assert_lock_free, guard_of, start_deploy, wait_for_event  # noqa: E402
from hostbed import HostBed  # noqa: E402
from test_nodes_interrupts import STOPPING, currents, group_status, two_versions  # noqa: E402
from test_nodes_up import bed  # noqa: E402,F401 (the two-host bed fixture)

from deployer.supervisor.base import pid_alive  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
NAME = "two-node"


def test_a_second_ctrl_c_inside_the_stop_of_a_group_replace_never_skips_the_guards(tmp_path: Path,
                                                                                   bed: HostBed) -> None:
    home = tmp_path / "home"
    v1, v2 = two_versions(tmp_path, bed)
    began = time.monotonic()
    assert deploy("up", str(v1), home=home, timeout=150).returncode == 0
    load_s = time.monotonic() - began
    old = currents(bed)
    up = start_deploy("up", str(v2), "--json", home=home)
    try:
        wait_for_event(up, STOPPING, timeout=60)
        guards = [guard_of(h.workdir, NAME) for h in bed.hosts]
        time.sleep(0.5)  # inside the stop (rank 0 drains for 3 s)
        up.send_signal(signal.SIGINT)
        time.sleep(0.3)
        up.send_signal(signal.SIGINT)  # cuts the bring-back short
        sent = time.monotonic()
        out, err = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
    text = out.decode() + err.decode()
    assert up.returncode == 130 and "Traceback" not in text, text[-3000:]
    bound = 3 + load_s + 10 + 10  # the stop, a load, 10 s, and the guards' look at a client gone (their poll)
    code, rows = group_status(v1, home)
    while not (code == 0 and all(r["status"] == "ready" for r in rows)) and time.monotonic() < sent + bound:
        time.sleep(0.5)
        code, rows = group_status(v1, home)
    assert code == 0 and all(r["status"] == "ready" for r in rows), (code, rows, time.monotonic() - sent)
    assert currents(bed) == old
    for host, guard in zip(bed.hosts, guards):
        log_path = host.workdir / NAME / "repair.log"
        log = log_path.read_text() if log_path.exists() else ""
        assert "disarmed: the client finished the replace\n" not in log, log
        deadline = time.monotonic() + 15
        while pid_alive(guard) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(guard), log
        assert_lock_free(host.workdir, NAME)
    assert deploy("down", str(v1), home=home).returncode == 0
