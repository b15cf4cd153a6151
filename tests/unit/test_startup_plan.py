"""The startup timeline wired into `up` (issue 26, item 3): an attempt's timeline from the phases its watch saw,
earlier starts read back from run records, the prediction event and the `startup_timeout_s: auto` deadline, the
watcher's far-beyond warning (a fake clock over a real log file), and `history`'s phase line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from deployer.deployments.history_text import timeline_text
from deployer.engines import engine_for
from deployer.events import Event, StartSlow
from deployer.observe.timeline import PastStart, Phase, Prediction, Range, StartKey, Timeline, predict
from deployer.profile.model import Health, Profile
from deployer.remote.local import LocalRemote
from deployer.runner.report import PhaseSeen
from deployer.runner.startup import StartPlan, past_starts, start_key, timeline_of
from deployer.box.process import Launch
from deployer.box.push import RunDir
from deployer.watch.watcher import Watcher


def _profile(**health: object) -> Profile:
    return Profile.model_validate({"name": "demo", "target": {"host": "gpu-box"},
                                   "engine": {"kind": "sglang", "model_path": "Qwen/Qwen3-8B", "args": {"tp": 1}},
                                   "health": health})


def test_a_timeline_from_the_watchers_phases() -> None:
    seen = [PhaseSeen("args", 1.0), PhaseSeen("loading weights", 2.0), PhaseSeen("downloading", 3.0),
            PhaseSeen("loading weights", 13.0), PhaseSeen("weights loaded", 20.0), PhaseSeen("http up", 25.0),
            PhaseSeen("ready", 25.5), PhaseSeen("no such phase", 26.0)]
    timeline = timeline_of(seen, 26.0, 26.0)
    assert [(r.phase, r.start_s, r.duration_s) for r in timeline.phases] == [
        (Phase.START, 0.0, 2.0), (Phase.LOAD, 2.0, 1.0), (Phase.DOWNLOAD, 3.0, 10.0), (Phase.LOAD, 13.0, 7.0),
        (Phase.COMPILE, 20.0, 5.0), (Phase.HTTP_UP, 25.0, 1.0)]
    assert timeline.ready_s == 26.0 and timeline.duration(Phase.LOAD) == 8.0
    crashed = timeline_of([PhaseSeen("loading weights", 2.0)], None, 9.0)
    assert crashed.ready_s is None and crashed.elapsed() == 9.0


def _record(key: StartKey, at: float, ready: float) -> dict[str, object]:
    timeline = Timeline((), ready_s=ready) if ready else Timeline(())
    return {"state": {"started_at": at}, "outcome": {"start_key": key.__dict__, "timeline": timeline.to_json()}}


def test_earlier_starts_from_run_records_and_the_prediction() -> None:
    profile = _profile(startup_timeout_s="auto")
    key = start_key(profile, "0.5.10", "root@gpu-box")
    assert key.engine_version == "0.5.10" and key.model == "Qwen/Qwen3-8B" and key.host == "root@gpu-box"
    assert start_key(profile.patched(args={"tp": 2}), "0.5.10", "root@gpu-box").args_hash != key.args_hash
    other = StartKey("Qwen/Qwen3-8B", "", "0.5.9", "root@gpu-box", key.args_hash)
    records = [_record(key, 1.0, 400.0), _record(key, 2.0, 480.0), _record(other, 3.0, 10.0),
               {"state": {}, "outcome": {"outcome": "ready"}},                      # a record of an older release
               {"state": {}, "outcome": {"start_key": {"model": "x"}, "timeline": {}}}]
    history = past_starts(records)
    assert len(history) == 3
    assert StartPlan.of(profile, "0.5.10", "root@gpu-box", history).prediction is None   # only 2 with this key
    history += past_starts([_record(key, 4.0, 460.0)])
    plan = StartPlan.of(profile, "0.5.10", "root@gpu-box", history)
    assert plan.prediction is not None and plan.deadline is not None
    event = plan.event(2)
    assert event is not None and event.attempt == 2 and event.starts == 3 and event.ready == [400.0, 480.0]
    assert event.summary.startswith("last 3 starts: ready in 6m40s-8m") and event.startup_timeout_s == 1080.0
    watched = plan.watched(profile)
    assert watched.health.startup_timeout_s == 1080.0 and profile.health.startup_timeout_s == "auto"


def test_auto_without_history_is_the_documented_fallback_and_a_fixed_timeout_stays() -> None:
    plan = StartPlan.of(_profile(startup_timeout_s="auto"), None, "h", [])
    assert plan.deadline is not None and plan.deadline.seconds == 1800.0 and plan.event(1) is None
    assert "no 3 earlier starts" in plan.deadline.why
    fixed = StartPlan.of(_profile(startup_timeout_s=90), None, "h", [])
    assert fixed.deadline is None and fixed.watched(_profile(startup_timeout_s=90)).health.startup_timeout_s == 90


def test_startup_timeout_is_seconds_or_auto() -> None:
    assert Health(startup_timeout_s="auto").startup_deadline_s == 1800.0
    assert Health().startup_deadline_s == 1800.0 and Health(startup_timeout_s=30).startup_deadline_s == 30.0
    for bad in ("soon", 0, -5, True):
        with pytest.raises(ValidationError, match="a number of seconds greater than 0, or auto"):
            Health(startup_timeout_s=bad)
    assert _profile(startup_timeout_s="auto", stall_timeout_s=900).health.stall_timeout_s == 900


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _prediction(load_s: float, ready_s: float) -> Prediction:
    key = StartKey("m", "", "v", "h", "a")
    marks = [(Phase.START, 0.0), (Phase.LOAD, 1.0), (Phase.HTTP_UP, 1.0 + load_s), (Phase.READY, ready_s)]
    starts = [PastStart(key, float(i), Timeline.from_marks(marks, ready_s)) for i in range(3)]
    found = predict(starts, key)
    assert found is not None
    return found


def test_the_watcher_warns_once_when_a_phase_and_the_start_run_far_beyond(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deployer.watch.watcher.status", lambda remote, run: {"status": "running"})
    run = RunDir(str(tmp_path), "run-1")
    (tmp_path / "state.json").write_text(json.dumps({"status": "running"}))
    log = tmp_path / "engine.log"
    log.write_text("[2026-11-30 10:00:00] Load weight begin. avail mem=139.80 GB\n")
    events: list[Event] = []
    clock = Clock()
    health = Health(interval_s=0.2, startup_timeout_s=10_000, stall_timeout_s=5_000)
    watcher = Watcher(LocalRemote(), Launch(run, 1, 1, time.time(), 0), 1, health, engine_for("sglang"),
                      events.append, clock=clock, prediction=_prediction(load_s=10.0, ready_s=100.0))
    assert watcher.poll_once() is None
    clock.now += 75.0                       # load has run 75 s: 1.5 x 10 + 60 = 75 is the limit, not past it
    assert watcher.poll_once() is None and not [e for e in events if isinstance(e, StartSlow)]
    clock.now += 1.0
    for _ in range(3):
        assert watcher.poll_once() is None
    (slow,) = [e for e in events if isinstance(e, StartSlow)]
    assert slow.phase == "load" and slow.expected == [10.0, 10.0] and slow.phase_s == pytest.approx(76.0)
    assert slow.message == "load has run 1m16s; the last 3 starts took 10s (far beyond: over 1m15s)"
    clock.now += 140.0                      # the whole start: 1.5 x 100 + 60 = 210 s
    assert watcher.poll_once() is None
    assert [e.phase for e in events if isinstance(e, StartSlow)] == ["load", None]
    assert slow.to_json()["event"] == "slow-start"


def test_no_prediction_no_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deployer.watch.watcher.status", lambda remote, run: {"status": "running"})
    (tmp_path / "state.json").write_text(json.dumps({"status": "running"}))
    (tmp_path / "engine.log").write_text("[2026-11-30 10:00:00] Load weight begin. avail mem=139.80 GB\n")
    events: list[Event] = []
    clock = Clock()
    watcher = Watcher(LocalRemote(), Launch(RunDir(str(tmp_path), "r"), 1, 1, time.time(), 0), 1,
                      Health(startup_timeout_s=10_000, stall_timeout_s=5_000), engine_for("sglang"), events.append,
                      clock=clock)
    clock.now += 4000
    assert watcher.poll_once() is None and not [e for e in events if isinstance(e, StartSlow)]


def test_history_shows_an_attempts_phases() -> None:
    timeline = timeline_of([PhaseSeen("loading weights", 2.0), PhaseSeen("http up", 62.0)], 65.0, 65.0)
    assert timeline_text(timeline.to_json()) == "start 2.0s, load 1m, http up 3.0s -> ready at 1m05s"
    assert timeline_text(None) == "" and timeline_text({"phases": [{"phase": "warp"}]}) == ""
    assert Range(0, 0).text() == "0"


def test_auto_allows_for_a_download_only_where_the_engine_itself_downloads() -> None:
    """Three earlier starts that each downloaded for 10 minutes: a hub id the engine downloads itself gets the
    history's download in its deadline; the same repo fetched by deployer first (engine.weights) or a local path
    does not (the fetch is done before the launch: nothing is downloaded inside this start)."""
    def profile(**engine: object) -> Profile:
        return Profile.model_validate({"name": "demo", "target": {"host": "gpu-box"},
                                       "engine": {"kind": "sglang", "model_path": "Qwen/Qwen3-8B", **engine},
                                       "health": {"startup_timeout_s": "auto"}})

    hub, fetched, local = profile(), profile(weights={"revision": "main"}), profile(model_path="/models/qwen3-8b")
    assert hub.engine.downloads_at_start and not fetched.engine.downloads_at_start
    assert not local.engine.downloads_at_start

    def history(profile: Profile) -> list[PastStart]:
        key = start_key(profile, "0.5.10", "h")
        marks = [(Phase.START, 0.0), (Phase.DOWNLOAD, 5.0), (Phase.LOAD, 605.0), (Phase.READY, 665.0)]
        return [PastStart(key, float(i), Timeline.from_marks(marks, 665.0)) for i in range(3)]

    def deadline(profile: Profile) -> float:
        plan = StartPlan.of(profile, "0.5.10", "h", history(profile))
        assert plan.deadline is not None
        return plan.deadline.seconds

    without_download = 2 * 65 + 120   # the slowest start without its download: 65 s
    assert deadline(fetched) == deadline(local) == 300.0 >= without_download   # the floor
    assert deadline(hub) == 300.0 + 2 * 600                                      # + 2 x the slowest download


def test_a_start_without_the_engines_version_counts_as_the_same_launch_before_it() -> None:
    """`restart` (no preflight) does not ask the target for the engine's version: its start takes the version of
    the latest earlier start of the same launch (measured on real vLLM: restarts were keyed "unknown" and never
    counted). A different launch (other args) stays unknown."""
    profile = _profile(startup_timeout_s="auto")
    known = start_key(profile, "0.5.10", "h")
    older = start_key(profile, "0.5.9", "h")
    history = [_past(older, 1.0), _past(known, 2.0)]
    assert start_key(profile, None, "h", history) == known
    assert start_key(profile, None, "h", history[:1]).engine_version == "0.5.9"
    assert start_key(profile, None, "h").engine_version == "unknown"
    other = profile.patched(args={"tp": 2})
    assert start_key(other, None, "h", history).engine_version == "unknown"
    assert start_key(profile, "0.6.0", "h", history).engine_version == "0.6.0"   # a known version is kept
    restarted = history + [_past(known, 2.5), _past(start_key(profile, None, "h", history), 3.0)]
    plan = StartPlan.of(profile, None, "h", restarted)
    assert plan.prediction is not None and plan.prediction.starts == 3 and plan.key == known


def _past(key: StartKey, at: float) -> PastStart:
    marks = [(Phase.START, 0.0), (Phase.LOAD, 2.0), (Phase.READY, 30.0)]
    return PastStart(key, at, Timeline.from_marks(marks, 30.0))
