"""Unit tests of the supervisor's port side: the host-wide port claim, and whose listener a port has."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployer.supervisor import supervise as sv
from deployer.supervisor import ports
from sshbed import free_port
from payload import payload_program

SUPERVISE = payload_program("supervise.py")  # the program a run dir holds
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-B", str(SUPERVISE), *args], capture_output=True, text=True, timeout=20)


def test_a_claimed_port_cannot_be_claimed_again_and_names_its_holder() -> None:
    port = free_port()
    fd = ports.claim_port(port, "/work/a/runs/r1", "alpha")
    try:
        with pytest.raises(ports.PortTaken, match=f"port {port} taken by deployment alpha \\(/work/a/runs/r1\\)"):
            ports.claim_port(port, "/other/b/runs/r2", "beta")
        assert ports.claimed_by(port) == "deployment alpha (/work/a/runs/r1)"
        busy = cli("ports", str(port))  # nothing listens yet, but the port is claimed: busy
        assert busy.returncode == 1 and "deployment alpha" in busy.stdout
    finally:
        os.close(fd)
    assert ports.claimed_by(port) is None
    os.close(ports.claim_port(port, "/other/b/runs/r2", "beta"))  # released with its descriptor
    assert cli("ports", str(port)).returncode == 0


def test_the_claim_lives_as_long_as_a_process_that_inherited_it() -> None:
    port = free_port()
    fd = ports.claim_port(port, "/w/runs/r", "inherit")
    os.set_inheritable(fd, True)
    child = subprocess.Popen(["sleep", "30"], pass_fds=(fd,))
    os.close(fd)
    try:
        assert ports.claimed_by(port) == "deployment inherit (/w/runs/r)"
    finally:
        child.kill()
        child.wait(timeout=5)
    assert ports.claimed_by(port) is None


def _server(port: int) -> subprocess.Popen[bytes]:
    """A listener in its own process group (as the supervisor starts an engine)."""
    code = ("import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(30)")
    proc = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_listener_is_ours_only_for_a_process_of_the_runs_group(tmp_path: Path) -> None:
    port = free_port()
    server = _server(port)
    try:
        (tmp_path / "state.json").write_text(json.dumps({"pgid": server.pid}))
        ours = json.loads(cli("listener", str(tmp_path), str(port)).stdout)
        assert ours["ours"] is True and ours["holders"] == []
        (tmp_path / "state.json").write_text(json.dumps({"pgid": os.getpgid(0)}))  # another run's group
        other = json.loads(cli("listener", str(tmp_path), str(port)).stdout)
        assert other["ours"] is False and other["holders"] == [f"pid {server.pid} (python3) of user {ports.user_name(os.geteuid())}"]
    finally:
        server.kill()
        server.wait(timeout=5)
    deadline = time.monotonic() + 5
    while ports.listening_inodes(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    nobody = json.loads(cli("listener", str(tmp_path), str(port)).stdout)
    assert nobody == {"holders": [], "ours": None, "port": port}


def test_start_refuses_a_claimed_port_and_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "launch.sh").write_text("exec sleep 30\n")
    (tmp_path / "supervise.json").write_text(json.dumps({"env_file": None, "port": port, "name": "late"}))
    fd = ports.claim_port(port, "/w/early/runs/r0", "early")
    try:
        proc = cli("start", str(tmp_path))
    finally:
        os.close(fd)
    assert proc.returncode == 75
    assert proc.stderr == f"supervise: port {port} taken by deployment early (/w/early/runs/r0)\n"
    assert not (tmp_path / "state.json").exists()


def test_a_claim_file_of_the_previous_release_is_honoured_read_only(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgrade: a supervisor of the previous release holds its flock on <dir>/<port>; the new claim refuses the
    port naming it, never writes the file, and a symlink or a free file there changes nothing."""
    import fcntl

    legacy = tmp_path / "deployer-ports"
    legacy.mkdir()
    monkeypatch.setattr(ports, "LEGACY_CLAIM_DIR", str(legacy))
    port = free_port()
    old = legacy / str(port)
    note = json.dumps({"port": port, "run_dir": "/w/old/runs/r0", "name": "old", "pid": 1})
    old.write_text(note)
    with open(old) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ports.PortTaken, match=f"port {port} taken by deployment old \\(/w/old/runs/r0\\)"):
            ports.claim_port(port, "/w/new/runs/r1", "new")
        assert ports.claimed_by(port) == "deployment old (/w/old/runs/r0)"
    assert old.read_text() == note  # never written
    os.close(ports.claim_port(port, "/w/new/runs/r1", "new"))  # its holder gone: free
    old.unlink()
    old.symlink_to(tmp_path / "elsewhere")
    os.close(ports.claim_port(port, "/w/new/runs/r1", "new"))
    assert not (tmp_path / "elsewhere").exists()


def test_a_notes_words_lose_controls_and_bidi_overrides() -> None:
    """Issue 34: target text shown as one line: C0/C1 controls and the bidi controls become '?'."""
    assert ports._clean("dep\u202eolyer\x1b[2J\u2066x\u2069\u200e\u200f") == "dep?olyer?[2J?x???"
