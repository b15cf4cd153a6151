"""The repair guard disarms only on what it sees itself (issue #34): a client that removes the intent while nothing
of the deployment runs is not believed (the guard stays armed and writes the intent back); `current`'s run up under
a live supervisor, or a client's `left_stopped` word (`--no-rollback`), is. A port another user squatted in the
replace window is waited for without the lock (on-call may `down` meanwhile), its holder logged, before the repair.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, Callable

import pytest

from deployer.supervisor import guard
from deployer.supervisor.guard import Guard
from deployer.supervisor.protocol import INTENT
from deployer.supervisor.lease import acquire, update
from test_repair_guard import dead_pid, deployment


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "POLL_S", 0.01)
    monkeypatch.setattr(guard, "REPAIR_WAIT_S", 0.05)
    monkeypatch.setattr(guard, "LIFE_S", 5.0)


def _clock(at: dict[int, Callable[[], None]]) -> Callable[[], float]:
    """A monotonic clock that runs `at[n]` on its n-th reading (the guard reads it once or twice a poll)."""
    import time
    calls = [0]

    def clock() -> float:
        calls[0] += 1
        if calls[0] in at:
            at[calls[0]]()
        return time.monotonic()
    return clock


def _repairs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    done: list[str] = []
    monkeypatch.setattr(Guard, "repair", lambda self, intent, token: done.append(token) or "repaired")
    return done


def _status(monkeypatch: pytest.MonkeyPatch, **state: Any) -> None:
    monkeypatch.setattr(guard, "status_of", lambda run: dict(state))


def _holder_dies(root: Path) -> Callable[[], None]:
    def die() -> None:
        lease = json.loads((root / "lock").read_text())
        lease["holder_pid"] = dead_pid()
        (root / "lock").write_text(json.dumps(lease))
    return die


def test_a_disarm_while_nothing_serves_is_not_believed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = deployment(tmp_path, "client", os.getpid())
    (root / "current").symlink_to("runs/r1")
    _status(monkeypatch, status="stopped", alive=False, supervisor_alive=False)
    repaired = _repairs(monkeypatch)
    intent = root / INTENT
    said = Guard(str(root), frozenset({"client"})).watch(_clock({3: intent.unlink, 12: _holder_dies(root)}))
    assert said == "repaired" and repaired == ["client"], said
    assert json.loads(intent.read_text())["guard_pid"] == os.getpid()  # written back: a guard is armed


def test_a_disarm_while_current_runs_is_believed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = deployment(tmp_path, "client", os.getpid())
    (root / "current").symlink_to("runs/r1")
    _status(monkeypatch, status="starting", alive=True, supervisor_alive=True)
    repaired = _repairs(monkeypatch)
    said = Guard(str(root), frozenset({"client"})).watch(_clock({3: (root / INTENT).unlink}))
    assert said == "disarmed: r1 is starting under its supervisor (checked by the guard)" and not repaired, said


def test_a_run_whose_supervisor_is_dead_is_not_serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = deployment(tmp_path, "client", os.getpid())
    (root / "current").symlink_to("runs/r1")
    _status(monkeypatch, status="ready", alive=True, supervisor_alive=False)
    repaired = _repairs(monkeypatch)
    said = Guard(str(root), frozenset({"client"})).watch(_clock({3: (root / INTENT).unlink,
                                                                 12: _holder_dies(root)}))
    assert said == "repaired" and repaired == ["client"], said


def test_a_client_that_leaves_it_stopped_on_purpose_is_believed(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root = deployment(tmp_path, "client", os.getpid())
    _status(monkeypatch, status="stopped", alive=False, supervisor_alive=False)
    repaired = _repairs(monkeypatch)

    def left() -> None:
        (root / INTENT).write_text(json.dumps({"left_stopped": "--no-rollback"}))
    said = Guard(str(root), frozenset({"client"})).watch(_clock({3: left}))
    assert said == "disarmed: left stopped, as the client decided (--no-rollback)" and not repaired, said


def test_a_squatted_port_is_waited_for_without_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    root = deployment(tmp_path, "client", os.getpid())
    squat = socket.socket()
    squat.bind(("127.0.0.1", 0))
    squat.listen()
    port = squat.getsockname()[1]
    intent = json.loads((root / INTENT).read_text())
    (root / INTENT).write_text(json.dumps(dict(intent, ports=[port])))
    fd, _ = acquire(str(root / "lock"), {"owner": "a@b"}, "client", 30.0, "take")
    update(fd, "client", 30.0, release=True)  # the client left (a second Ctrl-C), the replace not finished
    os.close(fd)
    _status(monkeypatch, status="interrupted", alive=False, supervisor_alive=False)
    seen: list[Any] = []

    def look() -> None:
        seen.append(json.loads((root / "lock").read_text()).get("token"))

    def leave() -> None:
        look()
        squat.close()
    repaired = _repairs(monkeypatch)
    said = Guard(str(root), frozenset({"client"})).watch(_clock({6: look, 12: leave}))
    assert said == "repaired" and repaired == [""], said
    assert seen == [None, None], seen  # nobody holds the lock while the guard waits
    log = capsys.readouterr().out
    assert f"not repaired yet: port {port} is held by pid {os.getpid()}" in log, log
