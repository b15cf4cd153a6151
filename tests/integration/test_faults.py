"""Faults of `up` over the real sshd: "ready" means this run's engine, push first and stop last, and the version
that was serving comes back when its replacement cannot be started."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import REPO, deploy, events, fill, free_port, write_profile
from deployer.errors import TargetError, TransferFailed
from deployer.profile.loader import load_profile
from deployer.remote.base import Remote
from deployer.remote.connect import connect

pytestmark = pytest.mark.integration


def status_of(prof: Path, home: Path) -> dict[str, Any]:
    proc = deploy("status", str(prof), "--json", home=home)
    data = dict(json.loads(proc.stdout))
    assert (proc.returncode == 0) == data["serving"] and proc.returncode in (0, 5, 6, 8), proc.stderr  # README codes
    return data


def supervisor_state(remote: Remote, run_dir: str) -> dict[str, Any]:
    from deployer.box.push import RunDir
    from deployer.box.process import status

    return status(remote, RunDir(run_dir, os.path.basename(run_dir)))


def stray_server(remote: Remote, port: int, answer: bool = True) -> Any:
    """A plain HTTP server on the target (not a deployment) that takes `port` as soon as it is free; with
    answer=False it only listens and never answers."""
    code = (f"ANSWER = {answer}\n"
            "import http.server, socket, time\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
            "        self.wfile.write(b'ok')\n"
            "    def log_message(self, *a): pass\n"
            "for _ in range(400):\n"
            "    try:\n"
            f"        srv = http.server.HTTPServer(('127.0.0.1', {port}), H); break\n"
            "    except OSError: time.sleep(0.05)\n"
            "print('LISTENING', flush=True)\n"
            "srv.timeout = 0.2\n"
            "end = time.time() + 120\n"
            "while time.time() < end: srv.handle_request() if ANSWER else time.sleep(0.2)\n")
    return remote.spawn(f"exec python3 -B -c {shlex.quote(code)}")


# --- ready means this run's engine -----------------------------------------------------------------------------

def test_two_deployments_on_one_port_at_once_exactly_one_is_ready(tmp_path: Path, sshd: Any) -> None:
    port, home = free_port(), tmp_path / "h"
    slow = {"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.2"}
    a = write_profile(tmp_path, sshd, name="first", port=port, env=slow, workdir=tmp_path / "wa")
    b = write_profile(tmp_path, sshd, name="second", port=port, env=slow, workdir=tmp_path / "wb")
    env = {"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home), "HOME": os.environ.get("HOME", "/root")}
    procs = [subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", str(p), "--skip-preflight"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), env=env)
             for p in (a, b)]
    results = [p.communicate(timeout=120) for p in procs]
    codes = [p.returncode for p in procs]
    try:
        assert sorted(codes) == [0, 4], results
        winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
        names = ("first", "second")
        line = results[loser][1].strip().splitlines()[-1]
        assert line.startswith(f"error: port {port} taken by ") and f"deployment {names[winner]}" in line, line
        assert "Traceback" not in results[loser][1]
        assert status_of((a, b)[winner], home)["healthy"]
        lost = tmp_path / ("wa", "wb")[loser] / names[loser] / "runs"
        for run in lost.iterdir() if lost.exists() else []:  # the loser never claims to have been ready
            outcome = run / "outcome.json"
            assert not outcome.exists() or json.loads(outcome.read_text())["outcome"] != "ready"
    finally:
        for p in (a, b):
            deploy("down", str(p), home=home)


@pytest.mark.parametrize("answer", [True, False], ids=["stray-answers-200", "stray-only-listens"])
def test_a_port_taken_while_the_engine_loads_is_exit_4_naming_the_holder(tmp_path: Path, sshd: Any,
                                                                        answer: bool) -> None:
    """Our engine is still loading when a stray server takes the port: its /health 200 is not our ready (and
    our engine's bind error is not a launch failure to heal): exit 4 naming the holder."""
    port, home = free_port(), tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="notours", port=port,
                         env={"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.5"},
                         extra={"health": {"path": "/", "interval_s": 0.2, "request_timeout_s": 0.5}})
    remote = connect(sshd.spec())
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", str(prof), "--skip-preflight"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home)})
    try:
        runs = tmp_path / "work" / "notours" / "runs"
        deadline = time.monotonic() + 30
        while not list(runs.glob("*/state.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        stray = stray_server(remote, port, answer)  # after our start took the claim, before the engine binds
        assert stray.readline(timeout=20) == "LISTENING"
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 4, err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"error: notours: port {port} taken by pid ") and "(python3)" in line, line
        run = next(runs.iterdir())
        assert json.loads((run / "outcome.json").read_text())["outcome"] == ("port-taken" if answer else "crashed")
        assert supervisor_state(remote, str(run))["status"] in ("stopped", "exited")
        stray.close()
    finally:
        proc.kill()
        remote.close()
        deploy("down", str(prof), home=home)


# --- push first, stop last ---------------------------------------------------------------------------------------

def test_disk_full_leaves_the_old_version_serving(tmp_path: Path, small_disk: Path, fresh_sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, fresh_sshd, name="full", workdir=small_disk / "work")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    before = status_of(prof, home)
    runs = sorted(p.name for p in (small_disk / "work" / "full" / "runs").iterdir())
    fill(small_disk, leave=8 << 10)  # less than any of the supervisor's files
    proc = deploy("up", str(prof), "--skip-preflight", "--set", "engine.args.enable_metrics=true", home=home)
    assert proc.returncode == 4, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: not enough free space on ") and "nothing was changed" in line, line
    after = status_of(prof, home)
    assert after["healthy"] and after["pid"] == before["pid"] and after["run_dir"] == before["run_dir"]
    assert sorted(p.name for p in (small_disk / "work" / "full" / "runs").iterdir()) == runs
    assert not list((small_disk / "work").rglob("__pycache__"))  # the supervisor runs with -B
    down = deploy("down", str(prof), home=home)  # on the full disk too
    assert down.returncode == 0 and "Traceback" not in down.stderr, down.stderr
    gone = status_of(prof, home)
    assert not gone["healthy"] and gone["status"] in ("stopped", "lost"), gone


def in_process_up(prof: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **opts: Any) -> Any:
    from deployer.runner.up import UpOptions, up

    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "h"))
    seen: list[Any] = []
    return up(load_profile(prof, overrides=["engine.args.enable_metrics=true"]),
              UpOptions(skip_preflight=True, **opts), seen.append), seen


def test_a_push_cut_halfway_changes_nothing(tmp_path: Path, sshd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from deployer.remote.conversation import Conversation

    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="cut")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    before = status_of(prof, home)
    real_put_all = Conversation.put_all  # the run dir travels through the helper's `install`

    def cut_put_all(self: Any, files: list[tuple[bytes, str, int]]) -> list[str]:
        if any("/runs/" in path for _, path, _ in files):  # the run dir: three files land, then the link drops
            real_put_all(self, files[:3])
            raise TransferFailed(f"cannot write {files[3][1]}: connection dropped", host=self.label)
        return real_put_all(self, files)

    monkeypatch.setattr(Conversation, "put_all", cut_put_all)
    cut = "push of .* failed, nothing of it kept: .*cannot write .*connection dropped"
    with pytest.raises(TransferFailed, match=cut):
        in_process_up(prof, monkeypatch, tmp_path)
    after = status_of(prof, home)
    assert after["healthy"] and after["pid"] == before["pid"] and after["run_dir"] == before["run_dir"]
    assert [p.name for p in (tmp_path / "work" / "cut" / "runs").iterdir()] == [Path(before["run_dir"]).name]
    deploy("down", str(prof), home=home)


def test_a_failure_after_the_stop_brings_the_previous_version_back(tmp_path: Path, sshd: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from deployer.box import switch as pipeline  # where every start is made (the attempt's, restore's)

    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="back")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    before = status_of(prof, home)
    real_start = pipeline.start

    def failing_start(remote: Remote, run: Any) -> Any:
        if run.path != before["run_dir"]:  # the new version: fails after the old one was stopped
            raise TargetError("supervisor could not start the engine: injected fault")
        return real_start(remote, run)

    monkeypatch.setattr(pipeline, "start", failing_start)
    with pytest.raises(TargetError) as caught:
        in_process_up(prof, monkeypatch, tmp_path)
    message = str(caught.value)
    assert "injected fault" in message and "brought back the previous version" in message
    assert "it is serving again" in message
    after = status_of(prof, home)
    assert after["healthy"] and after["run_dir"] == before["run_dir"]
    assert after["content_hash"] == before["content_hash"] and after["pid"] != before["pid"]
    deploy("down", str(prof), home=home)


# --- go back to what worked (issue 11) ----------------------------------------------------------------------------

def test_a_replacement_that_cannot_start_brings_the_old_version_back(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    good = write_profile(tmp_path, sshd, name="lastgood")
    assert deploy("up", str(good), "--skip-preflight", home=home).returncode == 0
    before = status_of(good, home)
    bad = write_profile(tmp_path, sshd, name="lastgood", env={"STANDIN_MODE": "crash"}, file="bad.yaml",
                        port=before["port"])
    proc = deploy("up", str(bad), "--skip-preflight", "--json", home=home)
    assert proc.returncode == 5, proc.stderr
    *_, report, error = events(proc.stdout)  # a failed --json run ends with its error event, after the report
    assert report["event"] == "report" and error["event"] == "error" and error["code"] == 5, error
    assert report["attempts"][-1]["outcome"] == "crashed"
    assert report["restored"]["status"] == "ready" and report["restored"]["run_id"] == Path(before["run_dir"]).name
    assert "brought back the previous version" in proc.stderr and "it is serving again" in proc.stderr
    assert [e["event"] for e in events(proc.stdout)].count("rollback") == 1
    after = status_of(good, home)
    assert after["healthy"] and after["content_hash"] == before["content_hash"]
    assert after["status"] == "ready" and after["run_dir"] == before["run_dir"]
    human = deploy("up", str(bad), "--skip-preflight", home=home)  # the report says so in words too
    said = " ".join(human.stderr.split())  # the report, then the error line
    assert human.returncode == 5 and said.count("brought back the previous version") == 2, human.stderr
    assert said.count("is serving again") == 3  # the live line, the report, the error line
    deploy("down", str(good), home=home)


# --- supervision -------------------------------------------------------------------------------------------------

def test_a_restart_that_dies_before_ready_is_diagnosed(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="rediag",
                         extra={"restart": {"policy": "on-failure", "grace_s": 3, "backoff_s": [1, 2]}})
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    st = status_of(prof, home)
    remote = connect(sshd.spec())
    try:
        remote.run(f"kill -9 -- -{st['pid']}", timeout=10)  # the engine dies after ready: the policy restarts it
        stray = stray_server(remote, st["port"])  # ...and its restart finds the port taken: dies before ready
        assert stray.readline(timeout=20) == "LISTENING"
        deadline = time.monotonic() + 30
        while supervisor_state(remote, st["run_dir"])["status"] not in ("exited", "crashloop") and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        after = status_of(prof, home)
        assert after["status"] == "exited" and after["restarts"] == 1
        assert after["diagnosis"] is not None and after["diagnosis"]["signature"] == "port-in-use"
        stray.close()
    finally:
        remote.close()
        deploy("down", str(prof), home=home)


def test_up_puts_a_healthy_engine_whose_supervisor_was_killed_back_under_one(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="orphan", extra={"restart": {"policy": "on-failure", "grace_s": 3}})
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    st = status_of(prof, home)
    remote = connect(sshd.spec())
    try:
        sup = supervisor_state(remote, st["run_dir"])["supervisor_pid"]
        remote.run(f"kill -9 {sup}", timeout=10)
        deadline = time.monotonic() + 10
        while supervisor_state(remote, st["run_dir"])["supervisor_alive"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status_of(prof, home)["healthy"]  # serving, but nobody would restart it
        again = deploy("up", str(prof), "--skip-preflight", "--json", home=home)
        assert again.returncode == 0, again.stderr
        warned = [e["message"] for e in events(again.stdout) if e["event"] == "warning"]
        assert any("its supervisor" in m and "is gone" in m and "under a new supervisor" in m for m in warned)
        now = status_of(prof, home)
        assert now["healthy"] and now["content_hash"] == st["content_hash"] and now["pid"] != st["pid"]
        assert supervisor_state(remote, now["run_dir"])["supervisor_alive"]
    finally:
        remote.close()
        deploy("down", str(prof), home=home)


def damage(run: Path) -> None:
    for name in ("supervise.py", "supervise_guard.py"):  # the run dir's programs
        (run / name).write_bytes((run / name).read_bytes()[:100])  # truncated, as on a full disk
    (run / "supervise.json").unlink()


def test_on_call_commands_work_on_a_run_whose_payload_is_damaged(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="damaged")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    first = status_of(prof, home)
    damage(Path(first["run_dir"]))
    st = status_of(prof, home)
    assert st["status"] == "ready" and st["healthy"]
    restarted = deploy("restart", str(prof), home=home)
    assert restarted.returncode == 0 and "Traceback" not in restarted.stderr, restarted.stderr
    now = status_of(prof, home)
    assert now["healthy"] and now["run_dir"] != first["run_dir"] and now["content_hash"] == first["content_hash"]
    damage(Path(now["run_dir"]))
    down = deploy("down", str(prof), home=home)
    assert down.returncode == 0 and "Traceback" not in down.stderr, down.stderr
    assert status_of(prof, home)["status"] == "stopped"
