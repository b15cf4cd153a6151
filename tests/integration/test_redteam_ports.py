"""Red team, issue #34 finding 4: another user squats the engine port, and deployer names who.

The squatter is the real `nobody` (setpriv) running a tiny HTTP server that answers /health with 200, on the port
of a deployment of root's: before `up` (its failure names the holder: pid and user, from /proc/net/tcp and the
/proc/*/fd inodes), and in a crash's restart backoff (status must not call the squatter's answer healthy).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import waiting
from deploy_helpers import deploy, free_port, write_profile
from test_redteam_local import NOBODY, arena

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                       reason="the red team needs root (to be the victim) and setpriv (to be nobody)"),
]
__all__ = ["arena"]  # a fixture, used by name


class Squatter:
    """nobody's HTTP server on 127.0.0.1:`port`, answering GET /health with 200."""

    def __init__(self, arena: Path, port: int) -> None:
        root = arena / "squat"
        root.mkdir(mode=0o755, exist_ok=True)
        root.chmod(0o755)
        (root / "health").write_text("ok\n")
        (root / "health").chmod(0o644)
        self.proc = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "/usr/bin/python3",
             "-m", "http.server", "--bind", "127.0.0.1", str(port)],
            cwd=str(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.port = port
        waiting.wait_for(self._answers, "the squatter listening", 10, poll_s=0.05)

    def _answers(self) -> bool:
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=5)


@pytest.fixture()
def squat(arena: Path) -> Iterator[list[Squatter]]:
    made: list[Squatter] = []
    try:
        yield made
    finally:
        for s in made:
            s.stop()


def test_up_on_a_squatted_port_names_the_squatters_pid_and_user(tmp_path: Path, sshd: Any, arena: Path,
                                                               squat: list[Squatter]) -> None:
    port = free_port()
    squat.append(Squatter(arena, port))
    prof = write_profile(tmp_path, sshd, name="demo", workdir=tmp_path / "work", port=port)
    proc = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h", timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert f"pid {squat[0].proc.pid} (python3) of user nobody" in errors[0] or \
        "of user nobody" in errors[0], errors[0]


def _kill_engine(run_dir: str) -> int:
    """SIGKILL every process of the run's engine (found by DEPLOYER_RUN_DIR in its environment: the target's sshd
    runs in a PID namespace of its own, so the pid status gives is not ours to kill)."""
    want, killed = f"DEPLOYER_RUN_DIR={run_dir}".encode(), 0
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            continue
    return killed


def _row(tmp_path: Path, prof: Path) -> tuple[int, dict[str, Any]]:
    proc = deploy("status", str(prof), "--json", home=tmp_path / "h")
    data = json.loads(proc.stdout)
    rows = data if isinstance(data, list) else data.get("deployments", [data])
    return proc.returncode, rows[0]


def test_status_in_a_restart_backoff_never_calls_a_squatter_healthy(tmp_path: Path, sshd: Any, arena: Path,
                                                                    squat: list[Squatter]) -> None:
    port = free_port()
    prof = write_profile(tmp_path, sshd, name="demo", workdir=tmp_path / "work", port=port,
                         extra={"restart": {"grace_s": 3, "policy": "on-failure", "backoff_s": [60, 60],
                                            "on_boot": False}})
    up = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h", timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        code, row = _row(tmp_path, prof)
        assert code == 0 and row["healthy"] is True, row
        assert _kill_engine(row["run_dir"]) > 0  # the engine dies (as the OOM killer would kill it)
        waiting.wait_for(lambda: _row(tmp_path, prof)[1]["status"] == "restarting", "the backoff", 20, poll_s=0.2)
        squat.append(Squatter(arena, port))
        code, row = _row(tmp_path, prof)
        assert row["healthy"] is False and code != 0, (code, row)
        assert "of user nobody" in row["unhealthy"]["reason"], row
        text = deploy("status", str(prof), home=tmp_path / "h")
        assert "of user nobody" in text.stdout and "(not healthy" in text.stdout, text.stdout
    finally:
        deploy("down", str(prof), "--break-lock", home=tmp_path / "h", timeout=60)


def test_the_holder_is_named_by_pid_and_user_where_proc_shows_it(arena: Path, squat: list[Squatter]) -> None:
    """In the squatter's own PID namespace its fds can be read (as root): pid, command and user; the supervisor's
    listener check says the same and never calls it ours."""
    from deployer.supervisor import ports

    port = free_port()
    squat.append(Squatter(arena, port))
    named = f"pid {squat[0].proc.pid} (python3) of user nobody"
    assert ports.port_holders(port) == [named]
    assert ports.listener_of(port, os.getpgid(0)) == {"port": port, "ours": False, "holders": [named]}
