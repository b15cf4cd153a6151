"""An interrupted rolling restart of a fleet behind the real router (smg), over real sshd hosts (issue 22 finding
4): Ctrl-C or SIGTERM between draining a replica and adding it back adds it back before deployer leaves; after
kill -9 the guard on the router's host adds it back with no further command, and meanwhile `deploy status` exits 9
(never 0 while the router lacks a replica)."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from fleet_helpers import fleet_deploy, fleet_profile, get_json  # noqa: E402
from faultbed import start_deploy, wait_for_event  # noqa: E402
from hostbed import HostBed, host_bed  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
OUT = "out of the router; waiting for"  # the line `restart` says as it drains a replica


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


def router_urls(bed: HostBed, data: dict[str, Any]) -> set[str]:
    code, body = get_json(f"http://{bed.hosts[0].addr}:{data['router']['port']}/workers")
    assert code == 200, code
    return {str(w["url"]) for w in body["workers"]}


def replica_urls(bed: HostBed, home: Path, prof: Path) -> list[str]:
    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    return [str(r["url"]) for r in json.loads(st.stdout)["replicas"]]


def restart_in_background(bed: HostBed, prof: Path, home: Path) -> Any:
    return start_deploy("restart", str(prof), "--json", home=home, env={"DEPLOYER_SSH_CONFIG": str(bed.ssh_config)})


def fleet_up(tmp_path: Path, bed: HostBed, name: str) -> tuple[Path, dict[str, Any], Path, list[str]]:
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, name=name, env={"STANDIN_DRAIN_S": "2"})
    up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    urls = replica_urls(bed, home, prof)
    assert router_urls(bed, data) == set(urls)
    return prof, data, home, urls


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_rolling_restart_adds_the_drained_replica_back(tmp_path: Path, bed: HostBed,
                                                                      how: signal.Signals) -> None:
    prof, data, home, urls = fleet_up(tmp_path, bed, f"fi-{how.name.lower()}")
    restart = restart_in_background(bed, prof, home)
    try:
        wait_for_event(restart, OUT, timeout=60)
        time.sleep(1.0)  # drained, and its engine being stopped (2 s drain)
        sent = time.monotonic()
        restart.send_signal(how)
        out, err = restart.communicate(timeout=90)
        took = time.monotonic() - sent
    finally:
        if restart.poll() is None:
            restart.kill()
    text = out.decode() + err.decode()
    assert restart.returncode == 130 and "Traceback" not in text, text[-3000:]
    assert "added back to the router" in text or "asked back into the router" in text, text[-3000:]
    assert took < 60, took
    # registered again with no further command (smg lists it once its brought-back engine answers its health)
    deadline = time.monotonic() + 40
    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    while st.returncode != 0 and time.monotonic() < deadline:
        time.sleep(1)
        st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    assert st.returncode == 0, st.stdout[-3000:]
    assert router_urls(bed, data) == set(urls)
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


def test_kill_9_after_the_drain_the_router_takes_the_replica_back_by_itself(tmp_path: Path, bed: HostBed) -> None:
    """No further command but reads: the guard armed on the router's host before the drain sees the client gone and
    adds the replica back once it answers, within stop + load + 10 s; until then `status` exits 9, never 0."""
    began = time.monotonic()
    prof, data, home, urls = fleet_up(tmp_path, bed, "fi-kill")
    load_s = time.monotonic() - began  # the whole fleet's first up: more than one replica's load
    restart = restart_in_background(bed, prof, home)
    try:
        wait_for_event(restart, OUT, timeout=60)
        deadline = time.monotonic() + 20
        while len(router_urls(bed, data)) == 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        restart.send_signal(signal.SIGKILL)  # out of the router, its engine still serving
        killed = time.monotonic()
        restart.communicate(timeout=10)
    finally:
        if restart.poll() is None:
            restart.kill()
    assert len(router_urls(bed, data)) == 1
    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    rows = json.loads(st.stdout)["replicas"]
    in_router = sorted(r["in_router"] for r in rows)
    assert (st.returncode, in_router) in ((9, [False, True]), (0, [True, True])), (st.returncode, rows)
    bound = 2 + load_s + 10  # the drain (2 s), a load, 10 s
    while router_urls(bed, data) != set(urls) and time.monotonic() < killed + bound:
        time.sleep(0.2)
    assert router_urls(bed, data) == set(urls), time.monotonic() - killed
    router_dir = bed.hosts[0].workdir / "fi-kill-router"
    deadline = time.monotonic() + 10
    while (router_dir / "router-intent.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the guard records, releases the lock and leaves
    events = (router_dir / "lock-events.jsonl").read_text()
    assert '"event": "repaired"' in events and "back to the router" in events, events
    assert fleet_deploy(bed, "status", str(prof), home=home).returncode == 0
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0
