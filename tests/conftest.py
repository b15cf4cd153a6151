"""Shared pytest fixtures for the test bed: a real OpenSSH sshd on loopback (see tests/sshbed.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostbed import HostBed, net_host_bed  # noqa: E402
from netbed import unavailable  # noqa: E402
from sshbed import SSHD, make_sshd  # noqa: E402

STANDIN_BIN = Path(__file__).resolve().parent / "standin" / "bin"

pytest_plugins = ["ci_skips", "slow_tests"]  # CI=true: a skip fails (ci_skips.py); slow ones say why (slow_tests.py)


HOME_VARS = ("DEPLOYER_HOME", "DEPLOYER_CONFIG", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
             "XDG_STATE_HOME")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: crosses a real sshd, bash or HTTP server")


@pytest.fixture(autouse=True)
def own_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own HOME and DEPLOYER_HOME (history, caches, remembered refs, settings): nothing is read
    from or left in the real user's home, and no test sees what another test (or a deployer run on this machine)
    left there. A test that wants DEPLOYER_HOME elsewhere sets it itself, as before."""
    home = tmp_path_factory.mktemp("home")
    for var in HOME_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DEPLOYER_HOME", str(home / ".deployer"))
    return home




@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """One sshd for the whole test session (about 50 ms to start); see SSHD for what it offers."""
    bed = make_sshd(tmp_path_factory.mktemp("sshd"))
    # a GPU box has nvidia-smi: the stand-in prints the real CSV (one idle H200 by default)
    (bed.bin_dir / "nvidia-smi").symlink_to(STANDIN_BIN / "nvidia-smi")
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture()
def fresh_sshd(tmp_path: Path) -> Iterator[SSHD]:
    """A private sshd for tests that stop, restart or otherwise disturb it."""
    bed = make_sshd(tmp_path / "sshd")
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs for a workdir (needs root; skipped saying why otherwise); mount it before starting the sshd
    that uses it, so the sshd's namespace sees it."""
    disk = tmp_path / "small"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.fixture()
def net_bed(tmp_path: Path) -> Iterator[HostBed]:
    """Two hosts the way real ones are (tests/hostbed.py `net_host_bed`: network namespaces, own /dev/shm, routed).
    Needs root and iproute2: skipped saying why otherwise, and a failure under CI=true (which runs as root)."""
    why = unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    with net_host_bed(tmp_path / "hosts", 2) as bed:
        yield bed
