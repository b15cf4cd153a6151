"""An interrupted rolling restart of a fleet behind the real router (smg), over real sshd hosts (issue 22 finding
4): Ctrl-C or SIGTERM between draining a replica and adding it back adds it back before deployer leaves; after
kill -9 the guard on the router's host adds it back with no further command, and meanwhile `deploy status` exits 9
(never 0 while the router lacks a replica). A router replaced for its settings and killed -9 between its stop and
its start: the guard starts the new router by itself; meanwhile `status` is not serving."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from fleet_helpers import chat, fleet_deploy, fleet_profile, get_json, router_key  # noqa: E402
from faultbed import assert_lock_free, current_run, guard_of, start_deploy, wait_for_event  # noqa: E402
from hostbed import HostBed, host_bed  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
OUT = "out of the router; waiting for"  # the line `restart` says as it drains a replica


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


def router_urls(bed: HostBed, data: dict[str, Any]) -> set[str]:
    key = router_key(bed.hosts[0].workdir, f"{data['name']}-router")
    code, body = get_json(f"http://{bed.hosts[0].addr}:{data['router']['port']}/workers", key=key)
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


@pytest.mark.slow("a fleet up, then a rolling restart interrupted mid-drain and the drained replica waited back into the router")
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


@pytest.mark.slow("a fleet up, then the guard's own re-add after kill -9 of the client: waits out stop + load + up to 10 s")
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


def stopping(run: Path | None, timeout: float = 20) -> None:
    """Until the run's supervisor says it is stopping (or stopped): deployer's stop of it has begun."""
    assert run is not None
    deadline, state = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        try:
            state = json.loads((run / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if state.get("status") in ("stopping", "stopped"):
            return
        time.sleep(0.01)
    raise AssertionError(f"{run} was not stopped: {state}")


def answers(addr: str, port: int, within: float) -> bool:
    """Whether a request through the router is answered (a generated token) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            return bool(chat(addr, port)["choices"][0]["message"]["content"])
        except OSError:
            time.sleep(0.5)
    return False


@dataclass
class RouterReplace:
    """A fleet whose router's settings changed, its `up` interrupted between the old router's stop and the start."""

    prof: Path
    data: dict[str, Any]
    home: Path
    work: Path
    router: str
    old_run: Path | None
    returncode: int
    stderr: str


def interrupt_router_replace(tmp_path: Path, bed: HostBed, name: str, how: signal.Signals) -> RouterReplace:
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, name=name)
    assert fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home).returncode == 0
    work, router = bed.hosts[0].workdir, f"{name}-router"
    old_run = current_run(work, router)
    data["router"]["policy"] = "random"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    up = start_deploy("up", str(prof), "--json", "--skip-preflight", home=home,
                      env={"DEPLOYER_SSH_CONFIG": str(bed.ssh_config)})
    try:
        wait_for_event(up, "replacing the router", timeout=120)  # the guard is armed before it says so
        stopping(old_run)
        up.send_signal(how)  # the old router on its way down (or down), the new one not started
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    return RouterReplace(prof, data, home, work, router, old_run, up.returncode, err.decode())


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_between_the_routers_stop_and_its_start_starts_the_new_router_first(
        tmp_path: Path, bed: HostBed, how: signal.Signals) -> None:
    r = interrupt_router_replace(tmp_path, bed, "fi-rint", how)
    assert r.returncode == 130, r.stderr[-3000:]
    new_run = current_run(r.work, r.router)
    assert new_run != r.old_run and new_run is not None and "random" in (new_run / "launch.sh").read_text()
    assert json.loads((new_run / "state.json").read_text())["status"] in ("starting", "running", "ready")
    assert not (r.work / r.router / "replace-intent.json").exists()  # disarmed
    assert_lock_free(r.work, r.router)
    assert answers(bed.hosts[0].addr, r.data["router"]["port"], 60)
    assert fleet_deploy(bed, "down", str(r.prof), home=r.home).returncode == 0


def test_kill_9_between_the_routers_stop_and_its_start_the_router_serves_again_by_itself(tmp_path: Path,
                                                                                         bed: HostBed) -> None:
    """A router replaced for its settings, the client killed once the old router is on its way down (the guard
    armed before, the new router not started: checked): while the router is down `status` is not serving
    (the old router's state says `interrupted`); with no further command but reads the guard starts the new router
    from its complete run dir, requests through it are answered, the repair is in the lock's history and the lock
    is released."""
    r = interrupt_router_replace(tmp_path, bed, "fi-rkill", signal.SIGKILL)
    prof, data, home, work, router, old_run = r.prof, r.data, r.home, r.work, r.router, r.old_run
    guard = guard_of(work, router)
    os.kill(guard, signal.SIGSTOP)  # held while we look at the router down: nothing else can start it now
    try:
        new_runs = [run for run in (work / router / "runs").iterdir() if run != old_run]
        assert len(new_runs) == 1 and not (new_runs[0] / "state.json").exists(), new_runs  # killed before its start
        st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
        shown = json.loads(st.stdout)
        assert not shown["serving"] and (shown["router"]["status"], st.returncode) in (("interrupted", 5), (
            "replacing", 6)), (st.returncode, shown["router"])  # never 0, 8 nor 9 (the router serves some)
    finally:
        os.kill(guard, signal.SIGCONT)
    resumed = time.monotonic()
    while (work / router / "replace-intent.json").exists() and time.monotonic() < resumed + 60:
        time.sleep(0.2)  # 3 s, the rest of the stop (3 s grace), the new router's start and ready line
    assert not (work / router / "replace-intent.json").exists(), (work / router / "repair.log").read_text()
    events = (work / router / "lock-events.jsonl").read_text()
    assert '"event": "repaired"' in events and "started the new version" in events, events[-2000:]
    assert current_run(work, router) == new_runs[0] and "random" in (new_runs[0] / "launch.sh").read_text()
    assert answers(bed.hosts[0].addr, data["router"]["port"], 90 - (time.monotonic() - resumed)), \
        time.monotonic() - resumed  # smg's first health checks of its workers
    assert_lock_free(work, router)
    assert fleet_deploy(bed, "status", str(prof), home=home).returncode == 0
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


def test_a_new_router_that_does_not_come_up_leaves_the_old_one_routing(tmp_path: Path, bed: HostBed) -> None:
    """A settings change whose router cannot start (a flag smg refuses, while this client is alive): the new router
    is stopped, the old one started again, made current and routing to every replica; `up` fails and says so."""
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, name="fi-rfail")
    assert fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home).returncode == 0
    work, router = bed.hosts[0].workdir, "fi-rfail-router"
    old_run, urls = current_run(work, router), replica_urls(bed, home, prof)
    data["router"].setdefault("args", {})["no_such_smg_flag"] = 1
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    failed = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home, timeout=240)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    said = failed.stdout + failed.stderr
    assert f"the previous router ({old_run.name if old_run else '?'}) was started again and routes as before" \
        in said, said[-3000:]
    assert current_run(work, router) == old_run
    assert router_urls(bed, data) == set(urls)
    assert chat(bed.hosts[0].addr, data["router"]["port"])["usage"]["completion_tokens"] >= 1
    status = fleet_deploy(bed, "status", str(prof), home=home)
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    assert_lock_free(work, router)
