"""The supervisor's part of issue 22 (findings 6 and 9), real processes, no SSH: a run is marked stable once it
stayed ready for restart.stable_s, a crash loop after ready is recorded as such, a stop of a run that ended by
itself makes it stopped, engine.log rotates by size keeping its startup part (and the snapshot reads across the
cut), and the @reboot entry of restart.on_boot is written, replaced and removed in the user's crontab."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sshbed import write_stand_in_crontab
from payload import hold_like_a_deployment
from test_supervise_bash import LAUNCH, READY, READY_THEN_SLEEP, make_run, start, state_of, status_is, sup, wait_for
from deployer.supervisor.snapshot import rotated_window

pytestmark = pytest.mark.integration
__all__ = ["make_run"]  # the fixture, used by name

CRASH_AFTER_READY = f"import sys, time\nprint({READY!r}, flush=True)\ntime.sleep(0.3)\nsys.exit(1)\n"


def test_a_run_ready_for_stable_s_is_marked_stable(make_run: Callable[..., Path]) -> None:
    run = make_run(READY_THEN_SLEEP, restart={"policy": "on-failure", "stable_s": 0.5})
    assert start(run)["stable_at"] is None
    st = wait_for(lambda: state_of(run) if state_of(run).get("stable_at") else None, 10, "stable_at")
    assert st["status"] == "ready" and st["stable_at"] >= st["ready_at"] + 0.5


def test_a_crash_loop_after_ready_is_recorded_and_a_stop_makes_it_stopped(make_run: Callable[..., Path]) -> None:
    run = make_run(CRASH_AFTER_READY, restart={"policy": "on-failure", "max": 1, "backoff_s": [0.1, 0.1],
                                               "window_s": 60, "stable_s": 30})
    start(run)
    st = wait_for(status_is(run, "crashloop"), 20, "crashloop")
    assert st["crashloop_after_ready"] is True and st["stable_at"] is None and st["restarts"] == 1
    stopped = sup("stop", str(run), "--grace", "1")
    assert stopped.returncode == 0, stopped.stderr
    said = json.loads(stopped.stdout)
    assert (said["status"], said["stopped_from"], said["was_running"]) == ("stopped", "crashloop", False)
    after = state_of(run)
    assert after["status"] == "stopped" and after["crashloop_after_ready"] and after["last_crash"]


FLOOD = f"""import sys, time
print({READY!r}, flush=True)
for burst in range(8):
    for i in range(300):
        print(f"request {{burst:02d}}-{{i:04d}} " + "x" * 80, flush=True)
    time.sleep(0.6)
print("LAST LINE", flush=True)
for _ in range(600):
    time.sleep(0.1)
"""


def test_engine_log_rotates_by_size_keeping_its_start(make_run: Callable[..., Path]) -> None:
    logs = {"max_bytes": 64 << 10, "head_bytes": 4 << 10, "keep": 2}
    run = make_run(FLOOD, logs=logs)
    start(run)
    wait_for(lambda: "LAST LINE" in (run / "engine.log").read_text(errors="replace"), 30, "the flood's end")
    st = state_of(run)
    total = 8 * 300 * 100
    assert st["rotated"] > 0 and (run / "engine.log.1").exists(), st
    bound = logs["max_bytes"] + 4 * 300 * 100  # a look every 2 s: up to 4 bursts written between two looks
    for part in (run / "engine.log", run / "engine.log.1", run / "engine.log.2"):
        assert not part.exists() or part.stat().st_size <= bound, part
    assert not (run / "engine.log.3").exists()  # keep: 2
    text = (run / "engine.log").read_text()
    assert text.startswith(READY) and "engine.log rotated at" in text  # the startup part stays, the cut is said
    assert sum(p.stat().st_size for p in run.glob("engine.log*")) < total  # bounded, not the whole flood
    # `deploy logs` reads across the cut: the last lines are .1's end followed by what came after the marker
    window = rotated_window(str(run / "engine.log"), 16 << 10, st["log_head"])
    lines = base64.b64decode(window["data"]).decode().splitlines()
    assert lines[-1] == "LAST LINE" and len(lines) > 100 and "rotated at" not in "\n".join(lines)
    numbers = [line.split()[1] for line in lines if line.startswith("request ")]
    assert numbers == sorted(numbers) and numbers[-1] == "07-0299"


def _crontab_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    table = tmp_path / "crontab.txt"
    write_stand_in_crontab(bin_dir, table)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}, table


@pytest.fixture()
def dep_run(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Run dirs where deployer puts them: <workdir>/<name>/runs/<id> (the boot entry names <workdir>/<name>),
    each with the supervisor's entry files naming the deployment's payload, as a push leaves them (the @reboot
    entry runs the run dir's own supervise.py).
    Whatever they still run is stopped at teardown."""
    made: list[Path] = []

    def build(run_id: str, **cfg: Any) -> Path:
        run = tmp_path / "work" / "dep" / "runs" / run_id
        run.mkdir(parents=True)
        (run / "launch.sh").write_text(LAUNCH)
        (run / "engine.py").write_text(READY_THEN_SLEEP)
        (run / "env").write_text("")
        (run / "supervise.json").write_text(json.dumps({
            "launch": "launch.sh", "env_file": "env", "log": "engine.log", "grace_s": 1, "ready_pattern": READY,
            "restart": {"policy": "no"}, **cfg}))
        hold_like_a_deployment(tmp_path / "work" / "dep", run)
        made.append(run)
        return run

    yield build
    for run in made:
        sup("stop", str(run), "--grace", "0.2")


def test_on_boot_entry_is_written_replaced_and_removed(tmp_path: Path, dep_run: Callable[..., Path]) -> None:
    env, table = _crontab_env(tmp_path)
    table.write_text("MAILTO=someone\n@daily /usr/bin/true # the user's own line\n")
    first = dep_run("r1", on_boot=True)
    said = sup("start", str(first), env=env)
    assert said.returncode == 0 and json.loads(said.stdout)["on_boot"] == "installed", said.stderr
    root = tmp_path / "work" / "dep"
    lines = table.read_text().splitlines()
    assert lines[:2] == ["MAILTO=someone", "@daily /usr/bin/true # the user's own line"]
    assert len(lines) == 3 and lines[2].startswith("@reboot ") and lines[2].endswith(f"# deployer-on-boot {root}")
    assert shlex.quote(str(first)) in lines[2]
    assert sup("stop", str(first), "--grace", "1", env=env).returncode == 0
    second = dep_run("r2", on_boot=True)
    assert sup("start", str(second), env=env).returncode == 0
    lines = table.read_text().splitlines()
    assert len(lines) == 3 and str(second) in lines[2] and str(first) not in lines[2]  # replaced, not added
    off = sup("boot", str(second), "off", env=env)
    assert off.returncode == 0 and json.loads(off.stdout) == {"on_boot": "removed"}
    assert table.read_text().splitlines() == lines[:2]  # every other line as it was
    assert json.loads(sup("boot", str(second), "off", env=env).stdout) == {"on_boot": "none"}


def test_no_crontab_on_the_box_is_said_not_fatal(dep_run: Callable[..., Path]) -> None:
    run = dep_run("r1", on_boot=True)
    said = sup("start", str(run), env={"PATH": "/nonexistent"})
    assert said.returncode == 0, said.stderr
    assert json.loads(said.stdout)["on_boot"] == "unavailable: no crontab program on this host"


def test_the_boot_entry_brings_the_run_back(tmp_path: Path, dep_run: Callable[..., Path]) -> None:
    """A reboot: the supervisor and the engine are gone (SIGKILL); the entry's exact command starts the run."""
    env, table = _crontab_env(tmp_path)
    run = dep_run("r1", on_boot=True)
    first = json.loads(sup("start", str(run), env=env).stdout)
    wait_for(status_is(run, "ready"), 10, "ready")
    os.kill(first["supervisor_pid"], 9)
    os.killpg(first["pgid"], 9)
    wait_for(status_is(run, "lost"), 10, "lost")
    command = table.read_text().splitlines()[-1].removeprefix("@reboot ")
    booted = subprocess.run(["sh", "-c", command], env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert booted.returncode == 0
    back = wait_for(status_is(run, "ready"), 10, "ready after the boot-time start")
    assert back["pid"] != first["pid"]
