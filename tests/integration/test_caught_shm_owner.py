"""The supervisor's /dev/shm clean-up removes what the engine left there only when it is this user's own file
(deployer/supervisor/daemon.py `ShmLedger`): another user's file the engine held open survives it
(issue 33's audit: no test put another user's file there).

The target is the real sshd with a /dev/shm of its own (`private_shm`: a tmpfs in its mount namespace, as a
separate host has), so nothing here touches this machine's /dev/shm. The other user is the real unprivileged
`nobody`, who writes its file there through `nsenter` + `setpriv` before the deployment starts. The engine is the
stand-in, started through a stand-in `python` that opens both files (the deploying user's, which it creates, and
nobody's) and keeps them open across the exec of the real interpreter; `deploy down` ends the group and the
supervisor cleans up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deploy_helpers import deploy, write_profile
from sshbed import SSHD, make_sshd

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("nsenter")
                                                 and shutil.which("unshare")),
                       reason="needs root (a private /dev/shm for the sshd), setpriv (to be nobody) and nsenter"),
]

NOBODY = 65534
OURS, THEIRS = "deployer-caught-ours", "deployer-caught-theirs"
THEIR_BYTES = b"nobody's own segment\n"

# STAND-IN for the engine's interpreter: holds both files open (inheritable) across the exec of the real python
HOLDS_SHM = f"""#!/usr/bin/python3
import os, sys
ours = os.open("/dev/shm/{OURS}", os.O_CREAT | os.O_RDWR, 0o600)
theirs = os.open("/dev/shm/{THEIRS}", os.O_RDONLY)
os.set_inheritable(ours, True)
os.set_inheritable(theirs, True)
os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv[1:]])
"""


@pytest.fixture()
def shm_host(tmp_path: Path) -> Iterator[SSHD]:
    bed = make_sshd(tmp_path / "sshd", private_shm=True)
    try:
        yield bed
    finally:
        bed.stop()


def shm_of(bed: SSHD) -> Path:
    """The bed's own /dev/shm, seen from here (through its mount namespace's root)."""
    assert bed.proc is not None
    return Path(f"/proc/{bed.proc.pid}/root/dev/shm")


def plant_as_nobody(bed: SSHD) -> None:
    assert bed.proc is not None
    done = subprocess.run(["nsenter", "-t", str(bed.proc.pid), "-m", "--", "setpriv", f"--reuid={NOBODY}",
                           f"--regid={NOBODY}", "--clear-groups", "--", "sh", "-ec",
                           f"printf %s \"$1\" > /dev/shm/{THEIRS}", "sh", THEIR_BYTES.decode()],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_shm_clean_up_removes_our_file_and_leaves_another_users(tmp_path: Path, shm_host: SSHD) -> None:
    shm = shm_of(shm_host)
    plant_as_nobody(shm_host)
    theirs, ours = shm / THEIRS, shm / OURS
    assert theirs.stat().st_uid == NOBODY
    python = tmp_path / "holds-shm-python"
    python.write_text(HOLDS_SHM)
    python.chmod(0o755)
    home, name = tmp_path / "home", "caught-shm"
    prof = write_profile(tmp_path, shm_host, name=name)
    data = yaml.safe_load(prof.read_text())
    data["engine"]["python"] = str(python)
    prof.write_text(yaml.safe_dump(data))
    up = deploy("up", str(prof), "--skip-preflight", home=home)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert ours.exists() and ours.stat().st_uid == 0  # the engine holds both
        run = Path(json.loads(deploy("status", str(prof), "--json", home=home).stdout)["run_dir"])
    finally:
        down = deploy("down", str(prof), home=home)
    assert down.returncode == 0, down.stderr
    assert not ours.exists()  # ours: gone with the engine
    assert theirs.exists(), "another user's file in /dev/shm was removed"
    assert theirs.read_bytes() == THEIR_BYTES and theirs.stat().st_uid == NOBODY  # untouched
    said = [ln for ln in (run / "supervisor.log").read_text().splitlines() if "removed what the engine left" in ln]
    assert said and OURS in said[-1] and THEIRS not in "".join(said), said
    assert not any((Path("/dev/shm") / n).exists() for n in (OURS, THEIRS))  # this machine's /dev/shm: not used
