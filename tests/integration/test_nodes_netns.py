"""One engine over two nodes on hosts the way real ones are (`net_host_bed`: network namespaces with their own
/dev/shm, routed): both ranks on the SAME engine port, node 0's rendezvous reached over the link, the NIC the
collectives use found per host (eth0 here, not loopback), and the group's fate across hosts (a killed follower
takes the group down and the policy brings all of it back)."""

from __future__ import annotations

import http.client
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import STANDIN, deploy, events
from hostbed import HostBed
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
ENGINE_PORT = 30000
DIST_PORT = 20000



def state(bed: HostBed, rank: int) -> dict[str, Any]:
    try:
        return dict(json.loads((bed.hosts[rank].workdir / "pair" / "current" / "state.json").read_text()))
    except (OSError, ValueError):
        return {}


def health(addr: str, port: int) -> int | None:
    try:
        conn = http.client.HTTPConnection(addr, port, timeout=2)
        conn.request("GET", "/health")
        code = conn.getresponse().status
        conn.close()
        return code
    except OSError:
        return None


def pair_profile(tmp_path: Path, bed: HostBed, name: str, extra: dict[str, Any] | None = None) -> Path:
    """The stand-in SGLang over both hosts, each rank on ENGINE_PORT of its own host, node 0's rendezvous on
    DIST_PORT; `extra`: more top-level sections."""
    data: dict[str, Any] = {
        "name": name,
        "nodes": [h.sshd.target(h.workdir) for h in bed.hosts],
        "engine": {"kind": "sglang", "python": "/usr/bin/python3", "model_path": "Qwen/Qwen3-8B", "port": ENGINE_PORT,
                   "host": "0.0.0.0", "args": {"tp_size": 2}, "env": {"PYTHONPATH": str(STANDIN)},
                   "dist_init_port": DIST_PORT},
        **(extra or {}),
    }
    prof = tmp_path / f"{name}.yaml"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    return prof


def test_two_nodes_on_the_same_port_of_separate_hosts_serve_and_restart_as_a_group(
        tmp_path: Path, net_bed: HostBed) -> None:
    bed = net_bed
    prof = pair_profile(tmp_path, bed, "pair", {
        "health": {"interval_s": 0.3, "startup_timeout_s": 60, "stall_timeout_s": 30},
        "retry": {"max_attempts": 2, "backoff_s": 0.2},
        "restart": {"grace_s": 2, "policy": "on-failure", "backoff_s": [0.5, 2]},
    })
    home = tmp_path / "home"
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=home, timeout=150)
    assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-3000:]
    report = [e for e in events(up.stdout) if e.get("event") == "report"][-1]
    assert [(n["node"], n["addr"], n["port"], n["nic"]) for n in report["nodes"]] == [
        (0, bed.hosts[0].addr, ENGINE_PORT, "eth0"), (1, bed.hosts[1].addr, ENGINE_PORT, "eth0")], report["nodes"]
    assert state(bed, 0)["group_seen"] == [f"rank 1 at {bed.hosts[1].addr}:{ENGINE_PORT}"]
    assert state(bed, 1)["group_seen"] == [f"rank 0 at {bed.hosts[0].addr}:{DIST_PORT}"]
    assert health(bed.hosts[0].addr, ENGINE_PORT) == 200 and health(bed.hosts[1].addr, ENGINE_PORT) == 200

    # the follower dies (in its own PID namespace: killed through its host's sshd): the whole group comes back
    before = (state(bed, 0)["pid"], state(bed, 1)["pid"])
    kill = subprocess.run(["ssh", "-F", str(bed.ssh_config), "-o", "BatchMode=yes", "node-1",
                           f"kill -9 -- -{before[1]}"], capture_output=True, text=True, timeout=30)
    assert kill.returncode == 0, kill.stderr
    wait_for(lambda: state(bed, 0).get("restarts", 0) >= 1 and state(bed, 1).get("restarts", 0) >= 1
             and state(bed, 0).get("status") == "ready" and state(bed, 1).get("status") == "ready",
             "both ranks restarted and ready", 60)
    assert state(bed, 0)["pid"] != before[0], "rank 0 was restarted with the group, not left serving alone"
    assert deploy("down", str(prof), home=home, timeout=60).returncode == 0


def test_a_follower_that_cannot_reach_node_0s_dist_init_port_is_refused_before_anything_starts(
        tmp_path: Path, net_bed: HostBed) -> None:
    """Node 0's link drops TCP to the dist-init port (a firewall between the boxes; ssh still passes): preflight's
    look (node 0's helper listens on the port, node 1's connects to it over the link) names the follower, the address
    and why, exit 4, and no node has a run."""
    bed = net_bed
    prof = pair_profile(tmp_path, bed, "cut")
    for host in bed.hosts:  # each node a GPU box for preflight: the stand-in nvidia-smi (one idle H200)
        (host.sshd.bin_dir / "nvidia-smi").symlink_to(STANDIN / "bin" / "nvidia-smi")
    bed.nets[0].block_port(DIST_PORT)
    up = deploy("up", str(prof), home=tmp_path / "home", timeout=150)
    assert up.returncode == 4, up.stderr[-3000:]
    assert (f"cannot reach node 0's dist-init address {bed.hosts[0].addr}:{DIST_PORT} (timed out)"
            in up.stderr), up.stderr
    assert "node 1" in up.stderr and "Traceback" not in up.stderr, up.stderr
    assert not any((h.workdir / "cut" / "runs").exists() and any((h.workdir / "cut" / "runs").iterdir())
                   for h in bed.hosts)
