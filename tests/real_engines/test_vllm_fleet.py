"""A fleet of two real vLLM 0.32.0 replicas behind the real router (smg), the way real fleets run: each host in its
own network namespace with its own /dev/shm, the same engine port (30000) on both, one OMP thread each; up,
requests through the router during a rolling restart (none may fail), down.

smg keeps its default retries here, as in production: they are also its defence against a send that fails before
any answer (smg PR #2162, a pooled connection lost in a race; the stand-in tier saw one such 500 with
--disable-retries while both engines served). Retries never hide a fleet with no ready replica: the requests would
have nowhere to go. That deployer takes a replica out of the router before stopping it is checked where it shows,
with engines that answer 503 while they shut down: tests/integration/test_fleet_rolling.py (`_turned_away`)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import MODEL, STANDIN_BIN, VLLM_VENV, vllm_engine
from fleet_helpers import fleet_deploy, smg_python
from hostbed import HostBed

ENGINE_PORT = 30000   # every host serves the same port, as real fleets do (a collision would show here)
ROUTER_PORT = 8000

CLIENT_LIMIT_S = 400.0


@pytest.fixture()
def bed(net_bed: HostBed) -> HostBed:
    for host in net_bed.hosts:
        # The same engine python name on both hosts. Not pinned: with one replica's worker pinned to core 1 and
        # busy, the other's new EngineCore hung in the kernel's sched_setaffinity (affine_move_task) on this
        # 2-vCPU VM, unkillable, 3 runs in 3 (VLLM_CPU_OMP_THREADS_BIND=0 / =1); one OMP thread each instead.
        wrapper = host.sshd.bin_dir / "vllm-python"
        wrapper.write_text("#!/bin/sh\nVLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 "
                           f"exec {VLLM_VENV / 'bin' / 'python'} \"$@\"\n")
        wrapper.chmod(0o755)
        (host.sshd.bin_dir / "nvidia-smi").symlink_to(STANDIN_BIN / "nvidia-smi")  # preflight asks for GPUs
    return net_bed


class Client:
    """Chat requests through the router one after another until stopped (bounded); every failure is kept."""

    def __init__(self, url: str) -> None:
        self.url, self.ok, self.failures = url, 0, []  # type: ignore[var-annotated]
        self.ok_during: int = 0
        self.counting = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        body = json.dumps({"model": str(MODEL), "max_tokens": 4, "temperature": 0,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        end = time.monotonic() + CLIENT_LIMIT_S
        while not self.stop.is_set() and time.monotonic() < end:
            req = urllib.request.Request(self.url, data=body, headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as reply:
                    if json.loads(reply.read())["usage"]["completion_tokens"] >= 1:
                        self.ok += 1
                        self.ok_during += self.counting
            except Exception as exc:  # noqa: BLE001 (every failure counts)
                self.failures.append(f"{time.time():.3f} {type(exc).__name__}: {exc}")
            time.sleep(0.05)


def test_rolling_restart_of_two_real_vllm_replicas_through_the_real_router_loses_no_request(
        tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    engine = vllm_engine(ENGINE_PORT, tmp_path)
    engine["python"] = "vllm-python"
    data: dict[str, Any] = {
        "name": "tiny-fleet",
        "replicas": [{"host": h.alias, "workdir": str(h.workdir)} for h in bed.hosts],
        "engine": engine,
        "router": {"python": smg_python(), "port": ROUTER_PORT, "policy": "round_robin",
                   "args": {"health_check_interval_secs": 1}},   # smg's default retries, as in production
        "health": {"interval_s": 0.5, "startup_timeout_s": 300, "stall_timeout_s": 120},
        "retry": {"max_attempts": 1, "backoff_s": 0.5},
        "restart": {"grace_s": 15},
    }
    (tmp_path / "tmp").mkdir(exist_ok=True)
    prof = tmp_path / "fleet.yaml"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    up = fleet_deploy(bed, "up", str(prof), home=home, timeout=500)
    assert up.returncode == 0, up.stderr[-4000:]
    client = Client(f"http://{bed.hosts[0].addr}:{data['router']['port']}/v1/chat/completions")
    try:
        time.sleep(2.0)
        client.counting = True
        restart = fleet_deploy(bed, "restart", str(prof), "--json", home=home, timeout=500)
        client.counting = False
        time.sleep(1.0)
    finally:
        client.stop.set()
        client.thread.join(timeout=90)
    assert restart.returncode == 0, restart.stderr[-4000:]
    report = [json.loads(ln) for ln in restart.stdout.splitlines() if ln.startswith("{")][-1]
    assert report["mode"] == "rolling" and [r["status"] for r in report["replicas"]] == ["ready", "ready"], report
    assert client.failures == [], client.failures[:5]
    assert client.ok_during >= 10, client.ok_during   # answered while the replicas were being replaced
    assert fleet_deploy(bed, "down", str(prof), home=home, timeout=180).returncode == 0
