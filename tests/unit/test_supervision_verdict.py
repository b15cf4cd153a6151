"""The target's verdict on a run's supervisor (base.supervision) and what status makes of it
(oncall.deployment.supervision_note): pure, no target. The real dead/frozen supervisors: tests/integration/
test_supervisor_heartbeat.py."""

from __future__ import annotations

from typing import Any

import pytest

from deployer.operate.deployment import supervision_note
from deployer.supervisor.base import HEARTBEAT_STALE, supervision

NOW = 1_000_000.0


def state(status: str, supervisor_alive: bool = True, beat_age: float | None = 1.0) -> dict[str, Any]:
    return {"status": status, "supervisor_alive": supervisor_alive, "supervisor_pid": 7, "pid": 9,
            "heartbeat_at": None if beat_age is None else NOW - beat_age}


@pytest.mark.parametrize(("given", "verdict"), [
    (state("ready"), "ok"),
    (state("restarting"), "ok"),
    (state("ready", beat_age=HEARTBEAT_STALE + 1), "frozen"),
    (state("ready", beat_age=HEARTBEAT_STALE - 1), "ok"),
    (state("ready", beat_age=None), "ok"),  # a supervisor from before the heartbeat: not judged frozen
    (state("ready", supervisor_alive=False), "dead"),
    (state("lost", supervisor_alive=False), "dead"),
    (state("stopping", beat_age=HEARTBEAT_STALE + 1), None),  # a long grace: nothing to watch
    (state("exited", supervisor_alive=False), None),
    ({"status": "ready"}, None),  # liveness not looked at
])
def test_the_verdict_on_a_supervisor(given: dict[str, Any], verdict: str | None) -> None:
    assert supervision(given, NOW) == verdict


def test_status_names_the_fix_for_each_verdict() -> None:
    assert supervision_note({"supervisor": "ok", "status": "ready"}, "chat", "gpu") is None
    assert supervision_note({"status": "exited"}, "chat", "gpu") is None
    dead = supervision_note({"supervisor": "dead", "status": "ready", "supervisor_pid": 7, "pid": 9}, "chat", "gpu")
    assert dead is not None and "(pid 7) is gone" in dead["summary"] and "back under a supervisor" in dead["next"]
    lost = supervision_note({"supervisor": "dead", "status": "lost", "supervisor_pid": 7}, "chat", "gpu")
    assert lost is not None and "both gone" in lost["summary"] and "starts it again" in lost["next"]
    frozen = supervision_note({"supervisor": "frozen", "status": "ready", "supervisor_pid": 7,
                               "heartbeat_age_s": 31.0}, "chat", "gpu")
    assert frozen is not None and "31.0s" in frozen["summary"] and "on gpu: `kill -CONT 7`" in frozen["next"]
