"""The on-call commands (status, down, history; a node group's status) against the scripted fake target
(deployer/remote/fake.py): the rows are pinned here as `--json` prints them, whatever types carry them."""

from __future__ import annotations

import json
import posixpath
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_pipeline_fake import CRASH, OPTS, PORT, WORKDIR, deployment_dir, profile  # noqa: E402

import deployer.remote.connect as connect_mod  # noqa: E402
from deployer.deployments.nodes import ops as node_ops  # noqa: E402
from deployer.deployments.nodes.plan import plan_nodes  # noqa: E402
from deployer.operate import deployment as ops  # noqa: E402
from deployer.operate.history import history  # noqa: E402
from deployer.profile.model import Profile  # noqa: E402
from deployer.host import TargetSpec  # noqa: E402
from deployer.remote.fake import FakeRemote  # noqa: E402
from deployer.runner.up import up  # noqa: E402

REF = ops.Ref("demo", TargetSpec("gpu-box"), WORKDIR)


@pytest.fixture(autouse=True)
def local_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))


def hosts(monkeypatch: pytest.MonkeyPatch, fakes: dict[str, FakeRemote]) -> None:
    """Commands that open their own connection get the fake host of the spec's name."""
    monkeypatch.setattr(connect_mod, "connect", lambda spec: fakes[spec.host])


def deployed(fake: FakeRemote, prof: Profile | None = None) -> dict[str, Any]:
    return up(prof or profile(), OPTS, lambda _e: None, connection=fake).to_json()


def serving_row(report: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"name": "demo", "host": "fake", "status": "ready", "pid": 5000, "uptime_s": changes.pop("uptime_s"),
            "healthy": True, "attempt": 1, "content_hash": report["content_hash"], "run_dir": report["run_dir"],
            "port": PORT, "restarts": 0, "last_crash": None, "exit_code": None, "signal_name": None, "drift": [],
            "runs": 1, "diagnosis": None, "lock": None, "serving": True,
            "metrics": None if changes.get("serving") is False else NO_METRICS, "unhealthy": None,
            "engine": "sglang", "engine_version": None, "model": "/models/tiny", "supervisor": None, **changes}


# the profile has SGLang's metrics off (no enable_metrics): /metrics is not asked, and the fake box has no
# nvidia-smi: status says so, numbers absent
NO_METRICS = {"off": True, "error": "metrics off (add `enable_metrics: true` to engine.args (SGLang serves /metrics "
                                    "only with --enable-metrics))", "gpu_memory": None}


CRASH_DIAGNOSIS = {"signature": None, "summary": "unknown failure: RuntimeError: the fake engine broke",
                   "transient": False, "evidence": ["RuntimeError: the fake engine broke"],
                   "traceback": CRASH[CRASH.index("Traceback"):].rstrip("\n"), "remedy": None, "hint": None}


def test_status_of_a_serving_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRemote()
    report = deployed(fake)
    (typed,) = ops.status(REF, fake)
    row = typed.to_json()
    assert 0 <= row["uptime_s"] < 30
    assert list(row) == list(serving_row(report, uptime_s=row["uptime_s"]))   # the keys in --json's order
    assert row == serving_row(report, uptime_s=row["uptime_s"])
    assert ops.worst_exit_code([typed]) == ops.SERVING and typed.diagnosis is None and not fake.unknown
    hosts(monkeypatch, {"gpu-box": fake})
    assert [r.status for r in ops.status(ops.Ref(None, TargetSpec("gpu-box"), WORKDIR))] == ["ready"]


def test_status_of_a_crash_after_ready_names_why(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRemote()
    report = deployed(fake)
    fake.crash(report["run_dir"], log=CRASH)
    (typed,) = ops.status(REF, fake)
    row = typed.to_json()
    crash = {**fake.states[report["run_dir"]]["last_crash"], "diagnosis": CRASH_DIAGNOSIS}   # type: ignore[dict-item]
    assert row == serving_row(report, uptime_s=None, status="exited", healthy=False, exit_code=1, serving=False,
                              last_crash=crash, diagnosis=CRASH_DIAGNOSIS)
    assert crash["traceback_offset"] == len("loading the model\nThe server is fired up and ready to roll!\n") + \
        CRASH.index("Traceback")
    assert ops.worst_exit_code([typed]) == ops.CRASHED and not fake.unknown
    assert typed.last_crash is not None and typed.last_crash.exit_code == 1 and typed.diagnosis is not None
    assert typed.last_crash.diagnosis == typed.diagnosis and typed.diagnosis.summary == CRASH_DIAGNOSIS["summary"]


def test_down_and_history(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRemote()
    report = deployed(fake)
    hosts(monkeypatch, {"gpu-box": fake})
    assert ops.down(REF, 1.0).to_json() == {"name": "demo", "host": "fake", "was_running": True, "status": "stopped",
                                  "stopped_from": None, "on_boot": "unknown", "run_dir": report["run_dir"]}
    assert ops.down(REF, 1.0).was_running is False
    run_id = report["attempts"][0]["run_id"]
    state = fake.states[report["run_dir"]]
    record = fake.json_file(posixpath.join(report["run_dir"], "profile.json")) or {}
    (entry,) = history(REF)
    assert (entry.lock, entry.run_id, entry.outcome, entry.current, entry.signature) == (False, run_id, "ready",
                                                                                         True, "")
    assert [e.to_json() for e in history(REF)] == [{"kind": "attempt", "run_id": run_id, "current": True, "attempt": 1,
                             "up_id": record["up_id"], "started_at": state["started_at"],
                             "content_hash": report["content_hash"], "outcome": "ready", "detail": "ready",
                             "good": True, "diagnosis": None, "change": None, "drift": [], "restarts": 0,
                                 "phases": [{"phase": "ready", "elapsed": 0.0}],
                                 "timeline": {"phases": [{"phase": "start", "start_s": 0.0, "duration_s": 0.0}],
                                              "ready_s": 0.0, "download_bytes": None}}]


def node_json(prof: Profile, node: int | None) -> list[dict[str, Any]]:
    return [row.to_json() for row in node_ops.status(prof, node, None, False)]


def two_nodes() -> Profile:
    return Profile.model_validate({
        "name": "two", "nodes": [{"host": "node-0", "workdir": WORKDIR}, {"host": "node-1", "workdir": WORKDIR}],
        "engine": {"kind": "sglang", "python": "/usr/bin/python3", "model_path": "/models/tiny", "port": PORT,
                   "dist_init_port": 20000, "args": {"tp_size": 2}},
        "health": {"interval_s": 0.05, "startup_timeout_s": 20, "stall_timeout_s": 10},
        "retry": {"max_attempts": 1, "backoff_s": 0}, "restart": {"grace_s": 1}})


def group(monkeypatch: pytest.MonkeyPatch, *, reachable: bool = True) -> tuple[Profile, dict[str, FakeRemote],
                                                                                  list[dict[str, Any]]]:
    """A two-node group, each node's engine deployed as the group's `up` leaves it (a single-host run each)."""
    prof, fakes = two_nodes(), {"node-0": FakeRemote(), "node-1": FakeRemote()}
    for name, fake in fakes.items():
        fake.addresses.add(name)
    if reachable:
        fakes["node-0"].peers["node-1"] = fakes["node-1"]   # node 0 reaches the follower's dummy health
    reports = [deployed(fakes[plan.node.host], plan.profile) for plan in plan_nodes(prof)]
    hosts(monkeypatch, fakes)
    return prof, fakes, reports


def test_a_node_groups_status_asks_the_followers_health_from_node_0(monkeypatch: pytest.MonkeyPatch) -> None:
    prof, fakes, reports = group(monkeypatch)
    rows = node_json(prof, None)
    common = {"name": "two", "first_crash": False}
    assert rows == [
        {**serving_row(reports[0], uptime_s=rows[0]["uptime_s"]), **common, "node": 0, "role": "rank 0 (API)"},
        {**serving_row(reports[1], uptime_s=rows[1]["uptime_s"], metrics=None), **common, "node": 1,
         "role": "dummy health",
         "health_seen_from": "node 0"}]
    assert [k for k in rows[1] if k not in rows[0]] == ["health_seen_from"]
    assert list(rows[1])[-4:] == ["node", "role", "health_seen_from", "first_crash"]
    asked = [r for r in fakes["node-0"].requests if r["op"] == "http" and r["address"] == "node-1"]
    assert [(r["port"], r["path"]) for r in asked] == [(PORT, "/health")]
    assert not fakes["node-0"].unknown and not fakes["node-1"].unknown
    (one,) = node_json(prof, 1)
    assert one["node"] == 1 and one["healthy"] is True


def test_a_follower_node_0_cannot_reach_is_not_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    prof, _, _ = group(monkeypatch, reachable=False)
    rows = node_json(prof, None)
    assert [(r["node"], r["healthy"], r["serving"]) for r in rows] == [(0, True, True), (1, False, False)]
    assert ops.worst_exit_code(node_ops.status(prof, None, None, False)) == ops.NOT_SERVING


def test_a_node_groups_crash_is_diagnosed_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    prof, fakes, reports = group(monkeypatch)
    fakes["node-1"].crash(reports[1]["run_dir"], log=CRASH)
    rows = node_json(prof, None)
    assert [(r["node"], r["status"], r["first_crash"]) for r in rows] == [(0, "ready", False), (1, "exited", False)]
    assert rows[1]["last_crash_diagnosis"] == CRASH_DIAGNOSIS == rows[1]["diagnosis"]
    assert "last_crash_diagnosis" not in rows[0] and "health_seen_from" not in rows[1]
    assert list(rows[1])[-4:] == ["node", "role", "last_crash_diagnosis", "first_crash"]
    fakes["node-0"].crash(reports[0]["run_dir"], log=CRASH)
    rows = node_json(prof, None)
    assert sum(r["first_crash"] for r in rows) == 1
    assert posixpath.basename(rows[0]["run_dir"]) == reports[0]["attempts"][0]["run_id"]


def test_history_shows_the_locks_events_among_the_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRemote()
    report = deployed(fake)
    started = fake.states[report["run_dir"]]["started_at"]
    assert started is not None
    holder = {"owner": "ann@laptop", "pid": 1, "host_id": "laptop/b", "command": "up"}
    event = {"at": started + 5, "event": "lock-broken", "by": {**holder, "owner": "bob@desk"}, "from": holder}
    Path(deployment_dir(fake), "lock-events.jsonl").write_text(json.dumps(event) + "\n")
    hosts(monkeypatch, {"gpu-box": fake})
    entries = history(REF)
    assert [(e.lock, e.outcome) for e in entries] == [(True, "lock-broken"), (False, "ready")]
    assert entries[0].to_json() == {"kind": "lock", "started_at": started + 5, "outcome": "lock-broken",
                                    "detail": entries[0].detail, "by": event["by"], "from": holder}
    assert entries[0].detail and "broke the lock" in entries[0].detail
