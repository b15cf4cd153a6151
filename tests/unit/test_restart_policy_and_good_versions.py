"""Issue 22 findings 6 and 8 in the deployer's own logic: the default restart policy and what `up` says of it,
which runs count as good (stayed up), and that rollback / restart never go to a version that crash-looped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from deployer import api
from deployer.deployments.nodes.deployment import NodeGroup
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
# a node group's rank whose supervisor ended it when its peer went away: a replace stops every rank at once
PEER_STOPPED = {"status": "stopped", "stopped_for": "replace", "ready_at": 10.0,
                "last_crash": {"at": 12.0, "peer_lost": "rank 0 at 10.0.0.1:5000: gone"}}


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
    (PEER_STOPPED, "ready", True), ({**PEER_STOPPED, "crashloop_after_ready": True}, "ready", False),
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


def _group_runs(tmp_path: Path, leader: list[RunView], follower: list[RunView],
                monkeypatch: pytest.MonkeyPatch) -> NodeGroup:
    """A two-node group whose nodes' runs are `leader` (node 0, the last one current) and `follower`."""
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump({"name": "group", "nodes": [{"host": "node-0"}, {"host": "node-1"}],
                                    "engine": {"model_path": "Qwen/Qwen3-8B", "python": "/venv/bin/python", "port": 30000,
                                               "dist_init_port": 20000}}))
    group = NodeGroup(api.load(str(path)))
    runs = {"node-0": (leader, leader[-1].run.run_id), "node-1": (follower, follower[-1].run.run_id)}
    monkeypatch.setattr(group, "_node_refs", lambda: ["node-0", "node-1"])
    monkeypatch.setattr(group, "_runs", lambda ref: runs[ref])
    return group


def _rank(run_id: str, content: str, state: dict[str, Any], up_id: str) -> RunView:
    return RunView(RunDir(f"/w/group/runs/{run_id}", run_id),
                   {"content_hash": content * 16, "up_id": up_id, "attempt": 1}, state, {"outcome": "ready"})


def test_a_group_rolls_back_to_a_version_whose_follower_ended_only_because_its_peer_was_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race of a replace: every rank is asked to stop at once; node 0 stopped first and node 1's supervisor
    ended its rank on the lost peer before its own stop arrived (seen in CI: rollback said no version was ready)."""
    stopped = {"status": "stopped", "stopped_for": "replace", "ready_at": 10.0, "last_crash": None}
    group = _group_runs(tmp_path, [_rank("r1", "a", stopped, "u1"), _rank("r2", "b", READY, "u2")],
                        [_rank("f1", "a", PEER_STOPPED, "u1"), _rank("f2", "b", READY, "u2")], monkeypatch)
    assert group._last_good_group().run.run_id == "r1"


def test_a_group_whose_rank_really_crashed_is_not_gone_back_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0 crashed on its own (no peer_lost): the follower's peer_lost end does not make that version good."""
    group = _group_runs(tmp_path, [_rank("r1", "a", CRASHED_UNSTABLE, "u1"), _rank("r2", "b", READY, "u2")],
                        [_rank("f1", "a", PEER_STOPPED, "u1"), _rank("f2", "b", READY, "u2")], monkeypatch)
    with pytest.raises(NotFound, match="no other version ever reached ready on every node"):
        group._last_good_group()
