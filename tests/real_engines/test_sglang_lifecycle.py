"""Real SGLang 0.5.23 (its CPU engine) deployed by deployer over the real sshd, its model directory pushed from
here: up -> phases -> ready -> a real chat completion -> status -> logs -> restart under load with restart.drain_s
-> saturated for twice health.hang_s (never hung) -> its scheduler frozen under load (hung, restarted: issue 37) ->
its scheduler frozen while idle (the probes, not the hang rule: /health 503s, it never exits; restarted) -> down with SIGTERM honoured as it really is (~5 s); preflight's dry resolution of a hub repo before and after
deployer fetched it; and a port taken after deployer's own check, which real SGLang meets by logging uvicorn's
error and hanging."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import MODEL, free_port, sglang_engine, write_real_profile
from deploy_helpers import REPO, deploy
from hangs import assert_frozen_while_idle_is_restarted, assert_hung_under_load, assert_saturated_is_never_hung
from lifecycle import DEPLOY_S, assert_served_lifecycle, new_shm_segments, shm_entries, up_json
from standin.hubstub import HubStub, repo_from_dir


HANG_S = 20
# restart.drain_s (the stop waits it; SGLang drains on SIGTERM): the restart runs under steady load
# (hangs.restart_drains: every request started before the SIGTERM ends whole)
DRAIN_S = 90
MOST_TOKENS = 2000   # a request's tokens at most: the tiny model's context is 2048
# the one-token probe after ready, quicker than its defaults (30 s, 3, 30 s, 60 s) so the idle freeze ends in ~1 min
PROBE = {"probe_interval_s": 5, "probe_failures": 2, "probe_timeout_s": 10, "probe_exit_grace_s": 15}


def test_real_sglang_up_serves_then_status_logs_restart_down(tmp_path: Path, host: Any) -> None:
    """The model directory is pushed from here (`engine.weights.push`): real SGLang loads deployer's copy under
    the target's workdir, serves it under the directory's name, and its restart loads the same copy."""
    home, port = tmp_path / "home", free_port()
    shm_before, since = shm_entries(), time.time()
    shutil.copytree(MODEL, tmp_path / "models" / "tiny-llama")
    engine = {**sglang_engine(port, tmp_path, enable_metrics=True), "model_path": "models/tiny-llama",
              "weights": {"push": True}}
    # issue 37: the hang rule reads /metrics (--enable-metrics) with a small hang_s; the restart drains
    prof = write_real_profile(tmp_path, host, "tiny-sglang", engine, health={"hang_s": HANG_S, **PROBE},
                              restart={"drain_s": DRAIN_S, "grace_s": 5})
    code, evs, said = up_json(prof, home)
    assert code == 0, said
    pushed = [e for e in evs if "pushed to" in str(e.get("message", ""))]
    assert pushed, said[-3000:]
    record = json.loads((tmp_path / "work" / "tiny-sglang" / "current" / "profile.json").read_text())
    loaded = (record.get("profile") or record)["engine"]["model_path"]
    assert loaded.startswith(str(tmp_path / "work" / ".deployer" / "models")), loaded
    phases = [e["phase"] for e in evs if e["event"] == "phase"]
    assert "loading weights" in phases and "allocating cache" in phases, phases
    report = [e for e in evs if e["event"] == "report"][-1]
    assert report["status"] == "ready" and report["drift"] == [], report
    run_dir = Path(report["run_dir"])
    started = time.monotonic()
    assert phases[0] == "pushing weights", phases   # before anything else happens on the target
    # the pushed directory's name; the restart under load; then its scheduler frozen under load: hung, restarted
    def frozen_under_load() -> None:
        left = [name for name in new_shm_segments(shm_before, since) if not name.startswith("sem.mp-")]  # below
        assert not left, f"left in /dev/shm by the up and the restart: {left}"
        assert_saturated_is_never_hung(prof, home, port, "tiny-llama")   # a busy engine steps: never hung
        assert_hung_under_load(prof, home, host, port, "tiny-llama", "sglang")
        assert_frozen_while_idle_is_restarted(prof, home, host, port, "tiny-llama", "sglang")

    assert_served_lifecycle(prof, home, port, "tiny-llama", phases[1:], drain=(DRAIN_S, MOST_TOKENS),
                            before_down=frozen_under_load)
    assert time.monotonic() - started > 3  # SGLang's real SIGTERM takes ~5 s, twice (restart, down)
    supervisor_log = (tmp_path / "work" / "tiny-sglang" / "current" / "supervisor.log").read_text()
    assert "supervisor done: stopped" in supervisor_log, supervisor_log
    state = json.loads((tmp_path / "work" / "tiny-sglang" / "current" / "state.json").read_text())
    assert state["signal_name"] in (None, "SIGTERM") and state["exit_code"] in (0, None), state  # not SIGKILLed
    # SGLang leaves sglang_loads_*.shm on every run (the supervisor removes it); it also leaves 32-byte sem.mp-*
    # semaphores that no process of its group holds open or maps, after the hung engine's SIGKILL and once after a
    # graceful stop too (seen 2026-12-05; docs/on-call.md): the supervisor cannot tell they are the engine's
    leaked = [name for name in new_shm_segments(shm_before, since) if not name.startswith("sem.mp-")]
    assert not leaked, leaked
    assert run_dir.exists()
    _assert_resolved_offline_once_fetched(tmp_path, host, home, port)


def _assert_resolved_offline_once_fetched(tmp_path: Path, host: Any, home: Path, port: int) -> None:
    """Real SGLang reads the model's config as it resolves its args: for a hub repo deployer fetches, `plan` skips
    the dry resolution until the target's hub cache has the repo (it would download it, or fail offline), then
    resolves offline against the commit fetched. Nothing is launched (plan, prepare)."""
    repo = repo_from_dir("test/tiny-llama", MODEL)
    with HubStub(repo) as hub:
        engine = sglang_engine(port, tmp_path)
        engine["model_path"], engine["weights"] = "test/tiny-llama", {"endpoint": hub.endpoint}
        engine["env"] = {**engine["env"], "HF_HOME": str(tmp_path / "hf")}
        engine["env"].pop("HF_HUB_OFFLINE")
        prof = write_real_profile(tmp_path, host, "fetch-sglang", engine)
        before = json.JSONDecoder().raw_decode(deploy("plan", str(prof), "--json", home=home,
                                                      timeout=DEPLOY_S).stdout.lstrip())[0]
        assert before["resolution"] == "after the fetch" and not before["problems"], before
        prepared = deploy("prepare", str(prof), "--json", home=home, timeout=DEPLOY_S)
        assert prepared.returncode == 0, prepared.stdout[-2000:] + prepared.stderr[-2000:]
        after = json.JSONDecoder().raw_decode(deploy("plan", str(prof), "--json", home=home,
                                                     timeout=DEPLOY_S).stdout.lstrip())[0]
        assert after["resolution"] == "done" and not after["problems"], after
        assert sum(hub.served.values()) == repo.total   # the plans fetched nothing; the engine downloaded nothing


def test_a_port_taken_after_the_check_is_exit_4_in_seconds_not_a_hang(tmp_path: Path, host: Any) -> None:
    """The port is free when deployer checks it; a stray takes it while SGLang loads. Real SGLang then logs
    `[Errno 98] error while attempting to bind ... address already in use` and never exits: deployer gives up
    a few seconds after that line (stall_timeout_s is 120 s here), stops it, and names the port."""
    home, port = tmp_path / "home", free_port()
    prof = write_real_profile(tmp_path, host, "port-sglang", sglang_engine(port, tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", str(prof), "--json", "--skip-preflight"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env={"PATH": "/usr/bin:/bin", "DEPLOYER_HOME": str(home), "HOME": str(Path.home())})
    stray = socket.socket()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the first phase: the engine runs, deployer's port check is behind us
            if '"event": "phase"' in line:
                stray.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                stray.bind(("0.0.0.0", port))
                stray.listen(1)
                break
        taken = time.monotonic()
        out, err = proc.communicate(timeout=DEPLOY_S)
        took = time.monotonic() - taken
    finally:
        stray.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err + out[-3000:]
    assert f"port {port}" in err and "could not bind" in err, err
    assert took < 90, took  # the load (~15-30 s) + 5 s, never stall_timeout_s or startup_timeout_s
    st = deploy("status", str(prof), "--json", home=home, timeout=60)
    assert json.loads(st.stdout)["status"] in ("stopped", "exited"), st.stdout
