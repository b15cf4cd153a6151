"""Red team, issue #34 finding 1: local root through a symlinked deployment dir.

The workdir lives in a world-writable sticky directory (as /tmp is). The other user (the real `nobody`, through
setpriv) plants `<workdir>/<name>`, or the not-yet-existing workdir itself, as a symlink to a root-owned 0700
directory: checks that stat through links accept it, and later that user re-points the link at a tree of its own
whose `runs/<id>/launch.sh` the supervisor's restart would exec as root. Paths on the target are now walked a
component at a time without following a link another user controls (base._Walk), and the supervisor runs
everything of a run relative to the directory it opened and checked once (its cwd), never by the path again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import waiting
from deploy_helpers import deploy, write_profile
from test_redteam_local import NOBODY, PWNED, Victim, arena, as_nobody, refused, up_refused, victim
from test_supervise_bash import LAUNCH, READY, sup

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                       reason="the red team needs root (to be the victim) and setpriv (to be nobody)"),
]
__all__ = ["arena", "victim"]  # fixtures, used by name


def _root_only_dir(arena: Path) -> Path:
    """A root-owned 0700 directory: what the planted link points at while `up` looks."""
    d = arena / "rootonly"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    return d


def _sticky(arena: Path) -> Path:
    d = arena / "sticky"
    d.mkdir()
    d.chmod(0o1777)
    return d


def test_a_deployment_dir_planted_as_a_link_in_a_sticky_workdir_is_refused(tmp_path: Path, sshd: Any,
                                                                             arena: Path, victim: Victim) -> None:
    workdir, rootonly = _sticky(arena), _root_only_dir(arena)
    planted = as_nobody(f"ln -s {rootonly} {workdir}/demo")
    assert planted.returncode == 0 and os.path.islink(workdir / "demo"), planted.stderr
    line = up_refused(tmp_path, sshd, workdir)
    assert f"{workdir}/demo is a symbolic link (owned by nobody)" in line, line
    assert os.listdir(rootonly) == []  # nothing was made through the link
    assert victim.unchanged()


def test_a_workdir_planted_as_a_link_is_refused(tmp_path: Path, sshd: Any, arena: Path, victim: Victim) -> None:
    shared, rootonly = _sticky(arena), _root_only_dir(arena)
    planted = as_nobody(f"ln -s {rootonly} {shared}/w")
    assert planted.returncode == 0 and os.path.islink(shared / "w"), planted.stderr
    line = up_refused(tmp_path, sshd, shared / "w")
    assert f"{shared}/w is a symbolic link" in line and "owned by nobody" in line, line
    assert os.listdir(rootonly) == []
    assert victim.unchanged()


EVIL_LAUNCH = "echo {pwned} by the re-pointed launch.sh >> {victim}\nexec sleep 30\n"
ENGINE = f"import time\nprint({READY!r}, flush=True)\nfor _ in range(600):\n    time.sleep(0.1)\n"


def _run_dir(parent: Path, launch: str) -> Path:
    run = parent / "demo" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "launch.sh").write_text(launch)
    (run / "launch.sh").chmod(0o700)
    (run / "engine.py").write_text(ENGINE)
    (run / "env").write_text("\n")
    cfg = {"launch": "launch.sh", "env_file": "env", "log": "engine.log", "grace_s": 1, "ready_pattern": READY,
           "restart": {"policy": "always", "max": 3, "backoff_s": [0.2, 0.2], "window_s": 60}}
    (run / "supervise.json").write_text(json.dumps(cfg))
    return run


def _state(run: Path) -> dict[str, Any]:
    proc = sup("status", str(run))
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_a_supervisor_never_starts_through_another_users_link(arena: Path, victim: Victim) -> None:
    """The run dir reached through nobody's link in a sticky directory: `supervise.py start` refuses it."""
    shared, real = _sticky(arena), arena / "real"
    _run_dir(real, LAUNCH)
    assert as_nobody(f"ln -s {real}/demo {shared}/demo").returncode == 0
    proc = sup("start", str(shared / "demo" / "runs" / "r1"))
    try:
        assert proc.returncode == 77, (proc.returncode, proc.stdout, proc.stderr)
        assert f"{shared}/demo is a symbolic link owned by nobody" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    finally:
        sup("stop", str(real / "demo" / "runs" / "r1"), "--grace", "0.2")
    assert victim.unchanged()


def test_a_restart_never_execs_through_a_repointed_link(arena: Path, victim: Victim) -> None:
    """A run dir reached through a link the checks allow (root's, above the run dir) is started; the link is then
    re-pointed at a tree whose launch.sh writes the victim, and the engine dies (as the OOM killer would kill it):
    the restart runs nothing from the new tree, and the run ends saying why."""
    good, evil = arena / "good", arena / "evil"
    _run_dir(good, LAUNCH)
    _run_dir(evil, EVIL_LAUNCH.format(pwned=PWNED, victim=victim.path))
    link = arena / "w"
    link.symlink_to(good)
    run = link / "demo" / "runs" / "r1"
    started = sup("start", str(run), timeout=15)
    assert started.returncode == 0, started.stderr
    try:
        first = waiting.wait_for(lambda: _state(run) if _state(run)["status"] == "ready" else None,
                                 "the engine ready", 20, poll_s=0.05)
        tmp = arena / "w.new"
        tmp.symlink_to(evil)
        os.replace(tmp, link)  # re-pointed
        assert os.readlink(link) == str(evil)
        os.killpg(first["pgid"], signal.SIGKILL)
        real = good / "demo" / "runs" / "r1"
        ended = waiting.wait_for(lambda: _state(real) if _state(real)["status"] not in ("ready", "running",
                                                                                       "restarting") else None,
                                 "the run's end", 20, poll_s=0.05)
        assert ended["status"] == "exited", ended
        time.sleep(0.5)  # a restart that went through would have written the victim by now
        assert victim.unchanged()
        assert "now leads to another directory" in (real / "supervisor.log").read_text()
        assert not (evil / "demo" / "runs" / "r1" / "engine.log").exists()
    finally:
        sup("stop", str(good / "demo" / "runs" / "r1"), "--grace", "0.2")
        sup("stop", str(evil / "demo" / "runs" / "r1"), "--grace", "0.2")
    assert victim.unchanged()


def _engine_pids(run_root: Path) -> list[int]:
    """Processes whose environment names a run dir of the deployment (the sshd bed has a PID namespace of its own:
    the pids status gives are not this test's)."""
    want, found = f"DEPLOYER_RUN_DIR={run_root}/runs/".encode(), []
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if any(e.startswith(want) for e in f.read().split(b"\0")):
                    found.append(pid)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("spoil", ["chmod-777", "chown-nobody"])
def test_down_stops_what_deployer_started_after_its_path_became_unsafe(tmp_path: Path, sshd: Any, arena: Path,
                                                                       spoil: str) -> None:
    """After `up`, the workdir becomes one another user controls (made world-writable, or handed to nobody): `down`
    still stops the engine and its supervisor (found by their processes, not by what the directory says), says the
    path is unsafe in one line, and reads or runs nothing there."""
    workdir = arena / "w"
    workdir.mkdir(mode=0o755)
    prof = write_profile(tmp_path, sshd, name="demo", workdir=workdir,
                         extra={"restart": {"grace_s": 3, "on_boot": False}})
    up = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h", timeout=120)
    assert up.returncode == 0, up.stderr
    assert _engine_pids(workdir / "demo")
    try:
        if spoil == "chmod-777":
            workdir.chmod(0o777)
        else:
            os.chown(workdir, NOBODY, NOBODY)
        gone = deploy("down", str(prof), home=tmp_path / "h", timeout=90)
        line = refused(gone)
        assert "unsafe deployment dir" in line and str(workdir) in line and "stopped" in line, line
        waiting.wait_for(lambda: not _engine_pids(workdir / "demo"), "the engine gone", 10, poll_s=0.1)
    finally:
        os.chown(workdir, 0, 0)
        workdir.chmod(0o755)
        deploy("down", str(prof), "--break-lock", home=tmp_path / "h", timeout=60)


def test_rescue_finds_only_our_own_processes(arena: Path) -> None:
    """`down`'s rescue picks processes by what their argv and environment say: only this user's are believed
    (another user can put any run dir in its own process's environment and argv)."""
    from deployer.supervisor import supervise as sv

    root = arena / "w" / "demo"
    env = {"PATH": os.environ["PATH"], "DEPLOYER_RUN_DIR": f"{root}/runs/r1"}
    sleeper = ["/usr/bin/python3", "-c", "import time; time.sleep(30)", "supervise.py", "start", f"{root}/runs/r1"]
    theirs = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                               *sleeper], env=env, start_new_session=True)
    ours = subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(30)"], env=env,
                            start_new_session=True)
    try:
        waiting.wait_for(lambda: os.path.exists(f"/proc/{theirs.pid}/environ") and os.stat(
            f"/proc/{theirs.pid}").st_uid == NOBODY, "nobody's process", 10, poll_s=0.05)
        daemons, groups = sv.deployment_processes(str(root))
        assert theirs.pid not in daemons and theirs.pid not in groups
        assert ours.pid in groups
    finally:
        for p in (theirs, ours):
            p.kill()
            p.wait(timeout=5)
