"""The supervisor payload on a real target (over the real sshd): a deployment holds it once, named by its sha256
(`<deployment>/payload/<sha256>.py`); its run dirs and root hold small entry files that name that hash; a restart
pushes no second copy; retention keeps every payload a kept run, the root or this deployer names, and one written
within the hour, and deletes the others."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, write_profile
from deployer.remote.program import payload_bundle
from deployer.supervisor.files import named_payload
from test_secrets_e2e import oncall

pytestmark = pytest.mark.integration

HOURS_AGO = time.time() - 2 * 3600


def _left_by_an_older_deployer(root: Path, digest: str, age: float) -> Path:
    """A payload file of another version under payload/, written `age` seconds ago."""
    path = root / "payload" / f"{digest}.py"
    path.write_bytes(b"# another deployer's payload\n")
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_a_deployment_holds_the_payload_once_and_retention_keeps_what_its_runs_name(tmp_path: Path,
                                                                                    sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="pay")
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "laptop").returncode == 0
    root = tmp_path / "work" / "pay"
    digest = payload_bundle()[1]
    mine = root / "payload" / f"{digest}.py"
    assert hashlib.sha256(mine.read_bytes()).hexdigest() == digest and mine.stat().st_mode & 0o777 == 0o644
    first = (root / "current").resolve()
    for entry in (first / "supervise.py", first / "supervise_guard.py", root / "supervise.py",
                  root / "supervise_lease.py"):
        assert named_payload(entry.read_bytes()) == digest and entry.stat().st_size < 2000
    written = mine.stat().st_mtime_ns
    assert oncall(sshd, tmp_path, "restart", "pay").returncode == 0
    assert mine.stat().st_mtime_ns == written   # the second run names the same payload: no second copy

    # an older deployer's run (kept while it is among the newest) and what other versions left
    old_run = root / "runs" / "20200101T000000.000000Z-0ldc0de0-a1"
    old_run.mkdir()
    (old_run / "supervise.py").write_text(f"PAYLOAD = {'0' * 64!r}\n")
    (old_run / "state.json").write_text(json.dumps({"status": "stopped"}))
    named = _left_by_an_older_deployer(root, "0" * 64, 7200)
    stray = _left_by_an_older_deployer(root, "1" * 64, 7200)
    fresh = _left_by_an_older_deployer(root, "2" * 64, 60)   # another deployer's push may be about to name it

    pruned = oncall(sshd, tmp_path, "prune", "pay", "--keep", "5")
    assert pruned.returncode == 0, pruned.stderr
    assert f"deleted the supervisor payload {'1' * 12} (nothing names it)" in pruned.stdout, pruned.stdout
    assert not stray.exists() and named.exists() and fresh.exists() and mine.exists()

    pruned = oncall(sshd, tmp_path, "prune", "pay", "--keep", "1", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["drop_payloads"] == ["0" * 64]
    assert not old_run.exists() and not named.exists() and fresh.exists() and mine.exists()
    status = oncall(sshd, tmp_path, "status", "pay", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["healthy"], status.stdout
    assert oncall(sshd, tmp_path, "down", "pay").returncode == 0
