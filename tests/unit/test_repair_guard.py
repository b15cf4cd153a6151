"""The target-side repair guard (deployer/supervisor/guard.py) and the lease's `inherit` mode: the guard
acts only while the gone client's own lease holds the lock, and leaves when the replace was disarmed or the lock
was released, broken or taken by another. (Its repairs end to end: tests/integration/test_interrupts.py,
test_nodes_interrupts.py, test_fleet_interrupts.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployer.supervisor import guard
from deployer.supervisor.guard import Guard
from deployer.supervisor.protocol import INTENT
from deployer.supervisor.lease import Refused, acquire, read_lease


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def deployment(tmp_path: Path, token: str, holder_pid: int) -> Path:
    root = tmp_path / "demo"
    (root / "runs" / "r1").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    fd, _ = acquire(str(root / "lock"), {"owner": "a@b", "pid": 1, "host_id": "h", "command": "up"}, token, 30.0,
                    "take")
    os.close(fd)
    lease = json.loads((root / "lock").read_text())
    lease["holder_pid"] = holder_pid
    (root / "lock").write_text(json.dumps(lease))
    (root / INTENT).write_text(json.dumps({"old_run": str(root / "runs" / "r1"), "grace_s": 1, "port": None,
                                           "guard_pid": os.getpid()}))
    return root


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "POLL_S", 0.01)
    monkeypatch.setattr(guard, "REPAIR_WAIT_S", 0.05)
    monkeypatch.setattr(guard, "LIFE_S", 5.0)


def test_inherit_takes_the_lease_only_from_the_token_it_names(tmp_path: Path) -> None:
    root = deployment(tmp_path, "client", os.getpid())
    with pytest.raises(Refused) as refused:
        acquire(str(root / "lock"), {"owner": "g"}, "guard", 30.0, "inherit", "someone-else")
    assert refused.value.verdict == "lost"
    fd, info = acquire(str(root / "lock"), {"owner": "g"}, "guard", 30.0, "inherit", "client")
    assert info["reason"] == "client-gone" and read_lease(fd)["token"] == "guard"
    os.close(fd)
    events = (root / "lock-events.jsonl").read_text()
    assert '"reason": "client-gone"' in events and "client" not in json.loads(events)["from"].values()


def test_the_guard_leaves_when_the_replace_was_disarmed(tmp_path: Path) -> None:
    root = deployment(tmp_path, "client", dead_pid())
    (root / INTENT).unlink()
    assert Guard(str(root), frozenset({"client"})).watch().startswith("disarmed")


def test_the_guard_changes_nothing_once_another_holds_the_lock(tmp_path: Path) -> None:
    """A --break-lock (or a takeover) after the client died: the guard must not start anything."""
    root = deployment(tmp_path, "client", dead_pid())
    fd, _ = acquire(str(root / "lock"), {"owner": "x"}, "breaker", 30.0, "break")
    os.close(fd)
    said = Guard(str(root), frozenset({"client"})).watch()
    assert said.startswith("left: the lock is no longer the client's"), said
    assert (root / "current").exists() is False and json.loads((root / "lock").read_text())["token"] == "breaker"


def test_the_guard_waits_while_the_clients_lease_holder_lives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder (the client's helper on the target) alive: no repair, whatever the time; the guard's life ends."""
    root = deployment(tmp_path, "client", os.getpid())
    monkeypatch.setattr(guard, "LIFE_S", 0.3)
    repaired: list[str] = []
    monkeypatch.setattr(Guard, "repair", lambda self, intent, token: repaired.append(token) or "repaired")
    assert Guard(str(root), frozenset({"client"})).watch().startswith("left: the client did not finish")
    assert repaired == []


def test_the_guard_repairs_once_the_holder_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = deployment(tmp_path, "client", dead_pid())
    repaired: list[str] = []
    monkeypatch.setattr(Guard, "repair", lambda self, intent, token: repaired.append(token) or "repaired")
    assert Guard(str(root), frozenset({"client"})).watch() == "repaired"
    assert repaired == ["client"]


def test_a_repair_after_a_takeover_in_between_is_refused(tmp_path: Path) -> None:
    """The lock taken by another between the guard's look and its take: `inherit` refuses, nothing is done."""
    root = deployment(tmp_path, "client", dead_pid())
    fd, _ = acquire(str(root / "lock"), {"owner": "x"}, "other", 30.0, "break")
    os.close(fd)
    intent = json.loads((root / INTENT).read_text())
    said = Guard(str(root), frozenset({"client"})).repair(intent, "client")
    assert said == "left: the lock was lost before the repair could take it"
    assert not (root / "current").exists()


def test_a_repair_whose_lock_is_broken_meanwhile_stops_where_it_is(tmp_path: Path) -> None:
    """--break-lock while the guard waits for the port: it neither moves `current` nor starts anything."""
    root = deployment(tmp_path, "client", dead_pid())
    intent = dict(json.loads((root / INTENT).read_text()), ports=[1])

    def broken(ports: list[int]) -> int | None:
        fd, _ = acquire(str(root / "lock"), {"owner": "x"}, "breaker", 30.0, "break")
        os.close(fd)
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(guard, "_wait_ports", broken)
        said = Guard(str(root), frozenset({"client"})).repair(intent, "client")
    assert said.startswith("stopped: the lock was taken by x"), said
    assert not (root / "current").exists()
    assert json.loads((root / "lock").read_text())["token"] == "breaker"


def router_replace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_starts: str,
                   complete: bool = True) -> tuple[Path, list[str], str]:
    """A router's replace interrupted between the stop and the start (r1 old, r2 new; neither runs): which runs
    the repair starts, in order (`new_starts`: what starting r2 answers, "" when it reached ready), and its word."""
    root = deployment(tmp_path, "client", dead_pid())
    new = root / "runs" / "r2"
    new.mkdir(mode=0o700)
    for name in guard.RUN_FILES if complete else guard.RUN_FILES[:2]:
        (new / name).write_text("x")
    intent = dict(json.loads((root / INTENT).read_text()), new_run=str(new), ports=[])
    started: list[str] = []

    def start(self: Guard, run: str, token: str, intent: dict[str, object]) -> str:
        started.append(os.path.basename(run))
        return new_starts if run == str(new) else ""

    monkeypatch.setattr(Guard, "_start", start)
    monkeypatch.setattr(Guard, "_still_ours", lambda self: None)
    return root, started, Guard(str(root), frozenset({"client"}))._bring_back(intent, "guard")


def test_a_router_replace_is_finished_with_the_new_router_when_its_run_dir_is_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, started, said = router_replace(tmp_path, monkeypatch, "")
    assert started == ["r2"] and said == "started the new version r2 (the previous r1 stays stopped)", said


def test_a_router_replace_whose_new_run_dir_is_incomplete_starts_the_old_router_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, started, said = router_replace(tmp_path, monkeypatch, "", complete=False)
    assert started == ["r1"] and said == "started the previous version r1 again", said


def test_a_new_router_that_does_not_come_up_gives_way_to_the_old_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, started, said = router_replace(tmp_path, monkeypatch, "it is crashloop")
    assert started == ["r2", "r1"], started
    assert said == "the new version r2 did not come up (it is crashloop); started the previous version r1 again", said


def test_arm_refuses_a_new_run_that_is_the_old_one(tmp_path: Path) -> None:
    root = deployment(tmp_path, "client", os.getpid())
    run = str(root / "runs" / "r1")
    with pytest.raises(guard.SuperviseError, match="same run"):
        guard._replace_intent(str(root), {"old": run, "new": run, "grace": "1", "port": "8000,8001"})
    assert guard._replace_intent(str(root), {"old": run, "grace": "1", "port": "8000,8001"})["ports"] == \
        [8000, 8001]
