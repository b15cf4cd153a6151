"""Issue 22 finding 9c: a deployer upgrade while deployments run. A deployment made by the previous release
(its own code, taken from git: its helper, its supervisor payload in the run dir, its records, its lock and its
port claim) is read, restarted and stopped by this release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import REPO, write_profile
from test_oncall import oncall

pytestmark = pytest.mark.integration

PREVIOUS_RELEASE = "092fdd2"  # the release before issue 22's changes to the supervisor and its records


def previous_release(into: Path) -> Path:
    """The previous release's deployer package, from git (`git archive`), unpacked under `into`."""
    archive = into / "previous.tar"
    with archive.open("wb") as out:
        made = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS_RELEASE, "deployer"],
                              stdout=out, stderr=subprocess.PIPE, timeout=60)
    assert made.returncode == 0, f"the previous release {PREVIOUS_RELEASE} is not in this checkout's git: " \
                                 f"{made.stderr.decode()[:300]}"
    with tarfile.open(archive) as tar:
        tar.extractall(into / "previous", filter="data")
    return into / "previous"


def old_deploy(old: Path, *argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEPLOYER_HOME": str(home), "PYTHONPATH": str(old),
           "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True,
                          timeout=180, env=env, cwd=str(old))


def test_a_deployment_of_the_previous_release_works_with_this_one(tmp_path: Path, sshd: Any) -> None:
    old = previous_release(tmp_path)
    assert "stable_at" not in (old / "deployer" / "supervisor" / "supervise_daemon.py").read_text()  # really old
    prof = write_profile(tmp_path, sshd, name="upg")
    made = old_deploy(old, "up", str(prof), "--skip-preflight", "--json", home=tmp_path / "old-laptop")
    assert made.returncode == 0, made.stderr[-2000:]
    run_dir = Path(json.loads(made.stdout.splitlines()[-1])["run_dir"])
    assert "stable_at" not in (run_dir / "supervise_daemon.py").read_text()  # the run dir has the old payload

    status = oncall(sshd, tmp_path, "status", "upg", "--json")
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)
    assert row["status"] == "ready" and row["healthy"] and row["run_dir"] == str(run_dir)
    hist = json.loads(oncall(sshd, tmp_path, "history", "upg", "--json").stdout)
    assert hist[0]["outcome"] == "ready" and hist[0]["good"] is True  # an old record: ready, no crash since

    again = oncall(sshd, tmp_path, "restart", "upg", "--json")  # the old lock, port claim and run dir
    assert again.returncode == 0, again.stderr + again.stdout[-2000:]
    now = json.loads(oncall(sshd, tmp_path, "status", "upg", "--json").stdout)
    assert now["healthy"] and now["run_dir"] != str(run_dir) and now["content_hash"] == row["content_hash"]
    assert json.loads((run_dir / "state.json").read_text())["status"] == "stopped"

    down = oncall(sshd, tmp_path, "down", "upg")
    assert down.returncode == 0 and "upg: stopped on" in down.stdout, down.stdout + down.stderr
    assert oncall(sshd, tmp_path, "status", "upg").returncode == 8


def test_this_release_stops_a_running_deployment_of_the_previous_one(tmp_path: Path, sshd: Any) -> None:
    old = previous_release(tmp_path)
    prof = write_profile(tmp_path, sshd, name="upg2")
    made = old_deploy(old, "up", str(prof), "--skip-preflight", home=tmp_path / "old-laptop")
    assert made.returncode == 0, made.stderr[-2000:]
    down = oncall(sshd, tmp_path, "down", "upg2")
    assert down.returncode == 0 and "upg2: stopped on" in down.stdout, down.stdout + down.stderr
    code = oncall(sshd, tmp_path, "status", "upg2")
    assert code.returncode == 8, code.stdout
    back = old_deploy(old, "up", str(prof), "--skip-preflight", home=tmp_path / "old-laptop")  # and back again
    assert back.returncode == 0, back.stderr[-2000:]
    assert oncall(sshd, tmp_path, "down", "upg2").returncode == 0
