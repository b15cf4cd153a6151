"""Red team, issue #34 finding 5: a fleet converges within its bound, and says the truth meanwhile (real sshd hosts,
the real router smg, the stand-in engine draining 2 s on SIGTERM).

- kill -9 of a fleet `restart` mid-drain (the replica just taken out of the router) or 0.5 s into the replica's stop:
  the replica is back in the router, healthy by the router's own word, within stop + load + 10 s of the kill (it
  was 34-38 s while smg's 409 "worker creation already in progress" was not asked again). The time is printed.
- meanwhile `deploy status` never exits 0 while the router's own /readiness counts fewer healthy workers than the
  fleet has replicas.
- SIGTERM of a rolling `up` inside a replica's stop ends without the 409, and the replica is back in the router.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from fleet_helpers import fleet_deploy, fleet_profile, get_json, router_key  # noqa: E402
from faultbed import start_deploy, wait_for_event  # noqa: E402
from hostbed import HostBed  # noqa: E402
from test_fleet_interrupts import OUT, bed, replica_urls, restart_in_background, router_urls  # noqa: E402,F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
DRAIN_S = 2.0  # the stand-in's drain on SIGTERM: the replica's stop


def router_ready(bed: HostBed, data: dict[str, Any]) -> int:
    """healthy_workers of the router's own /readiness (-1 when it does not answer)."""
    code, body = get_json(f"http://{bed.hosts[0].addr}:{data['router']['port']}/readiness")
    return int(body.get("healthy_workers", 0)) if isinstance(body, dict) else -1


def router_healthy(bed: HostBed, data: dict[str, Any]) -> set[str]:
    """The workers the router lists as healthy (its own health check of them)."""
    key = router_key(bed.hosts[0].workdir, f"{data['name']}-router")
    code, body = get_json(f"http://{bed.hosts[0].addr}:{data['router']['port']}/workers", key=key)
    assert code == 200, code
    return {str(w["url"]) for w in body["workers"] if w.get("is_healthy") is True}


def stopping_replica(bed: HostBed, name: str, timeout: float = 30) -> int:
    """The index of the replica whose supervisor says its stop began (waited for, bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for index, host in enumerate(bed.hosts):
            try:
                state = json.loads((host.workdir / f"{name}-r{index}" / "current" / "state.json").read_text())
            except (OSError, ValueError):
                continue
            if state.get("status") in ("stopping", "stopped"):
                return index
        time.sleep(0.01)
    raise AssertionError("no replica's stop began")


def fleet_up(tmp_path: Path, bed: HostBed, name: str) -> tuple[Path, dict[str, Any], Path, list[str], float]:
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, name=name, env={"STANDIN_DRAIN_S": f"{DRAIN_S:g}"})
    began = time.monotonic()
    up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    load_s = time.monotonic() - began  # the whole fleet's first up: more than one replica's load
    urls = replica_urls(bed, home, prof)
    assert router_urls(bed, data) == set(urls)
    return prof, data, home, urls, load_s


@pytest.mark.slow("a fleet up behind the real router, its restart killed, then the wait for the replica back in the "
                  "router (the bound: stop + load + 10 s), status asked throughout")
@pytest.mark.parametrize("when", ["mid-drain", "in-stop"])
def test_kill_9_of_a_fleet_restart_converges_within_the_bound_and_status_never_lies(tmp_path: Path, bed: HostBed,
                                                                                   when: str) -> None:
    name = f"fc-{when}"
    prof, data, home, urls, load_s = fleet_up(tmp_path, bed, name)
    restart = restart_in_background(bed, prof, home)
    try:
        wait_for_event(restart, OUT, timeout=60)
        if when == "in-stop":
            stopping_replica(bed, name)
            time.sleep(0.5)
        restart.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        restart.communicate(timeout=10)
    finally:
        if restart.poll() is None:
            restart.kill()
    bound = DRAIN_S + load_s + 10
    samples: list[tuple[float, int, int]] = []
    converged = None
    while time.monotonic() < killed + bound + 5:  # bounded: a little past the bound, to say by how much it missed
        st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
        assert "Traceback" not in st.stderr, st.stderr
        ready = router_ready(bed, data)  # asked after status: during convergence it only grows
        samples.append((round(time.monotonic() - killed, 1), st.returncode, ready))
        assert not (st.returncode == 0 and ready < len(urls)), (samples, st.stdout[-3000:])
        if converged is None and router_healthy(bed, data) == set(urls):
            converged = time.monotonic() - killed
        if converged is not None and st.returncode == 0:
            break
        time.sleep(0.3)
    print(f"\nfleet restart killed -9 {when}: the replica back in the router, healthy, {converged} s after the kill "
          f"(bound {bound:.1f} s = stop {DRAIN_S:g} + load {load_s:.1f} + 10); status samples (s, exit, "
          f"router healthy_workers): {samples}")
    assert converged is not None and converged <= bound, (converged, bound, samples)
    assert samples[-1][1] == 0, samples
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0


@pytest.mark.slow("a fleet up behind the real router, then a rolling up interrupted in a replica's stop, and the wait "
                  "for that replica back in the router")
def test_sigterm_of_a_rolling_up_inside_a_replicas_stop_ends_without_the_409(tmp_path: Path, bed: HostBed) -> None:
    name = "fc-term"
    prof, data, home, urls, load_s = fleet_up(tmp_path, bed, name)
    data["engine"]["env"]["VERSION"] = "2"  # a new version: `up` rolls it out replica by replica
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    up = start_deploy("up", str(prof), "--json", "--skip-preflight", home=home,
                      env={"DEPLOYER_SSH_CONFIG": str(bed.ssh_config)})
    try:
        wait_for_event(up, OUT, timeout=90)
        stopping_replica(bed, name)
        time.sleep(0.5)
        up.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, err = up.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if up.poll() is None:
            up.kill()
    text = out.decode() + err.decode()
    assert up.returncode == 130 and "Traceback" not in text, text[-3000:]
    # the router's 409 as a number of its own: content hashes, run ids and timestamps (.409 s) hold "409" too
    assert not re.search(r"(?<![0-9a-fA-F.])409(?![0-9a-fA-F])", text) and "already in progress" not in text, \
        text[-3000:]
    bound = DRAIN_S + load_s + 10
    deadline = sent + bound
    while router_healthy(bed, data) != set(urls) and time.monotonic() < deadline:
        time.sleep(0.3)
    back = time.monotonic() - sent
    print(f"\nrolling up SIGTERM in a stop: exit 130 after {took:.1f} s, every replica healthy in the router "
          f"{back:.1f} s after the signal (bound {bound:.1f} s)")
    assert router_healthy(bed, data) == set(urls), (back, text[-2000:])
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0
