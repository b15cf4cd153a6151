"""Startup timelines: built from phase marks, predicted from >= 3 earlier starts with the same key, the check
that a running start is far beyond its prediction, and `startup_timeout_s: auto`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deployer.observe.timeline import (
    WATCH_PHASES, Overrun, PastStart, Phase, Range, StartKey, Timeline, TimeoutRule, auto_startup_timeout,
    duration_text, far_beyond, phase_of_watch, predict,
)

KEY = StartKey("Qwen/Qwen3-8B", "abc123", "0.32.0", "gpu-1", StartKey.hash_args({"max_model_len": 8192}))
OTHER_HOST = StartKey("Qwen/Qwen3-8B", "abc123", "0.32.0", "gpu-2", KEY.args_hash)

P = Phase


def _start(ready_s: float, load_s: float = 60.0, download_s: float = 0.0, download_bytes: int | None = None,
           ready: bool = True) -> Timeline:
    """start 20 s, [download], load, compile 30 s, kv 10 s, graph capture, http up 5 s, then ready."""
    marks: list[tuple[Phase, float]] = [(P.START, 0.0)]
    at = 20.0
    if download_s:
        marks.append((P.DOWNLOAD, at))
        at += download_s
    marks += [(P.LOAD, at), (P.COMPILE, at + load_s), (P.KV_ALLOCATION, at + load_s + 30),
              (P.GRAPH_CAPTURE, at + load_s + 40)]
    http = ready_s - 5
    marks.append((P.HTTP_UP, http))
    if ready:
        marks.append((P.READY, ready_s))
    return Timeline.from_marks(marks, ended_s=ready_s, download_bytes=download_bytes)


def _history(*ready: float, key: StartKey = KEY) -> list[PastStart]:
    return [PastStart(key, 1_000.0 + i, _start(r)) for i, r in enumerate(ready)]


def test_a_timeline_from_marks() -> None:
    t = Timeline.from_marks([(P.START, 0), (P.LOAD, 5), (P.COMPILE, 9), (P.KV_ALLOCATION, 12), (P.HTTP_UP, 14),
                             (P.READY, 20)], ended_s=21)
    assert [(r.phase, r.start_s, r.duration_s) for r in t.phases] == [
        (P.START, 0, 5), (P.LOAD, 5, 4), (P.COMPILE, 9, 3), (P.KV_ALLOCATION, 12, 2), (P.HTTP_UP, 14, 6)]
    assert t.ready_s == 20 and t.elapsed() == 20 and t.duration(P.DOWNLOAD) == 0
    assert Timeline.from_json(t.to_json()) == t


def test_a_running_start_lasts_until_now_and_is_not_ready() -> None:
    t = Timeline.from_marks([(P.START, 0), (P.LOAD, 5)], ended_s=65)
    assert t.ready_s is None and t.current is not None and t.current.phase is P.LOAD
    assert t.current.duration_s == 60 and t.elapsed() == 65


def test_the_watchers_phase_names_map_to_timeline_phases() -> None:
    assert phase_of_watch("loading weights") is P.LOAD and phase_of_watch("downloading") is P.DOWNLOAD
    assert phase_of_watch("allocating cache") is P.KV_ALLOCATION and phase_of_watch("no such") is None
    assert set(WATCH_PHASES.values()) <= set(Phase)


def test_every_phase_the_engines_and_the_watcher_name_has_a_timeline_phase() -> None:
    """Read as text (the engines' classes are being reshaped): a phase name added there must be mapped here."""
    root = Path(__file__).resolve().parents[2] / "deployer"
    named = {m for path in (root / "engines").rglob("*.py")
             for m in re.findall(r'Phase\("([^"]+)"', path.read_text(encoding="utf-8"))}
    named |= set(re.findall(r'"(starting|downloading)"', (root / "watch" / "watcher.py").read_text(encoding="utf-8")))
    assert len(named) >= 8, f"the engines' phases moved: update observe.timeline.WATCH_PHASES ({sorted(named)})"
    assert named <= set(WATCH_PHASES), sorted(named - set(WATCH_PHASES))


def test_no_prediction_from_fewer_than_three_starts_with_the_key() -> None:
    history = _history(460, 480) + _history(470, 490, 500, key=OTHER_HOST)
    assert predict(history, KEY) is None
    failed = PastStart(KEY, 2_000, _start(470, ready=False))
    assert failed.timeline.ready_s is None
    assert predict(history + [failed], KEY) is None   # a start that never got ready predicts nothing


def test_prediction_from_the_last_three_starts() -> None:
    # the oldest start (2000 s, before a fix) is not among the last 3
    history = _history(2000, 460, 490, 475) + _history(30, 31, 32, key=OTHER_HOST)
    prediction = predict(history, KEY)
    assert prediction is not None and prediction.starts == 3
    assert prediction.ready == Range(460, 490)
    assert prediction.phases[P.DOWNLOAD] == Range(0, 0) and prediction.phases[P.LOAD] == Range(60, 60)
    # graph capture ran until http up: ready - 5 - (20 + 60 + 40)
    assert prediction.phases[P.GRAPH_CAPTURE] == Range(460 - 125, 490 - 125)
    assert prediction.summary() == ("last 3 starts: ready in 7m40s-8m10s; start 20s; download 0; load 1m; "
                                    "compile 30s; kv allocation 10s; graph capture 5m35s-6m05s; http up 5.0s")


def test_a_running_start_far_beyond_its_phase() -> None:
    prediction = predict(_history(460, 490, 475), KEY)
    assert prediction is not None
    assert far_beyond(60) == 150
    fine = Timeline.from_marks([(P.START, 0), (P.LOAD, 20)], ended_s=20 + 150)
    assert prediction.check(fine) is None
    stuck = Timeline.from_marks([(P.START, 0), (P.LOAD, 20)], ended_s=20 + 151)
    overrun = prediction.check(stuck)
    assert overrun == Overrun(P.LOAD, 151, Range(60, 60), 3)
    assert overrun.message() == "load has run 2m31s; the last 3 starts took 1m (far beyond: over 2m30s)"


def test_a_download_the_earlier_starts_did_not_need_is_not_held_against_the_start() -> None:
    prediction = predict(_history(460, 490, 475), KEY)
    assert prediction is not None
    downloading = Timeline.from_marks([(P.START, 0), (P.DOWNLOAD, 20)], ended_s=20 + 3600)
    assert prediction.check(downloading) is None
    # after an hour's download the graph capture runs; the start less its download is what is compared
    later = Timeline.from_marks([(P.START, 0), (P.DOWNLOAD, 20), (P.LOAD, 3620), (P.COMPILE, 3680),
                                 (P.KV_ALLOCATION, 3710), (P.GRAPH_CAPTURE, 3720)], ended_s=3720 + 300)
    assert prediction.check(later) is None
    overrun = prediction.check(Timeline.from_marks(later_marks(), ended_s=3720 + 700))
    assert overrun is not None and overrun.phase is P.GRAPH_CAPTURE
    # every predicted phase within its limit, then one the earlier starts never had (waiting for the first token)
    slow = later_marks() + [(P.HTTP_UP, 3720 + 340), (P.FIRST_TOKEN, 3720 + 345)]
    assert prediction.check(Timeline.from_marks(slow, ended_s=3720 + 650)) is None
    whole = prediction.check(Timeline.from_marks(slow, ended_s=3720 + 700))
    assert whole is not None and whole.phase is None and whole.elapsed_s == 3720 + 700 - 3600
    assert whole.elapsed_s > far_beyond(490) == 795
    assert whole.message().startswith("the start has run 13m40s; the last 3 starts took 7m40s-8m10s")


def later_marks() -> list[tuple[Phase, float]]:
    return [(P.START, 0), (P.DOWNLOAD, 20), (P.LOAD, 3620), (P.COMPILE, 3680), (P.KV_ALLOCATION, 3710),
            (P.GRAPH_CAPTURE, 3720)]


# --- startup_timeout_s: auto ------------------------------------------------------------------------------------

def test_auto_timeout_without_history_is_the_default_plus_the_download() -> None:
    assert auto_startup_timeout(None, 0).seconds == 1800
    assert auto_startup_timeout(None, None).seconds == 1800
    sixteen_gib = 16 * 2 ** 30
    auto = auto_startup_timeout(None, sixteen_gib)
    assert auto.seconds == pytest.approx(1800 + sixteen_gib / (20 * 2 ** 20))
    assert "16.0 GiB to download at 20.0 MiB/s (an assumed speed)" in auto.why


def test_auto_timeout_from_the_history() -> None:
    prediction = predict(_history(460, 490, 475), KEY)
    auto = auto_startup_timeout(prediction, 0)
    assert auto.seconds == 2 * 490 + 120
    assert auto.why == "2 x the slowest of the last 3 starts (8m10s) + 2m, at least 5m = 18m20s"
    fast = predict(_history(20, 22, 21), KEY)
    assert auto_startup_timeout(fast, 0).seconds == 300   # the floor
    assert auto_startup_timeout(fast, 0, TimeoutRule(floor_s=60)).seconds == 2 * 22 + 120


def test_auto_timeout_counts_a_download_at_the_measured_speed() -> None:
    size = 10 * 2 ** 30
    history = [PastStart(KEY, 1_000.0 + i, _start(600 + r, download_s=100 + r, download_bytes=size))
               for i, r in enumerate((0, 20, 10))]
    prediction = predict(history, KEY)
    assert prediction is not None
    assert prediction.download_rate == pytest.approx(size / 120)            # the slowest: 120 s
    assert prediction.ready_without_download == Range(500, 500)
    auto = auto_startup_timeout(prediction, size)
    assert auto.seconds == pytest.approx(2 * 500 + 120 + size / (size / 120 / 2))   # 1120 + 240
    # size unknown: twice the slowest earlier download
    assert auto_startup_timeout(prediction, None).seconds == pytest.approx(1120 + 2 * 120)
    # weights cached: nothing to add
    assert auto_startup_timeout(prediction, 0).seconds == 1120


def test_durations_for_people() -> None:
    assert [duration_text(s) for s in (0, 0.4, 9.96, 42, 60, 460, 3900)] == [
        "0", "0.4s", "10.0s", "42s", "1m", "7m40s", "1h05m"]
    assert Range(460, 490).text() == "7m40s-8m10s" and Range(0, 0).text() == "0"
