"""Red team, issue #34 findings 3-5 on a single host: the replace window.

- kill -9 of `up` inside the stop of the version that serves: `deploy status` never says `stopping` with exit 8 (a
  `down`'s code) while that stop finishes on the target; the stop's reason is in the state from its first moment
  (`replacing`, exit 6), then `interrupted` (5) or serving again.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from deploy_helpers import deploy  # noqa: E402
from faultbed import assert_lock_free, current_run, start_deploy, wait_for_event  # noqa: E402
from test_interrupts import STOPPING, replace_pair, status, wait_serving  # noqa: E402

pytestmark = pytest.mark.integration


def _state(run: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run / "state.json").read_text() or "{}"))
    except (OSError, ValueError):
        return {}


def test_status_after_a_kill_inside_the_stop_of_a_replace_never_says_stopped(tmp_path: Path, sshd: Any) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", "replace-kill-status"
    v1, v2 = replace_pair(tmp_path, sshd, name)
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    old_run = current_run(work, name)
    assert old_run is not None
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home)
    try:
        wait_for_event(up, STOPPING)
        deadline = time.monotonic() + 10
        while _state(old_run).get("status") != "stopping" and time.monotonic() < deadline:
            time.sleep(0.05)
        during = _state(old_run)  # v1 drains for 3 s: its supervisor is inside the stop
        assert during.get("status") == "stopping" and during.get("stopped_for") == "replace", during
        up.send_signal(signal.SIGKILL)
        up.communicate(timeout=10)
    finally:
        if up.poll() is None:
            up.kill()
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code, st = status(v1, home)
        seen.append((code, str(st.get("status"))))
        if code == 0:
            break
    assert seen[-1][0] == 0, seen  # the guard brought v1 back
    assert all(code != 8 and word not in ("stopping", "stopped") for code, word in seen), seen
    assert all(code == 6 for code, word in seen if word == "replacing"), seen
    assert any(word in ("replacing", "interrupted", "starting", "running") for _, word in seen[:-1]), seen
    assert_lock_free(work, name)
    assert deploy("down", str(v1), home=home).returncode == 0
    assert status(v1, home)[0] == 8
