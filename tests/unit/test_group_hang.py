"""A rank that stops progressing while the others wait (issue 37 item 5), the supervisor's side: node 0's looks at
its followers run beside the daemon's loop (a frozen follower costs its HTTP timeout there, never the loop, so the
hang rule's clock goes on), a hung rank 0 names the followers that do not answer, and one end of the group is
recorded once (a group ended for a lost peer takes no stacks; a hung one is not also called a lost peer)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from deployer.diagnose.diagnosis import group_peer_lost, peer_lost_reason
from deployer.supervisor import group
from deployer.supervisor.daemon import Daemon
from deployer.supervisor.group import GroupWatch


class _Health(BaseHTTPRequestHandler):
    """A follower's dummy health: 200 at once, or (frozen) no answer until the client gives up."""

    frozen = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if self.frozen.is_set():
            time.sleep(1.0)   # longer than the watch's timeout in these tests: the look fails
            return
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def follower(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(group, "HTTP_TIMEOUT", 0.4)
    _Health.frozen.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        _Health.frozen.clear()
        server.shutdown()
        server.server_close()


def _leader(port: int) -> GroupWatch:
    return GroupWatch({"role": "leader", "every_s": 0.1, "misses": 3,
                       "followers": [{"rank": 1, "addr": "127.0.0.1", "port": port, "path": "/health"}]})


def test_a_frozen_follower_never_blocks_the_leaders_loop_and_is_named_silent_then_lost(follower: int) -> None:
    watch = _leader(follower)
    name = f"rank 1 at 127.0.0.1:{follower}"
    end = time.monotonic() + 3
    while name not in watch.seen and time.monotonic() < end:
        assert watch.lost(None) is None
        time.sleep(0.02)
    assert name in watch.seen and watch.silent() == []
    _Health.frozen.set()
    slowest, lost, silent_at = 0.0, None, None
    end = time.monotonic() + 5
    while lost is None and time.monotonic() < end:
        t0 = time.monotonic()
        lost = watch.lost(None)
        slowest = max(slowest, time.monotonic() - t0)
        if silent_at is None and watch.silent():
            silent_at = time.monotonic()
        time.sleep(0.02)
    assert lost == f"{name} stopped answering its health check"
    assert silent_at is not None and watch.silent() == [name]
    assert slowest < 0.1, slowest   # each call only reads the last round: the looks' timeouts are the thread's


def test_a_round_of_looks_of_the_engine_before_a_restart_is_dropped(follower: int) -> None:
    watch = _leader(follower)
    name = f"rank 1 at 127.0.0.1:{follower}"
    _Health.frozen.set()
    watch.seen.add(name)
    assert watch.lost(None) is None          # a round starts (it will fail)
    watch.reset()                            # a new engine meanwhile, seen answering
    watch.seen.add(name)
    time.sleep(0.6)                          # the old round ended (failed) by now
    watch.lost(None)
    assert watch.failed.get(name, 0) == 0 and watch.silent() == []


def _daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: dict[str, Any]) -> Daemon:
    monkeypatch.chdir(tmp_path)
    cfg = {"log": "engine.log", "group": group, "grace_s": 1, "restart": {"policy": "always"}}
    daemon = Daemon(str(tmp_path / "runs" / "r1"), cfg, {}, report_fd=-1)
    daemon.state["status"] = "ready"
    return daemon


def _record() -> dict[str, Any]:
    return {"reason": "1 running, 0 waiting and no engine step for 3 s (hang_s 3)"}


class _Hung:
    """A hang watch that says hung at once (what check_hang asks of it)."""

    def __init__(self) -> None:
        self.asked = 0

    def result(self) -> dict[str, Any]:
        self.asked += 1
        return _record()

    def due(self, now: float) -> bool:
        return False


def test_a_hung_rank0_names_the_followers_that_do_not_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = _daemon(tmp_path, monkeypatch, {"role": "leader", "followers": [
        {"rank": 1, "addr": "10.0.0.2", "port": 1}, {"rank": 2, "addr": "10.0.0.3", "port": 1}]})
    assert daemon.group is not None
    record = _record()
    daemon.group_view(record)
    assert record["silent_ranks"] == [] and record["reason"].endswith("; every other rank answers its health check")
    daemon.group.seen.update({"rank 1 at 10.0.0.2:1", "rank 2 at 10.0.0.3:1"})
    daemon.group.failed.update({"rank 1 at 10.0.0.2:1": 0, "rank 2 at 10.0.0.3:1": 1})
    record = _record()
    daemon.group_view(record)
    assert record["silent_ranks"] == ["rank 2 at 10.0.0.3:1"]
    assert record["reason"].endswith("(hang_s 3); rank 2 at 10.0.0.3:1 does not answer its health check")
    daemon.group.failed["rank 1 at 10.0.0.2:1"] = 2
    record = _record()
    daemon.group_view(record)
    assert record["reason"].endswith("rank 1 at 10.0.0.2:1, rank 2 at 10.0.0.3:1 do not answer their health checks")


def test_a_follower_hung_record_is_left_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = _daemon(tmp_path, monkeypatch, {"role": "follower", "leader": {"addr": "10.0.0.1", "port": 1}})
    record = _record()
    daemon.group_view(record)
    assert record == _record()


def test_a_group_ended_for_its_peer_is_not_also_hung_and_a_hung_one_not_also_a_lost_peer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = _daemon(tmp_path, monkeypatch, {"role": "leader", "followers": []})
    hung = _Hung()
    daemon.hang = hung  # type: ignore[assignment]
    daemon.peer_lost = "rank 1 at 10.0.0.2:1 stopped answering its health check"
    daemon.check_hang(time.monotonic())
    assert daemon.hung is None and hung.asked == 0     # no stacks of a group already being ended
    daemon.peer_lost = None
    daemon.hung = _record()
    assert daemon.group is not None
    monkeypatch.setattr(daemon.group, "lost", lambda pgid: "rank 1 at 10.0.0.2:1 stopped answering")
    daemon.check_group()
    assert daemon.peer_lost is None and daemon.state["peer_lost"] is None


def test_a_rank_stopped_for_its_group_is_diagnosed_as_such_not_as_a_kill() -> None:
    assert peer_lost_reason({"peer_lost": {"at": 1.0, "reason": "rank 0 at 10.0.0.1:5000 is gone"}}) == \
        "rank 0 at 10.0.0.1:5000 is gone"                       # state.json's record
    assert peer_lost_reason({"peer_lost": "rank 0 at 10.0.0.1:5000 is gone"}) == "rank 0 at 10.0.0.1:5000 is gone"
    assert peer_lost_reason({"peer_lost": None}) is None and peer_lost_reason({}) is None
    diag = group_peer_lost("rank 0 at 10.0.0.1:5000 is gone", "sglang")
    assert (diag.signature, diag.summary) == \
        ("group-peer-lost", "stopped for its group: rank 0 at 10.0.0.1:5000 is gone")
