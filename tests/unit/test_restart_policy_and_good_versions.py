"""Issue 22 findings 6 and 8 in the deployer's own logic: the default restart policy and what `up` says of it,
which runs count as good (stayed up), and that rollback / restart never go to a version that crash-looped."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from deployer.errors import NotFound
from deployer.operate.rollback import _last_good
from deployer.profile.model import Logs, Restart
from deployer.runner.report import restart_summary
from deployer.box.push import RunDir
from deployer.box.records import RunView


def view(run_id: str, content: str, state: dict[str, Any], outcome: str | None = "ready") -> RunView:
    return RunView(RunDir(f"/w/d/runs/{run_id}", run_id), {"content_hash": content * 16}, state,
                   {"outcome": outcome} if outcome else None)


READY = {"status": "ready", "ready_at": 10.0, "last_crash": None}
STABLE = {"status": "stopped", "ready_at": 10.0, "stable_at": 70.0, "last_crash": {"at": 90.0}}
LOOPED = {"status": "crashloop", "ready_at": 10.0, "last_crash": {"at": 20.0}, "crashloop_after_ready": True,
          "restarts": 5}
SILENCED = {"status": "stopped", "stopped_from": "crashloop", "ready_at": 10.0, "last_crash": {"at": 20.0}}
OLD_RELEASE_STOPPED = {"status": "stopped", "ready_at": 10.0, "last_crash": None}  # no stable_at key at all
CRASHED_UNSTABLE = {"status": "exited", "ready_at": 10.0, "last_crash": {"at": 12.0}}


def test_the_default_policy_restarts_a_crash_after_ready_and_is_said() -> None:
    default = Restart()
    assert (default.policy, default.stable_s, default.on_boot) == ("on-failure", 60.0, True)
    said = restart_summary(default)
    assert said["policy"] == "on-failure" and said["text"].startswith("a crash after ready is restarted on the target")
    assert "crashloop after 5 restarts in 600 s" in said["text"] and "restart.policy: no turns it off" in said["text"]
    assert restart_summary(Restart(policy="no", on_boot=False))["text"] == \
        "a crash after ready stays down (restart.policy: no)"


def test_logs_head_must_be_below_the_rotation_size() -> None:
    with pytest.raises(ValidationError, match="head_bytes must be below"):
        Logs(max_bytes=100_000, head_bytes=100_000)


@pytest.mark.parametrize(("state", "outcome", "good"), [
    (READY, "ready", True), (STABLE, "ready", True), (OLD_RELEASE_STOPPED, "ready", True),
    (LOOPED, "ready", False), (SILENCED, "ready", False), (CRASHED_UNSTABLE, "ready", False),
    ({"status": "exited", "ready_at": None, "last_crash": {"at": 1.0}}, "crashed", False),
])
def test_a_version_is_good_only_if_it_stayed_up(state: dict[str, Any], outcome: str, good: bool) -> None:
    assert view("r", "a", state, outcome).stayed_up is good


def test_rollback_skips_a_version_that_crash_looped_after_ready() -> None:
    runs = [view("r1", "a", STABLE), view("r2", "b", SILENCED), view("r3", "c", READY)]
    assert _last_good(runs, None, skip_hash="c" * 16).run.run_id == "r1"  # not r2, though it reached ready


def test_restart_of_a_crash_looping_version_is_refused() -> None:
    current = view("r2", "b", LOOPED)
    with pytest.raises(NotFound, match="crash-looped after ready \\(5 restarts\\)"):
        _last_good([view("r1", "a", STABLE), current], current, skip_hash=None)
    fine = view("r3", "c", READY)
    assert _last_good([fine], fine, skip_hash=None) is fine
