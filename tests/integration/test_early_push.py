"""`up` pushes attempt 1's run dir while preflight runs (deployer/runner/early_push.py), over the real sshd.

The stand-in's flag probe is made slow (STANDIN_PROBE_IMPORT_S: its import of server_args sleeps, as importing the
real SGLang and torch does on a GPU box) and cold: the probe cache the target keeps lives under a per-test
XDG_CACHE_HOME and DEPLOYER_HOME is fresh, so every `up` here runs the probe. Evidence comes from the target's own
records: the mtimes of the pushed files against the mtime of the probe's cached answer (written when the probe
ended), and the run dirs seen under runs/ while `up` ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import REPO, deploy, events, fill, write_profile
from deployer.profile.loader import load_profile
from deployer.render.bundle import render

pytestmark = pytest.mark.integration

PROBE_S = 2.0
PUSHED = ("launch.sh", "env", "profile.json", "supervise.json", "supervise.py")
MODELS = REPO / "tests" / "fixtures" / "models"


def slow_probe(tmp_path: Path) -> dict[str, str]:
    return {"STANDIN_PROBE_IMPORT_S": f"{PROBE_S:g}", "XDG_CACHE_HOME": str(tmp_path / "xdg")}


def watched_up(prof: Path, runs: Path, *argv: str, home: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """`deploy up` in the background; the run dirs seen under `runs` while it ran (polled every 20 ms)."""
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", str(prof), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home),
                                 "HOME": os.environ.get("HOME", "/root")})
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= set(os.listdir(runs)) if runs.is_dir() else set()
        time.sleep(0.02)
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


def listing(root: Path) -> tuple[list[str], str | None]:
    runs = sorted(p.name for p in (root / "runs").iterdir()) if (root / "runs").is_dir() else []
    current = os.readlink(root / "current") if (root / "current").is_symlink() else None
    return runs, current


def written_hash(prof: Path) -> str:
    return render(load_profile(str(prof))).content_hash


def test_the_run_dir_is_on_the_target_before_the_cold_probe_ends(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="early", env=slow_probe(tmp_path))
    up = deploy("up", str(prof), "--json", home=tmp_path / "h", timeout=180)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    report = events(up.stdout)[-1]
    assert report["status"] == "ready" and len(report["attempts"]) == 1
    run = Path(report["run_dir"])
    # one push: attempt 1 launched the run dir pushed while preflight ran (no second one, none left over)
    assert listing(tmp_path / "work" / "early") == ([run.name], f"runs/{run.name}")
    assert run.name.split("-")[1] == written_hash(prof)[:8]
    (flags,) = (tmp_path / "xdg" / "deployer" / "probes").glob("flags-*.out")  # written when the probe ended
    pushed = max(os.stat(run / name).st_mtime for name in PUSHED)
    # the target's own clock: the files landed while the probe still ran (it sleeps PROBE_S on import)
    assert pushed < flags.stat().st_mtime - PROBE_S / 2, (pushed, flags.stat().st_mtime)
    kinds = [e["event"] for e in events(up.stdout)]
    assert kinds.index("attempt") < kinds.index("pushed") < kinds.index("ready")  # reported in order, by one thread
    deploy("down", str(prof), home=tmp_path / "h")


def test_a_flag_healed_by_preflight_replaces_the_early_run_dir(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="early-heal", env=slow_probe(tmp_path),
                         args={"mem_fraction_statc": 0.85})
    root = tmp_path / "work" / "early-heal"
    up, seen = watched_up(prof, root / "runs", "--json", home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    report = events(up.stdout)[-1]
    # the one close flag: respelt by preflight, said loudly (the flag policy: never dropped)
    assert any("respelt as --mem-fraction-static" in w for w in report["warnings"]), report["warnings"]
    run = Path(report["run_dir"])
    early = {name for name in seen if name.split("-")[1] == written_hash(prof)[:8]}
    assert early and run.name not in early, seen   # the as-written run dir was pushed early ...
    assert listing(root) == ([run.name], f"runs/{run.name}")  # ... and removed: only the healed run remains
    record = json.loads((run / "profile.json").read_text())
    assert record["profile"]["engine"]["args"] == {"mem_fraction_static": 0.85}
    assert record["written_hash"] == written_hash(prof) != record["content_hash"]
    deploy("down", str(prof), home=tmp_path / "h")


def test_a_refused_up_leaves_the_target_as_it_found_it(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="early-refused", env=slow_probe(tmp_path))
    root = tmp_path / "work" / "early-refused"
    first = deploy("up", str(prof), "--skip-preflight", home=home)
    assert first.returncode == 0, first.stderr
    before = listing(root)
    serving = json.loads(deploy("status", str(prof), "--json", home=home).stdout)
    # a model that does not fit on the target's one GPU (preflight reads its size from the local config)
    refused, seen = watched_up(prof, root / "runs", "--set", "engine.model_path=Qwen/Qwen3-Next-80B-A3B-Instruct",
                               "--model-config", str(MODELS / "qwen3-next-80b-a3b"), home=home)
    assert refused.returncode == 4, refused.stderr
    assert "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("error: preflight: "), refused.stderr
    assert seen - set(before[0]), seen  # an early run dir was pushed while preflight ran ...
    assert listing(root) == before      # ... and removed; `current` untouched
    after = json.loads(deploy("status", str(prof), "--json", home=home).stdout)
    assert after["healthy"] and after["pid"] == serving["pid"] and after["run_dir"] == serving["run_dir"]
    deploy("down", str(prof), home=home)


def test_no_early_push_for_what_is_already_running(tmp_path: Path, sshd: Any) -> None:
    """The running version is what this `up` would launch: nothing is pushed, not even for a moment."""
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="early-same", env=slow_probe(tmp_path))
    root = tmp_path / "work" / "early-same"
    assert deploy("up", str(prof), home=home).returncode == 0
    before = listing(root)
    again, seen = watched_up(prof, root / "runs", home=home)
    assert again.returncode == 0 and "already running" in again.stderr, again.stderr
    assert seen == set(before[0]) and listing(root) == before
    deploy("down", str(prof), home=home)


def test_plan_pushes_nothing(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="early-plan", env=slow_probe(tmp_path))
    root = tmp_path / "work" / "early-plan"
    plan = deploy("plan", str(prof), home=tmp_path / "h", timeout=180)
    assert plan.returncode == 0, plan.stderr
    assert listing(root) == ([], None)


def test_ctrl_c_during_preflight_removes_the_early_run_dir(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="early-ctrlc", env=slow_probe(tmp_path))
    runs = tmp_path / "work" / "early-ctrlc" / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", str(prof)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(tmp_path / "h"),
                                 "HOME": os.environ.get("HOME", "/root")})
    deadline = time.monotonic() + 60
    while not (runs.is_dir() and any(runs.iterdir())) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    early = [p.name for p in runs.iterdir()]   # pushed while the (slow) probe runs
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert early and listing(tmp_path / "work" / "early-ctrlc") == ([], None)


def test_a_full_disk_is_said_once_and_changes_nothing(tmp_path: Path, small_disk: Path, fresh_sshd: Any) -> None:
    """The early push meets the full disk first, silently; attempt 1's push meets it again and says so."""
    home = tmp_path / "h"
    (fresh_sshd.bin_dir / "nvidia-smi").symlink_to(REPO / "tests" / "standin" / "bin" / "nvidia-smi")
    prof = write_profile(tmp_path, fresh_sshd, name="early-full", workdir=small_disk / "work",
                         env=slow_probe(tmp_path))
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    root = small_disk / "work" / "early-full"
    before = listing(root)
    fill(small_disk, leave=8 << 10)
    proc = deploy("up", str(prof), "--set", "engine.args.enable_metrics=true", home=home, timeout=180)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: not enough free space on ") and "nothing was changed" in lines[-1], lines
    assert sum("not enough free space" in line for line in lines) == 1, lines
    assert listing(root) == before
    deploy("down", str(prof), home=home)


def test_one_sftp_session_serves_two_threads_at_once(tmp_path: Path, sshd: Any) -> None:
    """The early push uploads while preflight may read over the same SSHRemote: paramiko's SFTPClient is not safe
    for that by itself (a thread can take the other's reply off the channel), so SSHRemote serializes it."""
    import threading

    from deployer.remote.connect import connect

    remote = connect(sshd.spec())
    (tmp_path / "log").write_bytes(b"x" * 50_000)
    errors: list[BaseException] = []

    def uploads() -> None:
        try:
            for i in range(15):
                files = [(bytes([i]) * (1000 + n), str(tmp_path / f"f{n}"), 0o644) for n in range(6)]
                remote.put_all(files)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def reads() -> None:
        try:
            for _ in range(150):
                assert remote.read(str(tmp_path / "log"), 10, 40_000) == b"x" * 40_000
                assert remote.size(str(tmp_path / "log")) == 50_000
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=uploads), threading.Thread(target=reads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert (tmp_path / "f5").read_bytes() == bytes([14]) * 1005
    finally:
        remote.close()
