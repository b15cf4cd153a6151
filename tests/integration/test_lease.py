"""The target-side lease program (deployer/supervisor/lease.py) under the real python3: take, busy, heartbeat,
release, a dropped client's lease kept for its re-take, expiry and takeover, --break, and the lock history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from payload import payload_program

pytestmark = pytest.mark.integration

LEASE = payload_program("supervise_lease.py")  # the program a deployment's root holds
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def holder(owner: str = "alice@laptop", pid: int = 111, command: str = "up", host_id: str = "laptop/boot") -> str:
    return json.dumps({"owner": owner, "pid": pid, "command": command, "host_id": host_id})


class Holder:
    """One lease program with its stdin open, like the one an SSH channel keeps."""

    def __init__(self, path: Path, token: str, lease: float = 2.0, mode: str = "take", who: str | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen([PY, str(LEASE), str(path), "--holder", who or holder(), "--token", token,
                                      "--lease", str(lease), "--mode", mode, *extra],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.word, _, payload = self.proc.stdout.readline().strip().partition(" ")
        self.info: dict[str, Any] = json.loads(payload) if payload else {}

    def say(self, word: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def hang_up(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=10)


def lease_of(path: Path) -> dict[str, Any]:
    out = subprocess.run([PY, str(LEASE), str(path), "--show"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    word, _, payload = out.stdout.strip().partition(" ")
    assert word == "LEASE"
    return dict(json.loads(payload))


def test_busy_shows_owner_and_timing_heartbeat_renews_release_frees(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dep" / "lock"
    first = Holder(path, "tok-a", lease=2)
    assert first.word == "LOCKED" and first.info["retaken"] is False and first.info["reason"] is None
    second = Holder(path, "tok-b", who=holder("bob@desk", 222, "down"))
    assert second.word == "BUSY" and second.proc.wait(timeout=5) == 75
    assert second.info["owner"] == "alice@laptop" and second.info["pid"] == 111 and second.info["command"] == "up"
    assert second.info["held"] and 0 < second.info["expires_in"] <= 2 and "token" not in second.info
    for _ in range(3):  # heartbeats keep it past the first lease
        time.sleep(0.9)
        assert first.say("HB").startswith("OK")
    assert Holder(path, "tok-b").word == "BUSY"
    assert first.say("RELEASE") == "RELEASED" and first.proc.wait(timeout=5) == 0
    assert lease_of(path)["held"] is False
    third = Holder(path, "tok-b")
    assert third.word == "LOCKED" and third.info["reason"] is None  # a released lock is no takeover
    third.say("RELEASE")
    assert not (tmp_path / "deep" / "dep" / "lock-events.jsonl").exists()


def test_a_dropped_client_keeps_its_lease_for_the_retake_and_others_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    first = Holder(path, "tok-a", lease=3)
    since = lease_of(path)["since"]
    assert first.hang_up() == 0  # EOF without RELEASE: the SSH connection dropped
    assert Holder(path, "tok-b").word == "BUSY"  # a `down` in the gap is refused
    again = Holder(path, "tok-a", lease=3, mode="retake")
    assert again.word == "LOCKED" and again.info["retaken"] is True
    assert lease_of(path)["since"] == since  # the same lease, not a new one
    assert again.say("HB").startswith("OK")
    again.say("RELEASE")
    lost = Holder(path, "tok-a", mode="retake")  # released (or taken) meanwhile: the retake must fail
    assert lost.word == "LOST" and lost.proc.wait(timeout=5) == 76


def test_an_expired_lease_is_taken_over_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    first = Holder(path, "tok-a", lease=2)
    time.sleep(2.3)  # no heartbeat: the holder is gone as far as anyone can tell (it waits two leases to exit)
    taker = Holder(path, "tok-b", who=holder("bob@desk", 222, "down"))
    assert taker.word == "LOCKED" and taker.info["reason"] == "expired"
    assert taker.info["previous"]["owner"] == "alice@laptop" and taker.info["previous"]["expires_in"] < 0
    assert first.say("HB").startswith("LOST") and first.proc.wait(timeout=5) == 76  # the old holder learns it
    events = [json.loads(line) for line in (tmp_path / "lock-events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["lock-taken-over"]
    assert events[0]["from"]["owner"] == "alice@laptop" and events[0]["by"]["owner"] == "bob@desk"
    taker.say("RELEASE")


def test_break_takes_a_live_lease_and_the_old_holder_is_told(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    first = Holder(path, "tok-a", lease=30)
    breaker = Holder(path, "tok-b", mode="break", who=holder("bob@desk", 222, "down"))
    assert breaker.word == "LOCKED" and breaker.info["reason"] == "broken"
    reply = first.say("HB")
    assert reply.startswith("LOST ") and json.loads(reply[5:])["owner"] == "bob@desk"
    assert first.proc.wait(timeout=5) == 76
    event = json.loads((tmp_path / "lock-events.jsonl").read_text().splitlines()[-1])
    assert event["event"] == "lock-broken" and event["from"]["pid"] == 111 and event["by"]["command"] == "down"
    breaker.say("RELEASE")


def test_replace_needs_the_exact_holder_and_a_silent_holder_exits_after_its_lease(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    first = Holder(path, "tok-a", lease=1.5)
    seen = Holder(path, "tok-b")
    assert seen.word == "BUSY"
    wrong = Holder(path, "tok-b", mode="replace", extra=("--from", json.dumps([999, "laptop/boot", seen.info["since"]])))
    assert wrong.word == "BUSY"
    ident = json.dumps([seen.info["pid"], seen.info["host_id"], seen.info["since"]])
    right = Holder(path, "tok-b", mode="replace", extra=("--from", ident))
    assert right.word == "LOCKED" and right.info["reason"] == "holder-gone"
    assert first.proc.wait(timeout=6) == 0  # heard nothing for two leases: gone, without touching the file
    assert lease_of(path)["owner"] == "alice@laptop" and right.say("HB").startswith("OK")
    right.say("RELEASE")


def test_bad_arguments_are_one_line_exit_2(tmp_path: Path) -> None:
    for args in ([], [str(tmp_path / "lock")], [str(tmp_path / "lock"), "--holder", "{", "--token", "t", "--lease", "1"],
                 [str(tmp_path / "lock"), "--holder", "{}", "--token", "t", "--lease", "1", "--mode", "steal"]):
        out = subprocess.run([PY, str(LEASE), *args], capture_output=True, text=True, timeout=10)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
