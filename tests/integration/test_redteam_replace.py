"""Red team, issue #34 findings 3-5 on a single host: the replace window.

- kill -9 of `up` inside the stop of the version that serves: `deploy status` never says `stopping` with exit 8 (a
  `down`'s code) while that stop finishes on the target; the stop's reason is in the state from its first moment
  (`replacing`, exit 6), then `interrupted` (5) or serving again.
- Another user (the real `nobody`, setpriv) binds the engine port the moment the old version releases it: `up`
  fails naming the holder (pid, user), and the old version comes back as soon as the port is free again (the
  target's guard stays armed: it disarms only once it sees for itself that something serves). The same with a
  Ctrl-C inside the stop, whose bring-back finds the port taken: the client's word that it finished is not
  believed while nothing serves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

import yaml  # noqa: E402

from deploy_helpers import deploy  # noqa: E402
from faultbed import assert_lock_free, current_run, guard_of, start_deploy, wait_for_event  # noqa: E402
from test_interrupts import STOPPING, replace_pair, status, wait_serving  # noqa: E402

from deployer.supervisor.base import pid_alive  # noqa: E402

pytestmark = pytest.mark.integration
NOBODY = 65534
SQUAT_S = 90  # how long the stand-in squatter tries to bind before it gives up

# A stand-in squatter: binds 127.0.0.1:PORT the moment it is free (a few ms after the old engine let it go), then
# answers every GET with 200 ("healthy") until killed.
SQUATTER = """
import http.server, sys, time
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"squatted\\n")
    def log_message(self, *args):
        pass
end = time.monotonic() + float(sys.argv[2])
while True:
    try:
        server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer)
        break
    except OSError:
        if time.monotonic() > end:
            sys.exit(1)
        time.sleep(0.005)
print("bound", flush=True)
server.serve_forever()
"""


class RacingSquatter:
    """nobody's process that takes `port` as soon as it is free."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "/usr/bin/python3", "-c",
             SQUATTER, str(port), str(SQUAT_S)], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def bound(self, timeout: float) -> bool:
        import select
        assert self.proc.stdout is not None
        return bool(select.select([self.proc.stdout], [], [], timeout)[0]) and \
            self.proc.stdout.readline().strip() == b"bound"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=5)


@pytest.fixture()
def squatters() -> Iterator[list[RacingSquatter]]:
    made: list[RacingSquatter] = []
    try:
        yield made
    finally:
        for s in made:
            s.stop()


needs_nobody = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                  reason="the squatter is another user: root (the victim) and setpriv (nobody)")


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


def _port(prof: Path) -> int:
    return int(yaml.safe_load(prof.read_text())["engine"]["port"])


def _back_after_the_squatter(v1: Path, home: Path, work: Path, name: str, old_run: Path,
                             squatter: RacingSquatter) -> None:
    """While the squatter holds the port nothing is called serving and the guard waits (the lock free: on-call
    may act); once it leaves, the guard starts the old version again and records it."""
    guard = guard_of(work, name, timeout=2)
    assert_lock_free(work, name)
    code, st = status(v1, home)
    assert code == 5 and st["status"] == "interrupted" and not st["serving"], (code, st)
    squatter.stop()
    began = time.monotonic()
    st = wait_serving(v1, home, timeout=45)
    assert Path(st["run_dir"]) == old_run and current_run(work, name) == old_run, st
    log = (work / name / "repair.log").read_text()
    assert "nothing serves: still armed" in log and "of user nobody" in log and "repaired: started the previous" \
        in log, log
    deadline = time.monotonic() + 10
    while pid_alive(guard) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(guard), log
    assert_lock_free(work, name)
    assert time.monotonic() - began < 45


@needs_nobody
@pytest.mark.slow("the port wait twice (15 s: the new version's start, then the bring-back), then the guard's start")
def test_a_port_squatted_in_the_replace_window_names_its_holder_and_the_old_version_comes_back(
        tmp_path: Path, sshd: Any, squatters: list[RacingSquatter]) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", "replace-squat"
    v1, v2 = replace_pair(tmp_path, sshd, name)
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    old_run = current_run(work, name)
    assert old_run is not None
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home)
    try:
        wait_for_event(up, STOPPING)
        squatters.append(RacingSquatter(_port(v1)))
        assert squatters[0].bound(20), "the squatter never got the port"
        out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    text = err.decode()
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert up.returncode == 4 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert f"pid {squatters[0].proc.pid}" in errors[0] or "of user nobody" in errors[0], errors[0]
    assert "of user nobody" in errors[0] and "guard starts it again" in errors[0], errors[0]
    _back_after_the_squatter(v1, home, work, name, old_run, squatters[0])
    assert deploy("down", str(v1), home=home).returncode == 0


@needs_nobody
@pytest.mark.slow("the bring-back's port wait (15 s), then the guard's start once the squatter leaves")
def test_a_ctrl_c_whose_bring_back_finds_the_port_squatted_leaves_the_guard_armed(
        tmp_path: Path, sshd: Any, squatters: list[RacingSquatter]) -> None:
    home, work, name = tmp_path / "h", tmp_path / "work", "replace-squat-intr"
    v1, v2 = replace_pair(tmp_path, sshd, name)
    assert deploy("up", str(v1), "--skip-preflight", home=home).returncode == 0
    old_run = current_run(work, name)
    assert old_run is not None
    up = start_deploy("up", str(v2), "--json", "--skip-preflight", home=home)
    try:
        wait_for_event(up, STOPPING)
        squatters.append(RacingSquatter(_port(v1)))
        time.sleep(0.5)  # inside the stop (v1 drains for 3 s)
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, err.decode()[-3000:]
    assert "bringing back the stopped version failed" in out.decode() + err.decode()
    assert _state(old_run).get("stopped_for") == "replace", _state(old_run)  # never a down's `stopped`
    log = (work / name / "repair.log").read_text()
    assert "disarmed:" not in log, log  # the client's word is not taken while nothing serves
    _back_after_the_squatter(v1, home, work, name, old_run, squatters[0])
    assert deploy("down", str(v1), home=home).returncode == 0
