"""Issue 39 (item 2): `deploy up FLEET --canary` behind the real router (smg), stand-in engines over real sshd.

Clients send requests through the router for the whole rollout and count failures (target 0). A change that serves
as well as the old version is promoted to every replica; a release three times slower per token
(STANDIN_SLOWER_X, tests/standin/standin_metrics.py) is rolled back after the canary's window: the canary serves its
previous version again and the other replica was never touched. Each decision is in the report and in history (the
router host's rollouts.jsonl and the local history) with its numbers. The windows are a few seconds (the profile's
rollout.canary.window_s).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import events, history_events
from fleet_helpers import chat, fleet_deploy, fleet_profile
from hostbed import HostBed, host_bed
from sshbed import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]
CLIENT_LIMIT_S = 300.0
CLIENTS = 3
WORLD = {"STANDIN_CHAT_DELAY_S": "0.05", "STANDIN_DRAIN_S": "0.5"}
ROLLOUT = {"canary": {"window_s": 4, "min_requests": 8}}


@dataclass
class Clients:
    """CLIENTS threads sending chat completions through the router one after another until stopped (bounded)."""

    addr: str
    port: int
    ok: list[int] = field(default_factory=lambda: [0])
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Clients:
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]
        for thread in self.threads:
            thread.start()
        return self

    def _run(self) -> None:
        end = time.monotonic() + CLIENT_LIMIT_S
        while not self.stop.is_set() and time.monotonic() < end:
            try:
                answer = chat(self.addr, self.port, timeout=15)
                assert answer["choices"][0]["message"]["content"]
                self.ok[0] += 1
            except Exception as exc:  # noqa: BLE001 (every failure counts, whatever it is)
                self.failures.append(f"{time.time():.3f} {type(exc).__name__}: {exc}")
            time.sleep(0.01)

    def end(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


def _serving_fleet(tmp_path: Path, bed: HostBed, name: str) -> tuple[Path, dict[str, Any], Path]:
    prof, data = fleet_profile(tmp_path, bed, name=name, env=WORLD,
                               extra={"rollout": ROLLOUT})
    data["engine"]["args"] = {"enable_metrics": True}
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    home = tmp_path / "home"
    up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    return prof, data, home


def _status(bed: HostBed, home: Path, prof: Path) -> list[dict[str, Any]]:
    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    rows: list[dict[str, Any]] = json.loads(st.stdout)["replicas"]
    return rows


def _rollouts(bed: HostBed, name: str) -> list[dict[str, Any]]:
    path = bed.hosts[0].workdir / name / "rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _local_history(home: Path, name: str) -> list[dict[str, Any]]:
    return history_events(home, name, "canary")


def _canary_up(bed: HostBed, home: Path, prof: Path, data: dict[str, Any]) -> tuple[Any, Clients]:
    clients = Clients(bed.hosts[0].addr, data["router"]["port"]).start()
    try:
        time.sleep(1.0)
        run = fleet_deploy(bed, "up", str(prof), "--canary", "--json", "--skip-preflight", home=home, timeout=300)
        time.sleep(0.5)
    finally:
        clients.end()
    return run, clients


@pytest.mark.slow("a rolling canary behind the real router: the canary's window, then the other replica replaced")
def test_a_good_change_is_promoted_to_every_replica_with_its_numbers_in_history(tmp_path: Path,
                                                                                bed: HostBed) -> None:
    prof, data, home = _serving_fleet(tmp_path, bed, "good")
    before = _status(bed, home, prof)
    data["engine"]["env"]["STANDIN_CHAT_TEXT"] = "the new release answering"   # a new version, as fast
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    run, clients = _canary_up(bed, home, prof, data)
    assert run.returncode == 0, run.stderr[-3000:]
    report = events(run.stdout)[-1]
    assert report["mode"] == "canary" and report["outcome"] == "promoted", report
    assert [r["status"] for r in report["replicas"]] == ["ready", "ready"], report["replicas"]
    verdict = report["canary"]
    print("\n".join(f"{c['name']}: {c['passed']} {c['note']}" for c in verdict["checks"]))   # shown with -s
    assert verdict["decision"] == "promote" and verdict["canary"]["replica"] == 0
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["traffic"]["canary"] >= 8 and checks["itl_p99"]["passed"] and checks["ttft_p99"]["passed"]
    assert checks["tokens_per_s"]["canary"] > 0 and checks["tokens_per_s"]["baseline"] > 0
    after = _status(bed, home, prof)
    assert all(a["content_hash"] != b["content_hash"] for a, b in zip(after, before))   # both run the new one
    history = _rollouts(bed, "good")
    assert [(h["kind"], h["decision"]) for h in history] == [("canary-verdict", "promote"),
                                                             ("rollout-end", "promoted")]
    assert history[0]["numbers"]["checks"] == verdict["checks"]
    assert [(h["kind"], h["decision"]) for h in _local_history(home, "good")] == \
        [("canary-verdict", "promote"), ("rollout-end", "promoted")]
    assert clients.failures == [], clients.failures[:5]
    assert clients.ok[0] >= 20, clients.ok
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


@pytest.mark.slow("a canary behind the real router: its window, then its rollback through the router")
def test_a_release_three_times_slower_is_rolled_back_and_the_others_never_touched(tmp_path: Path,
                                                                                  bed: HostBed) -> None:
    prof, data, home = _serving_fleet(tmp_path, bed, "slow")
    before = _status(bed, home, prof)
    data["engine"]["env"]["STANDIN_SLOWER_X"] = "3"                 # the worse release: 3x slower per token
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    run, clients = _canary_up(bed, home, prof, data)
    assert run.returncode == 9, run.stderr[-3000:]
    report = next(e for e in events(run.stdout) if e["event"] == "report")
    assert report["mode"] == "canary" and report["outcome"] == "rolled-back", report
    first, second = report["replicas"]
    assert first["status"] == "rolled-back" and first["restored"]["status"] == "ready", first
    assert "the canary was rolled back: itl_p99: FAILED" in first["error"]
    assert second["status"] == "left-running", second
    print("\n".join(f"{c['name']}: {c['passed']} {c['note']}" for c in report["canary"]["checks"]))   # with -s
    itl = next(c for c in report["canary"]["checks"] if c["name"] == "itl_p99")
    assert itl["passed"] is False and itl["value"] > 1.5 and itl["canary"] > itl["baseline"], itl
    after = _status(bed, home, prof)
    assert after[0]["content_hash"] == before[0]["content_hash"]     # the canary runs its previous version again
    assert after[0]["pid"] != before[0]["pid"]
    assert after[1]["pid"] == before[1]["pid"]                       # r1 never touched
    assert all(r["serving"] for r in after)
    history = _rollouts(bed, "slow")
    assert [(h["kind"], h["decision"]) for h in history] == [("canary-verdict", "roll-back"),
                                                             ("rollout-end", "rolled-back")]
    failed = [c for c in history[0]["numbers"]["checks"] if c["passed"] is False]
    assert [c["name"] for c in failed] == ["itl_p99"] and failed[0]["canary"] > failed[0]["baseline"]
    assert history[1]["replicas"] == {"r0": "rolled-back", "r1": "left-running"}
    assert clients.failures == [], clients.failures[:5]
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


@pytest.mark.slow("a canary, then the two other replicas replaced together behind the real router")
def test_after_the_canary_the_rest_are_replaced_in_batches_of_max_unavailable(tmp_path: Path, bed: HostBed) -> None:
    """Three replicas (two on the first host), rollout.max_unavailable 2: the canary alone, then r1 and r2 out of
    the router together, replaced, back in; clients lose nothing (the canary serves meanwhile)."""
    hosts = [bed.hosts[0], bed.hosts[1], bed.hosts[0]]
    entries = [{"host": h.alias, "workdir": str(h.workdir), "engine_port": free_port(h.addr)} for h in hosts]
    prof, data = fleet_profile(tmp_path, bed, name="batch", env=WORLD, replicas=entries,
                               extra={"rollout": {**ROLLOUT, "max_unavailable": 2}})
    data["engine"]["args"] = {"enable_metrics": True}
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    home = tmp_path / "home"
    assert fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home).returncode == 0
    before = _status(bed, home, prof)
    data["engine"]["env"]["STANDIN_CHAT_TEXT"] = "the new release answering"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    run, clients = _canary_up(bed, home, prof, data)
    assert run.returncode == 0, run.stderr[-3000:]
    evs = events(run.stdout)
    report = evs[-1]
    assert report["outcome"] == "promoted" and [r["status"] for r in report["replicas"]] == ["ready"] * 3, report
    together = [e for e in evs if e["event"] == "info" and "out of the router together" in e["message"]]
    assert [e["message"].split(" out of")[0] for e in together] == ["taking r1, r2"], together
    assert all(a["content_hash"] != b["content_hash"] for a, b in zip(_status(bed, home, prof), before))
    assert clients.failures == [], clients.failures[:5]
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0
