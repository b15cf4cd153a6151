"""A start's place in its history: the StartKey of an attempt, the earlier starts read from the target's records
(each run's outcome.json keeps its `start_key` and `timeline`), the prediction shown when an attempt starts, and
the deadline `health.startup_timeout_s: auto` derives from them (observe/timeline.py has the rules).

The target's records, not the local history: they are there whichever laptop deploys, and they are what `history`
reads. A deployment's run dirs beyond `retention.keep_runs` are gone, and with them their starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from deployer.errors import DeployError
from deployer.events import StartPredicted
from deployer.observe.timeline import (
    AutoTimeout, PastStart, Phase, Prediction, StartKey, Timeline, auto_startup_timeout, phase_of_watch, predict,
)
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.runner.report import PhaseSeen
from deployer.box import snapshot
from deployer.box.push import Layout


UNKNOWN_VERSION = "unknown"


def start_key(profile: Profile, version: str | None, host: str, history: Sequence[PastStart] = ()) -> StartKey:
    """What makes an attempt's start comparable with earlier ones. Without the engine's version (a restart or
    `--skip-preflight` does not ask the target for it), the version of the latest earlier start of this very launch
    (model, revision, host, arguments) that knew one: the same launch again, not a start of an unknown engine that
    never counts (else "unknown")."""
    engine = profile.engine
    key = StartKey(model=engine.model_path, revision=str(engine.args.get("revision") or ""),
                   engine_version=version or engine.version or UNKNOWN_VERSION, host=host,
                   args_hash=StartKey.hash_args(engine.args))
    if key.engine_version != UNKNOWN_VERSION:
        return key
    same = [s for s in history if s.key.engine_version != UNKNOWN_VERSION
            and replace(s.key, engine_version=UNKNOWN_VERSION) == key]
    if not same:
        return key
    return replace(key, engine_version=max(same, key=lambda s: s.started_at).key.engine_version)


def timeline_of(seen: Sequence[PhaseSeen], ready_s: float | None, ended_s: float) -> Timeline:
    """The timeline of the phases a watch saw (the watcher's names): launch to the first phase counts as `start`,
    a phase entered again right after itself is one phase; `ready_s` (None: never ready) ends it."""
    marks: list[tuple[Phase, float]] = [(Phase.START, 0.0)]
    for seen_phase in seen:
        phase = phase_of_watch(seen_phase.phase)
        if phase is None or phase is Phase.READY or phase is marks[-1][0]:
            continue
        marks.append((phase, max(seen_phase.elapsed, marks[-1][1])))
    if ready_s is not None:
        marks.append((Phase.READY, max(ready_s, marks[-1][1])))
    return Timeline.from_marks(marks, ended_s)


def past_starts(records: Iterable[dict[str, Any]]) -> list[PastStart]:
    """The starts kept in run records ({"state", "outcome"} of snapshot.take): those with a key and a timeline."""
    starts = []
    for record in records:
        outcome, state = record.get("outcome") or {}, record.get("state") or {}
        key, timeline = outcome.get("start_key"), outcome.get("timeline")
        if not isinstance(key, dict) or not isinstance(timeline, dict):
            continue
        try:
            starts.append(PastStart(StartKey(**{k: str(key[k]) for k in StartKey.__dataclass_fields__}),
                                    float(state.get("started_at") or outcome.get("started_at") or 0.0),
                                    Timeline.from_json(timeline)))
        except (KeyError, TypeError, ValueError):
            continue  # a record of another release: not a start to predict from
    return starts


def read_past_starts(remote: Remote, layout: Layout) -> list[PastStart]:
    """Every start the deployment's run dirs on the target keep (one helper call); none when they cannot be read
    (a prediction is a help, never a reason to fail an `up`)."""
    try:
        snap = snapshot.take(remote, layout.root, runs=None)
    except DeployError:
        return []
    return past_starts(snap.records.get(run) or {} for run in snap.runs)


@dataclass(frozen=True)
class StartPlan:
    """One attempt's start: its key, the prediction (None: fewer than 3 earlier ready starts with that key) and,
    for `startup_timeout_s: auto`, the derived deadline."""

    key: StartKey
    prediction: Prediction | None
    deadline: AutoTimeout | None

    @classmethod
    def of(cls, profile: Profile, version: str | None, host: str, history: Sequence[PastStart]) -> StartPlan:
        key = start_key(profile, version, host, history)
        prediction = predict(history, key)
        auto = profile.health.startup_timeout_s == "auto"
        # weights fetched before the launch (or a local path): no download inside this start, whatever the
        # history's starts downloaded; else the history's slowest download is allowed for
        download = None if profile.engine.downloads_at_start else 0
        return cls(key, prediction, auto_startup_timeout(prediction, download) if auto else None)

    def watched(self, profile: Profile) -> Profile:
        """The profile the watch uses: `auto` replaced by the derived deadline."""
        if self.deadline is None:
            return profile
        health = profile.health.model_copy(update={"startup_timeout_s": self.deadline.seconds})
        return profile.model_copy(update={"health": health})

    def event(self, attempt: int) -> StartPredicted | None:
        """The prediction as the event `up` shows; None without one."""
        p = self.prediction
        if p is None:
            return None
        return StartPredicted(attempt=attempt, starts=p.starts, ready=[p.ready.low, p.ready.high],
                              phases={phase.value: [r.low, r.high] for phase, r in p.phases.items()},
                              summary=p.summary(),
                              startup_timeout_s=None if self.deadline is None else round(self.deadline.seconds, 1))
