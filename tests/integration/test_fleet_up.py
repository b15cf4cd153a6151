"""A `replicas:` fleet end to end: real sshd per host (tests/hostbed.py), stand-in engines, the real router (smg).

`up` deploys every replica at once and the router in front of the ready ones; `status`, `logs --replica/--host/
--router` and `down` see the whole fleet; a replica that cannot start does not hide the others (exit 9).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy_helpers import events
from fleet_helpers import chat, engine_log, fleet_deploy, fleet_profile, get_json
from hostbed import HostBed, host_bed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


@pytest.mark.slow("a fleet's whole day: two replicas and the real router up, requests, status, top, five logs reads, "
                  "down: a dozen CLI runs, each over three sshd hosts")
def test_fleet_up_routes_status_logs_down(tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed)
    up = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-3000:]
    evs = events(up.stdout)
    hosts = {e.get("host") for e in evs if e["event"] in ("attempt", "phase", "ready")}
    assert {"node-0", "node-1"} <= hosts, hosts            # --json events carry their host
    report = evs[-1]
    assert report["event"] == "report" and report["status"] == "ready", report
    assert [r["status"] for r in report["replicas"]] == ["ready", "ready"]
    # each engine binds its host's address (never 0.0.0.0) and the router reaches it there
    urls = [r["url"] for r in report["replicas"]]
    assert urls == [f"http://{h.addr}:{e['engine_port']}" for h, e in zip(bed.hosts, data["replicas"])]
    router = report["router"]
    assert router["status"] == "ready" and sorted(router["workers"]) == sorted(urls)

    addr, port = bed.hosts[0].addr, data["router"]["port"]
    code, ready = get_json(f"http://{addr}:{port}/readiness")
    assert code == 200 and ready["healthy_workers"] == 2, ready
    answers = [chat(addr, port) for _ in range(4)]
    assert all(a["choices"][0]["message"]["content"] for a in answers)
    def served() -> list[int]:
        return [engine_log(str(h.workdir), f"fleet-r{i}").count("POST /v1/chat/completions")
                for i, h in enumerate(bed.hosts)]

    end = time.monotonic() + 10    # an access line is written just after its answer
    while served() != [2, 2] and time.monotonic() < end:
        time.sleep(0.1)
    assert served() == [2, 2], served()                 # round_robin over both replicas

    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    assert st.returncode == 0, st.stderr
    row = json.loads(st.stdout)
    assert row["serving"] is True and [r["status"] for r in row["replicas"]] == ["ready", "ready"]
    assert [r["host"].split("@")[-1].split(":")[0] for r in row["replicas"]] == [h.addr for h in bed.hosts]
    assert row["router"]["healthy"] is True and row["router"]["readiness"]["healthy_workers"] == 2
    # each replica's serving metrics (issue 26): this SGLang has no --enable-metrics, and status says so; the
    # router is no engine (None); these hosts have no nvidia-smi: no GPU memory (absent, not 0)
    for replica in row["replicas"]:
        assert "add `enable_metrics: true`" in replica["metrics"]["error"], replica["metrics"]
        assert replica["metrics"]["gpu_memory"] is None, replica["metrics"]
    assert row["router"]["metrics"] is None
    top = fleet_deploy(bed, "top", str(prof), "--once", "--json", home=home)
    assert top.returncode == 0, top.stderr
    assert [(r["member"], r["state"], r["healthy"]) for r in json.loads(top.stdout)["rows"]] == \
        [("r0", "ready", True), ("r1", "ready", True), ("router", "ready", True)], top.stdout

    logs = fleet_deploy(bed, "logs", str(prof), "--replica", "1", "-n", "200", home=home)
    assert logs.returncode == 0 and "The server is fired up and ready to roll!" in logs.stdout, logs.stderr
    launch = (bed.hosts[1].workdir / "fleet-r1" / "current" / "launch.sh").read_text()
    assert f"--host {bed.hosts[1].addr} " in launch
    by_host = fleet_deploy(bed, "logs", str(prof), "--host", "node-1", "-n", "200", home=home)
    assert by_host.returncode == 0 and "The server is fired up and ready to roll!" in by_host.stdout
    router_log = fleet_deploy(bed, "logs", str(prof), "--router", "-n", "400", home=home)
    assert router_log.returncode == 0 and "Starting router on" in router_log.stdout, router_log.stderr
    ambiguous = fleet_deploy(bed, "logs", str(prof), "--host", "node-0", home=home)
    assert ambiguous.returncode == 2 and "add --replica N or --router" in ambiguous.stderr
    assert len(ambiguous.stderr.strip().splitlines()) == 1 and "Traceback" not in ambiguous.stderr

    again = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home)
    assert again.returncode == 0, again.stderr[-2000:]
    again_report = events(again.stdout)[-1]
    assert again_report["mode"] == "rolling" and [r["status"] for r in again_report["replicas"]] == \
        ["unchanged", "unchanged"] and again_report["router"]["action"] == "reconciled"

    # on call from another laptop: the fleet's name and its router's host are enough (the record fleet.json)
    laptop = tmp_path / "other-laptop"
    by_name = fleet_deploy(bed, "status", "fleet", "--host", "node-0", "--workdir", str(bed.hosts[0].workdir),
                           "--json", home=laptop)
    assert by_name.returncode == 0, by_name.stderr
    assert [r["member"] for r in json.loads(by_name.stdout)["replicas"]] == ["r0", "r1"]
    assert "secret" not in (bed.hosts[0].workdir / "fleet" / "fleet.json").read_text()
    logs_by_name = fleet_deploy(bed, "logs", "fleet", "--host", "node-0", "--workdir", str(bed.hosts[0].workdir),
                                "--replica", "1", "-n", "200", home=laptop)
    assert logs_by_name.returncode == 0 and "fired up and ready" in logs_by_name.stdout, logs_by_name.stderr
    down = fleet_deploy(bed, "down", "fleet", "--host", "node-0", "--workdir", str(bed.hosts[0].workdir),
                        home=laptop)
    assert down.returncode == 0, down.stderr
    assert sorted(down.stdout.split()).count("stopped") == 3, down.stdout
    again_down = fleet_deploy(bed, "down", str(prof), home=home)
    assert again_down.returncode == 0 and again_down.stdout.count("not running") == 3, again_down.stdout
    st2 = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    assert st2.returncode == 8, st2.stdout + st2.stderr
    assert get_json(f"http://{addr}:{port}/readiness")[0] == 0   # the router is gone


def test_a_failed_host_does_not_hide_the_others(tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, name="part")
    taken = data["replicas"][1]["engine_port"]
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind((bed.hosts[1].addr, taken))
    blocker.listen(1)
    try:
        up = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home)
    finally:
        blocker.close()
    assert up.returncode == 9, up.stderr[-3000:]
    evs = events(up.stdout)
    report = next(e for e in evs if e["event"] == "report")
    first, second = report["replicas"]
    assert first["status"] == "ready" and second["status"] == "failed"
    assert f"port {taken}" in second["error"] and second["exit_code"] == 4, second
    assert report["router"]["status"] == "ready" and report["router"]["workers"] == [first["url"]]
    error = evs[-1]
    assert error["event"] == "error" and error["code"] == 9 and "1 of 2 replicas ready" in error["message"]
    assert "r1@node-1" in error["message"]
    # the text view names the failed replica and the served one
    addr, port = bed.hosts[0].addr, data["router"]["port"]
    assert chat(addr, port)["choices"][0]["message"]["content"]
    st = fleet_deploy(bed, "status", str(prof), home=home)
    assert st.returncode == 9, st.stdout + st.stderr
    assert "r1@node-1" in st.stdout and "absent" in st.stdout
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


@pytest.mark.slow("two whole fleets (two replicas and a real router each) up side by side, then down")
def test_two_fleets_routers_share_a_host(tmp_path: Path, bed: HostBed) -> None:
    """smg's metrics server defaults to 0.0.0.0:29000: deployer gives each router its own (port + 1, its address)."""
    home = tmp_path / "home"
    profs = []
    for name in ("alpha", "beta"):
        prof, data = fleet_profile(tmp_path, bed, name=name)
        profs.append((prof, data))
        up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home)
        assert up.returncode == 0, up.stderr[-2000:]
    for prof, data in profs:
        code, ready = get_json(f"http://{bed.hosts[0].addr}:{data['router']['port']}/readiness")
        assert code == 200 and ready["healthy_workers"] == 2, ready
        with urllib.request.urlopen(f"http://{bed.hosts[0].addr}:{data['router']['port'] + 1}/metrics",
                                    timeout=5) as reply:      # its metrics answer where deployer put them
            assert reply.status == 200
        assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


@pytest.mark.parametrize("router", [False, True])
def test_a_fleet_command_dials_each_host_once(tmp_path: Path, bed: HostBed, router: bool) -> None:
    """The survey (is anything serving?), each replica's `up` and the router's session share one connection per
    host (deployments/fleet/links.py): a handshake is ~6 round trips on a real link."""
    home = tmp_path / "home"
    prof, _ = fleet_profile(tmp_path, bed, router=router)
    offsets = [h.sshd.log_offset() for h in bed.hosts]
    up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    seen = [h.sshd.sessions_since(o) for h, o in zip(bed.hosts, offsets)]
    assert [s.connections for s in seen] == [1, 1], seen
    # each step still has its own helper conversation: the survey's, each up's (and the router session's)
    assert [s.exec for s in seen] == ([3, 1] if router else [2, 2]), seen
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0
