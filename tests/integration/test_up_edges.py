"""`deploy up` edge cases over the real sshd: replace, disconnect, lock, port, host keys, auth, reachability."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, free_port, write_profile
from deployer.box.lock import DeploymentLock
from deployer.profile.loader import load_profile
from deployer.remote.connect import connect
from sshbed import keygen

pytestmark = pytest.mark.integration


def one_line_error(proc: Any) -> str:
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines and lines[-1].startswith("error: "), proc.stderr
    return str(lines[-1])


def test_changed_profile_replaces_the_running_version(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="replace")
    first = deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    assert first.returncode == 0, first.stderr
    old_pid = json.loads(deploy("status", str(prof), "--json", home=home).stdout)["pid"]
    # with preflight: the port is held by our own running version, which `up` stops first
    second = deploy("up", str(prof), "--json", "--set", "engine.args.enable_metrics=true", home=home)
    assert second.returncode == 0, second.stderr
    msgs = [e.get("message", "") for e in events(second.stdout) if e["event"] == "info"]
    assert any(m.startswith("stopping the running version") for m in msgs)
    st = json.loads(deploy("status", str(prof), "--json", home=home).stdout)
    assert st["healthy"] and st["pid"] != old_pid
    assert events(second.stdout)[-1]["replaced"]
    deploy("down", str(prof), home=home)


def test_engine_survives_the_ssh_session_that_started_it(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="survive")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    profile = load_profile(prof)
    # the `up` process and its SSH session are gone; a new connection finds the engine serving
    remote = connect(sshd.spec())
    try:
        assert remote.request("GET", profile.engine.port, "/health", timeout=5).status == 200
        reply = remote.request("POST", profile.engine.port, "/v1/chat/completions", timeout=5,
                               body=b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}',
                               headers={"Content-Type": "application/json"})
        assert reply.status == 200 and json.loads(reply.body)["choices"][0]["message"]["content"]
    finally:
        remote.close()
    deploy("down", str(prof), home=home)


def test_second_operation_is_refused_while_locked(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="locked")
    profile = load_profile(prof)
    remote = connect(sshd.spec())
    try:
        from deployer.box.push import layout_for, prepare

        layout = layout_for(remote, profile)
        prepare(remote, layout)
        with DeploymentLock(remote, layout, "test holder"):
            t0 = time.monotonic()
            proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
            assert proc.returncode == 4 and time.monotonic() - t0 < 20
            line = one_line_error(proc)
            assert "locked by" in line and "test holder" in line and " since " in line
        # released with the channel: now it goes through
        ok = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
        assert ok.returncode == 0, ok.stderr
    finally:
        remote.close()
    deploy("down", str(prof), home=tmp_path / "h")


def test_busy_port_is_a_clear_error_before_start(tmp_path: Path, sshd: Any) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        prof = write_profile(tmp_path, sshd, name="busy", port=port)
        proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert proc.returncode == 4
    assert f"port {port} taken by " in one_line_error(proc)


def test_unknown_host_key_refused_then_trusted_on_request(tmp_path: Path, sshd: Any) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    prof = write_profile(tmp_path, sshd, name="hostkey", extra={"target": {**sshd.target(tmp_path / "w"),
                                                                          "known_hosts": str(empty)}})
    proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert proc.returncode == 3 and "--trust-new-host" in one_line_error(proc)
    ok = deploy("up", str(prof), "--skip-preflight", "--trust-new-host", home=tmp_path / "h")
    assert ok.returncode == 0, ok.stderr
    assert f"[127.0.0.1]:{sshd.port}" in empty.read_text()
    assert deploy("down", str(prof), home=tmp_path / "h").returncode == 0  # recorded: no flag needed now


def test_changed_host_key_is_always_refused(tmp_path: Path, sshd: Any) -> None:
    other = keygen(tmp_path / "other_host_key")
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {Path(str(other) + '.pub').read_text().split()[0]} "
                     f"{Path(str(other) + '.pub').read_text().split()[1]}\n")
    prof = write_profile(tmp_path, sshd, name="mitm", extra={"target": {**sshd.target(tmp_path / "w"),
                                                                       "known_hosts": str(wrong)}})
    for extra in ([], ["--trust-new-host"]):
        proc = deploy("up", str(prof), "--skip-preflight", *extra, home=tmp_path / "h")
        assert proc.returncode == 3
        assert "man-in-the-middle" in one_line_error(proc)


def test_wrong_key_is_an_auth_failure_not_retried(tmp_path: Path, sshd: Any) -> None:
    stranger = keygen(tmp_path / "stranger")
    prof = write_profile(tmp_path, sshd, name="auth", extra={"target": {**sshd.target(tmp_path / "w"),
                                                                       "identity_file": str(stranger)}})
    t0 = time.monotonic()
    proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert proc.returncode == 3 and time.monotonic() - t0 < 15
    assert "auth" in one_line_error(proc).lower()


def test_closed_port_fails_fast_and_clearly(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="unreach", extra={"target": {**sshd.target(tmp_path / "w"),
                                                                          "port": free_port()}})
    t0 = time.monotonic()
    proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert proc.returncode == 3 and time.monotonic() - t0 < 40
    line = one_line_error(proc)
    assert "127.0.0.1" in line


def test_workdir_not_writable(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="nowrite", workdir=Path("/proc/deployer-cannot-write-here"))
    proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert proc.returncode == 4 and "cannot create" in one_line_error(proc)


def test_missing_engine_python(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="nopython",
                         extra={"engine": {"python": "/opt/nowhere/bin/python", "model_path": "m",
                                           "port": free_port(), "env": {}}})
    proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert proc.returncode == 4
    assert "engine python /opt/nowhere/bin/python not found" in one_line_error(proc)
    checked = deploy("up", str(prof), home=tmp_path / "h")  # preflight finds it among its facts
    assert checked.returncode == 4
    assert "engine python '/opt/nowhere/bin/python' not found" in one_line_error(checked)


def test_bad_profile_changes_nothing_on_the_target(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="bad", workdir=tmp_path / "untouched")
    prof.write_text(prof.read_text().replace("kind: sglang", "kind: sglang\n  prot: 1"))
    proc = deploy("up", str(prof), home=tmp_path / "h")
    assert proc.returncode == 2 and "did you mean 'port'" in one_line_error(proc)
    assert not (tmp_path / "untouched").exists()


def test_plan_that_cannot_fit_is_refused_before_launch_with_the_fix(tmp_path: Path, sshd: Any) -> None:
    from deploy_helpers import REPO

    prof = write_profile(tmp_path, sshd, name="toobig", model="Qwen/Qwen3-Next-80B-A3B-Instruct")
    model = REPO / "tests" / "fixtures" / "models" / "qwen3-next-80b-a3b"
    proc = deploy("up", str(prof), "--model-config", str(model), home=tmp_path / "h")
    assert proc.returncode == 4
    line = one_line_error(proc)
    assert "leave no memory for the KV cache" in line and "would fit: tp_size 2 on 2 GPUs" in line
    runs = tmp_path / "work" / "toobig" / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # nothing was launched


def test_ctrl_c_during_watch_releases_the_lock_and_says_what_runs(tmp_path: Path, sshd: Any) -> None:
    import os
    import select
    import signal
    import subprocess
    import sys

    from deploy_helpers import REPO

    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="ctrlc", env={"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.5"})
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", str(prof), "--json", "--skip-preflight"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO),
                            env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home)})
    assert proc.stdout is not None
    # Wait for a real condition, not a time: the watch has seen the engine loading its weights (so `up` is in the
    # watch, past the start), read event by event.
    loading = b'"phase": "loading weights"'
    got, deadline = b"", time.monotonic() + 60
    while loading not in got and time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1)[0]:
            got += os.read(proc.stdout.fileno(), 65536)
    assert loading in got, got.decode(errors="replace")[-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"interrupted" in err and b"Traceback" not in err, err
    status = deploy("status", str(prof), "--json", home=home)  # what the line says keeps running does
    assert json.loads(status.stdout)["status"] in ("running", "ready"), status.stdout + status.stderr
    # The lock went with the session. sshd ends the lock holder when it notices the closed connection, which on a
    # loaded machine may take a moment: retry only while the answer is "locked" (exit 4), for a bounded time.
    again, deadline = deploy("up", str(prof), "--skip-preflight", home=home), time.monotonic() + 30
    while again.returncode == 4 and "locked" in again.stderr and time.monotonic() < deadline:
        again = deploy("up", str(prof), "--skip-preflight", home=home)
    assert again.returncode == 0, again.stderr
    deploy("down", str(prof), home=home)
