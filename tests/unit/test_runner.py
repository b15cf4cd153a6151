"""The attempt runner against a scripted shape: the loop's order of events, its changes, its local history switch,
and the one restore path (the target-side steps replaced by recorders: no remote)."""

from __future__ import annotations

from typing import Any

import pytest

from deployer.diagnose.diagnosis import Diagnosis
from deployer.errors import LaunchFailed
from deployer.events import AttemptStarted, Changed, Diagnosed, Event, EventSink, Restored, RollingBack, RunPushed
from deployer.profile.model import Profile
from deployer.box.push import RunDir
from deployer.remedy.propose import Change
from deployer.runner import attempts, restore
from deployer.runner import history as runner_history
from deployer.runner.attempts import AttemptRunner
from deployer.runner.report import UpOptions, UpReport
from deployer.runner.shape import Found, Result, Shape, HeldHost
from deployer.box import switch
from deployer.box.process import Launch
from deployer.box.records import RunView
from deployer.watch.watcher import Crashed, Ready


class Box:
    label = "box"


class Scripted(Shape):
    """Watch results in turn; every failure diagnosed as `diagnosis`."""

    def __init__(self, targets: list[HeldHost], results: list[Result], diagnosis: Diagnosis) -> None:
        super().__init__(targets)
        self.results, self.diagnosis = results, diagnosis
        self.seen_profiles: list[Profile] = []

    def profiles(self, base: Profile) -> list[Profile]:
        self.seen_profiles.append(base)
        return [base for _ in self.targets]

    def stopping(self, serving: list[HeldHost]) -> str:
        return "stopping"

    def earlier_starts(self) -> list[Any]:
        return []

    def watch(self, profile: Profile, emit: EventSink, prediction: object = None) -> Result:
        return self.results.pop(0)

    def stop_failed(self, result: Result, profile: Profile) -> None:
        pass

    def diagnose(self, result: Result, version: str | None, kind: str) -> Found:
        return Found(self.diagnosis)

    def watch_previous(self, profile: Profile, emit: EventSink) -> Result:
        return Ready(1.0)


@pytest.fixture
def switched() -> list[str]:
    """The switch steps (box/switch.py) besides the start: each port check and `current`, in order."""
    return []


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch, switched: list[str]) -> list[str]:
    done: list[str] = []
    count = iter(range(1, 100))

    def push(remote: Any, layout: Any, bundle: Any, record: Any, config: Any, run_id: str) -> RunDir:
        n = next(count)
        done.append(f"push {n}")
        return RunDir(f"/w/runs/{n}", f"run{n}")

    def start(remote: Any, run: RunDir) -> Launch:
        done.append(f"start {run.run_id}")
        switched.append(f"start {run.run_id}")
        return Launch(run, 1, 1, 0.0, 0)

    for module in (attempts, restore):
        monkeypatch.setattr(module, "stop", lambda remote, run, grace, why=None, drain_s=0.0:
                            done.append(f"stop {run.run_id}"))
    monkeypatch.setattr(switch, "start", start)
    monkeypatch.setattr(switch, "set_current", lambda remote, layout, run: switched.append(f"current {run.run_id}"))
    monkeypatch.setattr(switch, "check_port",
                        lambda remote, layout, port, wait_s: switched.append(f"port {port} wait {wait_s:g}"))
    monkeypatch.setattr(attempts, "push", push)
    monkeypatch.setattr(attempts, "write_outcome", lambda remote, run, data: done.append(f"outcome {data['outcome']}"))
    monkeypatch.setattr(attempts, "log_head", lambda remote, launch: "")
    monkeypatch.setattr(restore, "current_run_id", lambda remote, layout: None)

    def no_history() -> None:
        raise AssertionError("the local history is off")
    monkeypatch.setattr(runner_history, "History", no_history)
    return done


def _profile() -> Profile:
    return Profile.model_validate({"name": "p", "target": {"host": "h"},
                                   "engine": {"kind": "sglang", "model_path": "m", "args": {}},
                                   "retry": {"max_attempts": 3, "backoff_s": 0}})


def _runner(shape: Shape, events: list[Event]) -> AttemptRunner:
    profile = _profile()
    return AttemptRunner(shape, profile, UpOptions(local_history=False), events.append,
                         UpReport(name="p", host="box", status="failed"), "up1", profile)


def test_a_crash_is_changed_and_tried_again_until_ready(steps: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    crash = Crashed(2.0, 1, None, None, [])
    diag = Diagnosis(signature="oom", summary="out of memory", transient=False)
    monkeypatch.setattr(attempts, "propose", lambda d, p, tried, values: Change(args={"mem": 0.5}, reason="less"))
    shape = Scripted([HeldHost(remote=Box(), layout=None)], [crash, Ready(3.0)], diag)  # type: ignore[arg-type]
    events: list[Event] = []
    report = _runner(shape, events).run()
    assert report.status == "ready" and [a.outcome for a in report.attempts] == ["crashed", "ready"]
    assert report.attempts[0].diagnosis is diag and report.attempts[0].change == Change(args={"mem": 0.5},
                                                                                         reason="less")
    assert report.to_json()["attempts"][0]["diagnosis"]["signature"] == "oom"
    assert shape.seen_profiles[1].engine.args == {"mem": 0.5}
    assert [type(e) for e in events] == [AttemptStarted, RunPushed, Diagnosed, Changed, AttemptStarted, RunPushed]
    assert steps == ["push 1", "start run1", "outcome crashed", "push 2", "start run2", "outcome ready"]


def test_a_failed_replace_brings_the_serving_version_back(steps: list[str]) -> None:
    view = RunView(RunDir("/w/runs/old", "old"), {"content_hash": "c" * 64, "port": 30000},
                   {"alive": True, "status": "ready", "ready_at": 1.0}, None)
    diag = Diagnosis(signature=None, summary="unknown", transient=False)
    target = HeldHost(remote=Box(), layout=None, serving=view)  # type: ignore[arg-type]
    events: list[Event] = []
    with pytest.raises(LaunchFailed) as caught:
        _runner(Scripted([target], [Crashed(1.0, 1, None, None, [])], diag), events).run()
    assert "brought back the previous version cccccccccccc (old): it is serving again" in caught.value.message
    report = caught.value.outcome
    assert report.restored is not None and report.restored.serving and report.replaced == "old"
    assert [type(e) for e in events][-2:] == [RollingBack, Restored]
    assert steps[:3] == ["push 1", "stop old", "start run1"] and steps[-1] == "start old"


def test_every_start_switches_ports_then_current_then_start(steps: list[str], switched: list[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt 1 after the serving version stopped (the full port wait), attempt 2 after its own failed run (the
    retry's wait), restore after the failed attempt (the full wait): each checks the port before `current` moves,
    and `current` moves right before the start (box/switch.py says why)."""
    view = RunView(RunDir("/w/runs/old", "old"), {"content_hash": "c" * 64, "port": 30001},
                   {"alive": True, "status": "ready", "ready_at": 1.0}, None)
    diag = Diagnosis(signature="oom", summary="out of memory", transient=False)
    monkeypatch.setattr(attempts, "propose", lambda d, p, tried, values: Change(args={"mem": 0.5}, reason="less"))
    target = HeldHost(remote=Box(), layout=None, serving=view)  # type: ignore[arg-type]
    crash = Crashed(1.0, 1, None, None, [])
    with pytest.raises(LaunchFailed):
        _runner(Scripted([target], [crash, crash, crash], diag), []).run()
    assert switched == ["port 30000 wait 15", "current run1", "start run1",
                        "port 30000 wait 5", "current run2", "start run2",
                        "port 30000 wait 5", "current run3", "start run3",
                        "port 30001 wait 15", "current old", "start old"]   # the old run's port, from its record


def test_a_first_start_with_nothing_serving_checks_the_port_once(steps: list[str], switched: list[str]) -> None:
    diag = Diagnosis(signature=None, summary="unknown", transient=False)
    _runner(Scripted([HeldHost(remote=Box(), layout=None)], [Ready(1.0)], diag), []).run()  # type: ignore[arg-type]
    assert switched == ["port 30000 wait 0", "current run1", "start run1"]
