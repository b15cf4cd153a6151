"""A fleet on hosts the way real ones are: each in its own network namespace with its own /dev/shm
(tests/hostbed.py `net_host_bed`), every replica on the SAME engine port, the real router (smg) in front.
The loopback host bed shares one kernel, so its fleets need a distinct port per replica; that hides per-host
collisions (a port claim, a port check, a /dev/shm file that is host-wide on one kernel but per host in reality)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from deploy_helpers import events
from fleet_helpers import chat, fleet_deploy, fleet_profile, get_json, smg_python
from hostbed import HostBed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
ENGINE_PORT = 30000
ROUTER_PORT = 8000



@pytest.mark.slow("two hosts in network namespaces of their own, a replica on each and the real router up, "
                  "requests through it, then down")
def test_replicas_on_the_same_port_of_separate_hosts_serve_behind_the_router(tmp_path: Path,
                                                                            net_bed: HostBed) -> None:
    bed = net_bed
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, router=False,
                               replicas=[{"host": h.alias, "workdir": str(h.workdir)} for h in bed.hosts])
    data["engine"]["port"] = ENGINE_PORT
    data["router"] = {"python": smg_python(), "port": ROUTER_PORT, "policy": "round_robin",
                      "args": {"health_check_interval_secs": 1}}
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    up = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-3000:]
    report = events(up.stdout)[-1]
    urls = [r["url"] for r in report["replicas"]]
    assert urls == [f"http://{h.addr}:{ENGINE_PORT}" for h in bed.hosts], urls
    addr = bed.hosts[0].addr
    code, ready = get_json(f"http://{addr}:{ROUTER_PORT}/readiness")
    assert code == 200 and ready["healthy_workers"] == 2, ready
    assert all(chat(addr, ROUTER_PORT)["choices"][0]["message"]["content"] for _ in range(4))

    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    assert st.returncode == 0, st.stdout + st.stderr
    rows = json.loads(st.stdout)["replicas"]
    assert [r["port"] for r in rows] == [ENGINE_PORT, ENGINE_PORT] and all(r["healthy"] for r in rows), rows
    restart = fleet_deploy(bed, "restart", str(prof), "--json", home=home, timeout=240)
    assert restart.returncode == 0, restart.stderr[-3000:]
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0
