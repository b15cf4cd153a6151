"""The suite's own plumbing (issue 33): parallel workers never share a port or a test-host subnet, every test has
its own HOME and DEPLOYER_HOME, and under CI=true a skip is a failure."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

import netbed
import sshbed

TESTS = Path(__file__).resolve().parents[1]


def _slices(monkeypatch: pytest.MonkeyPatch, workers: int, of: object) -> list[object]:
    seen = []
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    for n in range(workers):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{n}")
        seen.append(of())  # type: ignore[operator]
    return seen


@pytest.mark.parametrize("workers", [1, 2, 4, 7])
def test_each_worker_picks_ports_from_its_own_slice_below_the_ephemeral_range(
        monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    ranges = _slices(monkeypatch, workers, sshbed.port_range)
    low = sshbed._ephemeral_low()
    taken: set[int] = set()
    for r in ranges:
        assert isinstance(r, range) and len(r) >= 100
        assert r.start >= sshbed.PORT_FLOOR and r.stop <= max(low, sshbed.PORT_FLOOR + 2000)
        assert not taken & set(r), "two workers share ports"
        taken |= set(r)


def test_free_port_stays_in_the_workers_slice_and_never_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    mine = sshbed.port_range()
    ports = [sshbed.free_port() for _ in range(30)]
    assert all(p in mine for p in ports) and len(set(ports)) == len(ports)


def test_free_port_does_not_follow_the_global_random_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-randomly reseeds `random` alike in every worker before each test: ports drawn from it would be the
    same sequence everywhere."""
    import random

    def drawn() -> list[int]:
        monkeypatch.setattr(sshbed, "_HANDED_OUT", set())  # so a repeat would show, not be skipped over
        random.seed(1234)
        return [sshbed.free_port() for _ in range(3)]

    assert drawn() != drawn()


@pytest.mark.parametrize("workers", [1, 3, 4])
def test_each_worker_builds_test_hosts_on_its_own_subnets(monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    def subnets() -> set[int]:
        return {netbed._subnet_index() for _ in range(300)}

    per_worker = _slices(monkeypatch, workers, subnets)
    union: set[int] = set()
    for nets in per_worker:
        assert isinstance(nets, set) and all(1 <= n <= 250 for n in nets)
        assert not union & nets, "two workers share a 10.200.N subnet"
        union |= nets


def test_every_test_has_its_own_home(own_home: Path) -> None:
    real = pwd.getpwuid(os.getuid()).pw_dir
    assert os.environ["HOME"] == str(own_home) and os.environ["HOME"] != real
    assert Path(os.environ["DEPLOYER_HOME"]).parent == own_home
    assert list(own_home.iterdir()) == []     # nothing another test left
    assert Path.home() == own_home and Path("~/.cache").expanduser().parent == own_home


def test_a_bed_session_has_the_beds_home_not_the_users(sshd: sshbed.SSHD) -> None:
    out = subprocess.run(["ssh", "-F", str(sshd.ssh_config), sshbed.ALIAS, "echo $HOME"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(sshd.home) and sshd.home.is_dir()


PROBE = '''
import pytest

def test_skips():
    pytest.skip("nothing to run it on")

def test_passes():
    assert True
'''


@pytest.mark.parametrize("ci, code, outcome", [("true", 1, "1 failed, 1 passed"), ("", 0, "1 passed, 1 skipped")])
def test_under_ci_a_skip_is_a_failure(tmp_path: Path, ci: str, code: int, outcome: str) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(TESTS)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-p", "ci_skips", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == code and outcome in done.stdout, done.stdout[-2000:]
    if ci:
        assert "skipped under CI=true, where every skip is a failure: Skipped: nothing to run it on" in done.stdout


def test_a_slow_test_without_a_reason_is_listed_and_one_with_a_reason_is_not() -> None:
    from slow_tests import slow_without_reason

    class Report:
        def __init__(self, nodeid: str, duration: float, keywords: dict[str, int], when: str = "call") -> None:
            self.nodeid, self.duration, self.keywords, self.when = nodeid, duration, keywords, when

    reports = [Report("a", 45.0, {}), Report("b", 50.0, {"slow": 1}), Report("c", 12.0, {}),
               Report("d", 80.0, {}, when="setup"), Report("e", 31.0, {})]
    assert slow_without_reason(reports, 30.0) == [(45.0, "a"), (31.0, "e")]  # type: ignore[arg-type]
