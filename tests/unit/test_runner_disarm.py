"""The attempt runner's word to the target's guard when it disarms (issue #34): the guard checks for itself that
what should serve runs; the client says only when it leaves the stopped version stopped on purpose (`--no-rollback`),
and a failure whose bring-back did not serve says the guard takes over."""

from __future__ import annotations

from typing import Any

import pytest

from deployer.diagnose.diagnosis import Diagnosis
from deployer.errors import LaunchFailed
from deployer.events import Event
from deployer.runner import attempts
from deployer.runner.attempts import AttemptRunner
from deployer.runner.report import UpOptions, UpReport
from deployer.runner.shape import Result, HeldHost
from deployer.box.push import Layout, RunDir
from deployer.box.records import RunView
from deployer.watch.watcher import Crashed, Ready
from test_runner import Box, Scripted, _profile, steps, switched

__all__ = ["steps", "switched"]  # fixtures, used by name


class Unready(Scripted):
    def watch_previous(self, profile: Any, emit: Any) -> Result:
        return Crashed(1.0, 1, None, None, [])  # the version brought back died too


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    said: list[str | None] = []
    monkeypatch.setattr(attempts, "arm_repair", lambda remote, layout, guard: True)
    monkeypatch.setattr(attempts, "disk_full", lambda remote, root: None)
    monkeypatch.setattr(attempts, "disarm_repair", lambda remote, layout, left_stopped=None: said.append(left_stopped))
    return said


def _run(shape_type: type[Scripted], results: list[Result], rollback: bool,
         ranks: int = 1) -> tuple[AttemptRunner, list[Event]]:
    views = [RunView(RunDir(f"/w/runs/old{i}", f"old{i}"), {"content_hash": "c" * 64, "port": 30000},
                     {"alive": True, "status": "ready", "ready_at": 1.0}, None) for i in range(ranks)]
    targets = [HeldHost(remote=Box(), layout=Layout("/w"), serving=view)  # type: ignore[arg-type]
               for view in views]
    profile, events = _profile(), []  # type: ignore[var-annotated]
    diag = Diagnosis(signature=None, summary="unknown", transient=False)
    runner = AttemptRunner(shape_type(targets, results, diag), profile,
                           UpOptions(local_history=False, rollback=rollback, heal=False), events.append,
                           UpReport(name="p", host="box", status="failed"), "up1", profile)
    return runner, events


def test_no_rollback_tells_the_guard_it_leaves_it_stopped(steps: list[str], told: list[str | None]) -> None:
    runner, _ = _run(Scripted, [Crashed(1.0, 1, None, None, [])], rollback=False)
    with pytest.raises(LaunchFailed):
        runner.run()
    assert told == ["--no-rollback"]


def test_a_ready_replace_and_a_good_bring_back_leave_the_check_to_the_guard(steps: list[str],
                                                                           told: list[str | None]) -> None:
    runner, _ = _run(Scripted, [Ready(1.0)], rollback=True)
    runner.run()
    runner, _ = _run(Scripted, [Crashed(1.0, 1, None, None, [])], rollback=True)
    with pytest.raises(LaunchFailed) as caught:
        runner.run()
    assert told == [None, None] and "guard" not in caught.value.message


def test_a_bring_back_that_does_not_serve_hands_over_to_the_guard(steps: list[str], told: list[str | None]) -> None:
    runner, _ = _run(Unready, [Crashed(1.0, 1, None, None, [])], rollback=True)
    with pytest.raises(LaunchFailed) as caught:
        runner.run()
    assert told == [None]
    assert "the target's guard starts it again as soon as it can" in caught.value.message, caught.value.message


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_a_group_announces_the_stop_on_every_rank_before_it_stops_any(
        steps: list[str], told: list[str | None], monkeypatch: pytest.MonkeyPatch, ranks: int) -> None:
    """A node group's replace: each rank's stop request is written before any rank is stopped, so a rank whose
    engine ends because another rank stopped first is recorded as stopped (supervisor/daemon.py STOP_AHEAD_S), not
    as a crash that keeps the version from rollback. One host has no peer: no announcement, one round trip less."""
    monkeypatch.setattr(attempts, "announce_stop",
                        lambda remote, run, grace, why: steps.append(f"announce {run.run_id} {why}"))
    runner, _ = _run(Scripted, [Ready(1.0)], rollback=True, ranks=ranks)
    runner.run()
    stopping = [s for s in steps if s.startswith(("announce", "stop"))]
    announced = [f"announce old{i} replace" for i in range(ranks)] if ranks > 1 else []
    assert stopping == announced + [f"stop old{i}" for i in range(ranks)], steps
