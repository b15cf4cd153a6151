"""`deploy up | status | logs | down` end to end: real sshd, real supervisor, stand-in engine, real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile
from deployer.remote.program import payload_bundle

pytestmark = pytest.mark.integration


def test_up_status_logs_down(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="demo")
    handshakes = sshd.log_count("Accepted publickey")
    up = deploy("up", str(prof), "--json", home=home)
    assert up.returncode == 0, up.stderr + up.stdout
    assert sshd.log_count("Accepted publickey") - handshakes == 1  # one SSH handshake for the whole `up`
    evs = events(up.stdout)
    phases = [e["phase"] for e in evs if e["event"] == "phase"]
    assert phases[:2] == ["args", "loading weights"] and "ready" in [e["event"] for e in evs]
    report = evs[-1]
    assert report["event"] == "report" and report["status"] == "ready"
    run_record = json.loads((Path(report["run_dir"]) / "profile.json").read_text())
    assert run_record["helper"] == payload_bundle()[1]  # the run dir names the target-side helper that wrote it
    # on-call from another laptop: only the name, an ~/.ssh/config alias and the workdir
    st = deploy("status", "demo", "--host", "deployer-test", "--workdir", str(tmp_path / "work"), "--json",
                home=tmp_path / "other-laptop", env={"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)})
    assert st.returncode == 0, st.stderr
    row = json.loads(st.stdout)
    assert row["status"] == "ready" and row["healthy"] is True and row["pid"] > 0
    assert row["content_hash"] == report["content_hash"]

    # the tail also holds the access lines of deployer's own readiness token, status and probe requests, so the
    # window is wide enough for them; -n still bounds it
    logs = deploy("logs", str(prof), "-n", "40", home=home)
    assert logs.returncode == 0 and "The server is fired up and ready to roll!" in logs.stdout
    assert len(logs.stdout.splitlines()) <= 40

    again = deploy("up", str(prof), "--skip-preflight", home=home)
    assert again.returncode == 0 and "already running" in again.stderr

    down = deploy("down", str(prof), home=home)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
    down2 = deploy("down", str(prof), home=home)
    assert down2.returncode == 0 and "not running" in down2.stdout


def test_logs_follow_prints_new_lines_as_they_come(tmp_path: Path, sshd: Any) -> None:
    import os
    import select
    import subprocess
    import sys
    import time

    from deploy_helpers import REPO
    from deployer.profile.loader import load_profile
    from deployer.remote.connect import connect

    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="follow")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    port = load_profile(prof).engine.port
    follower = subprocess.Popen([sys.executable, "-m", "deployer.cli", "logs", str(prof), "-f", "-n", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=str(REPO),
                                env={"PATH": "/usr/bin:/bin", "DEPLOYER_HOME": str(home)})

    def read_until(needle: bytes, seconds: float) -> bytes:
        assert follower.stdout is not None
        got, deadline = b"", time.monotonic() + seconds
        while needle not in got and (left := deadline - time.monotonic()) > 0:
            if select.select([follower.stdout], [], [], left)[0]:
                chunk = os.read(follower.stdout.fileno(), 65536)
                if not chunk:
                    break
                got += chunk
        return got

    try:
        assert b"\n" in read_until(b"\n", 15)  # the last line of the log so far
        remote = connect(sshd.spec())
        try:  # the engine logs each request (uvicorn's access log): a new line for the follower
            remote.request("GET", port, "/v1/models?follow-marker", timeout=5)
        finally:
            remote.close()
        assert b"follow-marker" in read_until(b"follow-marker", 15)
    finally:
        follower.terminate()
        follower.wait(timeout=10)
    deploy("down", str(prof), home=home)


def test_effective_args_drift_is_reported_by_up_and_status(tmp_path: Path, sshd: Any) -> None:
    """The engine overrides a value the profile asked for (old SGLang forces the overlap scheduler off with
    no_buffer): `up` and `status` say so in one line."""
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="drift", model="Qwen/Qwen3.6-27B",
                         args={"mamba_scheduler_strategy": "no_buffer", "disable_overlap_schedule": False},
                         env={"STANDIN_SGLANG_VERSION": "0.5.10"})
    up = deploy("up", str(prof), "--json", home=home)
    assert up.returncode == 0, up.stderr
    report = events(up.stdout)[-1]
    assert report["drift"] == ["asked disable_overlap_schedule=false, engine resolved true"]
    assert [e["message"] for e in events(up.stdout) if e["event"] == "drift"] == report["drift"]
    human = deploy("status", str(prof), home=home)
    assert "drift: asked disable_overlap_schedule=false, engine resolved true" in human.stdout
    deploy("down", str(prof), home=home)


def test_host_local_runs_the_same_flow_without_ssh(tmp_path: Path) -> None:
    """`target.host: local`: deployer on the GPU box itself; same supervisor, lock, watch and healing."""
    import os

    from deploy_helpers import STANDIN, free_port

    home = tmp_path / "home"
    prof = tmp_path / "local.yaml"
    prof.write_text(f"""
name: local-demo
target: {{host: local, workdir: {tmp_path / 'work'}}}
engine:
  python: /usr/bin/python3
  model_path: Qwen/Qwen3-8B
  port: {free_port()}
  env: {{PYTHONPATH: {STANDIN}}}
health: {{interval_s: 0.2, startup_timeout_s: 60, stall_timeout_s: 20}}
restart: {{grace_s: 3}}
""")
    env = {"PATH": f"{STANDIN / 'bin'}:{os.environ['PATH']}"}  # the stand-in nvidia-smi for preflight
    up = deploy("up", str(prof), "--json", home=home, env=env)
    assert up.returncode == 0, up.stderr
    assert events(up.stdout)[-1]["status"] == "ready" and events(up.stdout)[-1]["host"] == "local"
    st = deploy("status", str(prof), "--json", home=home, env=env)
    assert json.loads(st.stdout)["healthy"] is True
    assert deploy("down", str(prof), home=home, env=env).returncode == 0
    assert json.loads(deploy("status", str(prof), "--json", home=home, env=env).stdout)["status"] == "stopped"


def test_quiet_after_the_ready_line_is_not_a_hang(tmp_path: Path, sshd: Any) -> None:
    """SGLang prints its ready line and goes quiet; a slow first /health (a one-token generation) must not be
    taken for a hang, however short stall_timeout_s is."""
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="quiet", env={"STANDIN_HEALTH_SLOW_S": "3"},
                         args={"log_level_http": "warning"},  # no access-log lines: truly quiet
                         extra={"health": {"interval_s": 0.2, "stall_timeout_s": 1, "startup_timeout_s": 60}})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr
    assert [a["outcome"] for a in events(up.stdout)[-1]["attempts"]] == ["ready"]
    deploy("down", str(prof), home=home)
