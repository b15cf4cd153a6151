"""Rolling restart and upgrade of a fleet behind the real router (smg): requests keep being answered.

A client sends requests through the router for the whole rolling restart and counts failures (target 0), and no
replica's engine answers a request with its shutting-down 503 (it was out of the router before it was stopped);
the router never has fewer than N-1 healthy workers. An upgrade whose new version cannot start stops the rollout at
that replica, brings its previous version back into the router, and leaves the others as they were (exit 9).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import events
from fleet_helpers import chat, fleet_deploy, fleet_profile, get_json
from hostbed import HostBed, host_bed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]
CLIENT_LIMIT_S = 300.0
CLIENTS = 3
# As hard as a real fleet: answers take time (requests are in flight when a replica is stopped), and an engine
# takes seconds to go after SIGTERM and refuses new requests meanwhile (503). smg keeps its default retries, as in
# production: they are also its defence against a send that fails before any answer (smg PR #2162: a pooled
# connection lost in a race; with --disable-retries CI saw one such 500 while both engines served). What deployer
# must do, take a replica out of the router before stopping it, is checked where it shows: no engine ever answers
# a completion with its shutting-down 503 (`_turned_away`).
HARD_WORLD = {"STANDIN_CHAT_DELAY_S": "0.2", "STANDIN_DRAIN_S": "1.5"}
ROUTER_ARGS = {"health_check_interval_secs": 1}
SHUTTING_DOWN = '"POST /v1/chat/completions HTTP/1.1" 503'


@dataclass
class Client:
    """Requests through the router, one after another, until stopped (bounded by CLIENT_LIMIT_S)."""

    addr: str
    port: int
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    fewest_healthy: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        end = time.monotonic() + CLIENT_LIMIT_S
        while not self.stop.is_set() and time.monotonic() < end:
            try:
                answer = chat(self.addr, self.port, timeout=15)
                if answer["choices"][0]["message"]["content"]:
                    self.ok += 1
                else:
                    self.failures.append("empty answer")
            except Exception as exc:  # noqa: BLE001 (every failure counts, whatever it is)
                self.failures.append(f"{time.time():.3f} {type(exc).__name__}: {exc}")
            code, ready = get_json(f"http://{self.addr}:{self.port}/readiness", timeout=5)
            healthy = ready.get("healthy_workers", 0) if isinstance(ready, dict) else 0
            self.fewest_healthy = healthy if self.fewest_healthy is None else min(self.fewest_healthy, healthy)
            time.sleep(0.02)


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


class Clients:
    """CLIENTS clients at once, each a thread; `stop()` ends them (each is bounded by CLIENT_LIMIT_S anyway)."""

    def __init__(self, bed: HostBed, data: dict[str, Any]) -> None:
        self.clients = [Client(bed.hosts[0].addr, data["router"]["port"]) for _ in range(CLIENTS)]
        self.threads = [threading.Thread(target=c.run, daemon=True) for c in self.clients]
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for client in self.clients:
            client.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    @property
    def ok(self) -> int:
        return sum(c.ok for c in self.clients)

    @property
    def failures(self) -> list[str]:
        return [f for c in self.clients for f in c.failures]

    @property
    def fewest_healthy(self) -> int | None:
        seen = [c.fewest_healthy for c in self.clients if c.fewest_healthy is not None]
        return min(seen) if seen else None


def _hard_profile(tmp_path: Path, bed: HostBed, name: str) -> tuple[Path, dict[str, Any]]:
    prof, data = fleet_profile(tmp_path, bed, name=name, env=HARD_WORLD)
    data["router"]["args"] = ROUTER_ARGS
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    return prof, data


def _turned_away(tmp_path: Path) -> list[str]:
    """Completions a replica's engine refused because it was shutting down: each one a request the router sent to
    a replica deployer was stopping (smg's retry would hide it from the client)."""
    logs = sorted((tmp_path / "hosts").glob("*/work/*/runs/*/engine.log"))
    assert logs, "no engine logs found"
    return [f"{log}: {line.strip()}" for log in logs
            for line in log.read_text(errors="replace").splitlines() if SHUTTING_DOWN in line]


def _pids(bed: HostBed, home: Path, prof: Path) -> list[int]:
    import json

    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    return [int(r["pid"]) for r in json.loads(st.stdout)["replicas"]]


@pytest.mark.slow("drains each replica behind the real router under a client's load, one after the other")
def test_rolling_restart_through_the_real_router_loses_no_request(tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    prof, data = _hard_profile(tmp_path, bed, "roll")
    up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    before = _pids(bed, home, prof)
    client = Clients(bed, data)
    try:
        time.sleep(1.0)
        before_restart = client.ok
        restart = fleet_deploy(bed, "restart", str(prof), "--json", home=home, timeout=300)
        during = client.ok - before_restart  # answered while the restart ran (not the warm-up's)
        time.sleep(1.0)
    finally:
        client.stop()
    assert restart.returncode == 0, restart.stderr[-3000:]
    evs = events(restart.stdout)
    report = evs[-1]
    assert report["mode"] == "rolling" and [r["status"] for r in report["replicas"]] == ["ready", "ready"], report
    # one replica at a time: r0 left the router and came back before r1 left
    order = [(e["member"], e["message"].split(" ")[0]) for e in evs
             if e["event"] == "info" and ("out of the router" in e["message"] or "back in" in e["message"])]
    assert order == [("r0", "taking"), ("r0", "r0"), ("r1", "taking"), ("r1", "r1")], order
    after = _pids(bed, home, prof)
    assert all(a != b for a, b in zip(after, before)), (before, after)   # every engine was really restarted
    assert client.failures == [], client.failures[:5]
    assert _turned_away(tmp_path) == [], _turned_away(tmp_path)[:5]
    assert during >= 10, (during, client.ok)
    assert client.fewest_healthy is not None and client.fewest_healthy >= 1   # never below N-1 of 2
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


@pytest.mark.slow("a fleet up, then a rollout whose first replica crashes at start, is diagnosed and is rolled back under load")
def test_an_upgrade_that_will_not_start_stops_the_rollout_and_rolls_that_replica_back(
        tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    prof, data = _hard_profile(tmp_path, bed, "upg")
    assert fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home).returncode == 0
    before = _pids(bed, home, prof)
    data["engine"]["env"]["STANDIN_MODE"] = "crash"          # the new version dies at start, no known change
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    client = Clients(bed, data)
    try:
        up = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home, timeout=300)
    finally:
        client.stop()
    assert up.returncode == 9, up.stderr[-3000:]
    evs = events(up.stdout)
    report = next(e for e in evs if e["event"] == "report")
    first, second = report["replicas"]
    assert first["status"] == "failed" and first["restored"]["status"] == "ready", first
    assert first["diagnosis"] is not None                      # why, from the replica's own diagnosis
    assert second["status"] == "left-running"                  # the rollout stopped before it
    assert "rollout stopped at r0@node-0" in " ".join(report["notes"])
    assert sorted(report["router"]["workers"]) == sorted([first["url"], second["url"]])
    assert evs[-1]["event"] == "error" and evs[-1]["code"] == 9
    assert client.failures == [], client.failures[:5]
    assert _turned_away(tmp_path) == [], _turned_away(tmp_path)[:5]
    assert client.fewest_healthy is not None and client.fewest_healthy >= 1
    after = _pids(bed, home, prof)
    assert after[1] == before[1]                               # r1 untouched
    st = fleet_deploy(bed, "status", str(prof), home=home)
    assert st.returncode == 0, st.stdout + st.stderr           # everything serves the previous version
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


def test_a_fleet_without_router_is_updated_one_replica_at_a_time(tmp_path: Path, bed: HostBed) -> None:
    """Behind a balancer of the user's own: an `up` of a changed profile never stops every replica at once."""
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, name="norouter", router=False, env=HARD_WORLD)
    first = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home)
    assert first.returncode == 0, first.stderr[-3000:]
    assert events(first.stdout)[-1]["mode"] == "fan-out"
    endpoints = [(h.addr, e["engine_port"]) for h, e in zip(bed.hosts, data["replicas"])]
    data["engine"]["args"] = {"max_running_requests": 32}          # a new version
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    both_down, samples, stop = [0], [0], threading.Event()

    def watch() -> None:
        end = time.monotonic() + CLIENT_LIMIT_S
        while not stop.is_set() and time.monotonic() < end:
            up_now = [get_json(f"http://{a}:{p}/health", timeout=2)[0] == 200 for a, p in endpoints]
            samples[0] += 1
            both_down[0] += not any(up_now)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        update = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home, timeout=300)
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert update.returncode == 0, update.stderr[-3000:]
    assert samples[0] > 20 and both_down[0] == 0, (samples, both_down)
    report = events(update.stdout)[-1]
    assert report["mode"] == "rolling" and [r["status"] for r in report["replicas"]] == ["ready", "ready"]
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


@pytest.mark.slow("a rolling up, then its rollback: each replica drained and started in turn")
def test_rolling_rollback_of_a_fleet(tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    prof, data = _hard_profile(tmp_path, bed, "back")
    assert fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home).returncode == 0
    v1 = _hashes(bed, home, prof)
    client = Clients(bed, data)
    try:
        # nothing to go back to yet: r0 is left serving (back in the router), the rollout stops, exit 9
        early = fleet_deploy(bed, "rollback", str(prof), "--json", home=home, timeout=300)
        data["engine"]["args"] = {"max_running_requests": 32}
        prof.write_text(yaml.safe_dump(data, sort_keys=False))
        upgrade = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home, timeout=300)
        v2 = _hashes(bed, home, prof)
        back = fleet_deploy(bed, "rollback", str(prof), "--json", home=home, timeout=300)
    finally:
        client.stop()
    assert early.returncode == 9, early.stderr[-2000:]
    first = events(early.stdout)[-2]
    assert first["event"] == "report" and first["replicas"][0]["status"] == "left-running", first
    assert "no run of another version ever reached ready" in first["replicas"][0]["error"]
    assert first["replicas"][1]["status"] == "left-running" and first["router"]["status"] == "ready"
    assert upgrade.returncode == 0 and events(upgrade.stdout)[-1]["mode"] == "rolling", upgrade.stderr[-2000:]
    assert back.returncode == 0, back.stderr[-2000:]
    assert all(a != b for a, b in zip(v1, v2)) and _hashes(bed, home, prof) == v1
    assert client.failures == [], client.failures[:5]
    assert _turned_away(tmp_path) == [], _turned_away(tmp_path)[:5]
    assert client.fewest_healthy is not None and client.fewest_healthy >= 1
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


def _hashes(bed: HostBed, home: Path, prof: Path) -> list[str]:
    import json

    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    return [str(r["content_hash"]) for r in json.loads(st.stdout)["replicas"]]
