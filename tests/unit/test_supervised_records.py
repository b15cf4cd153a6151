"""The run dir records of a supervised process, pinned: supervise.json and profile.json of an engine and of a
router as the previous release wrote them (captured before the router and the engine shared one spec), so a
deployment made by that release reads the same and a new one writes the same bytes."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from deployer.deployments.fleet import router as router_mod
from deployer.deployments.fleet.members import fleet_of
from deployer.profile.loader import load_profile
from deployer.profile.model import Target
from deployer.remote.program import payload_bundle
from deployer.render.bundle import render
from deployer.box import switch
from deployer.box.push import Layout, profile_record, supervisor_config

RECORDS = Path(__file__).parent / "records"
ADDRESSES = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}
URLS = ["http://10.0.0.1:30000", "http://10.0.0.2:30001"]


def _addr(target: Target) -> str:
    return ADDRESSES[target.host]


def _load(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile(path, environ={"TOKEN_FOR_TEST": "hf_secret_value", "ROUTER_KEY_FOR_TEST": "rk-secret-9"})


def _fleet(tmp_path: Path) -> Any:
    return _load(tmp_path, {
        "name": "qwen3-8b-fleet",
        "replicas": [{"host": "gpu-a"}, {"host": "gpu-b", "engine_port": 30001}],
        "engine": {"model_path": "Qwen/Qwen3-8B", "python": "/venv/bin/python", "gpus": [0],
                   "env": {"HF_TOKEN": "${TOKEN_FOR_TEST}"}},
        "restart": {"policy": "on-failure", "max": 3, "grace_s": 500},
        "router": {"python": "/workspace/router-venv/bin/python", "port": 8000, "policy": "cache_aware",
                   "args": {"health_check_interval_secs": 5, "api_key": "${ROUTER_KEY_FOR_TEST}"}}})


def _engine(tmp_path: Path) -> Any:
    return _load(tmp_path, {
        "name": "qwen3-8b", "target": {"host": "gpu-a", "workdir": "/workspace/deployer"},
        "engine": {"model_path": "Qwen/Qwen3-8B", "python": "/venv/bin/python", "gpus": [0], "port": 30000,
                   "env": {"HF_TOKEN": "${TOKEN_FOR_TEST}"}},
        "restart": {"policy": "always", "backoff_s": [5, 60], "grace_s": 12}})


@pytest.fixture(autouse=True)
def _fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1700000000.5)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID("0123456789abcdef0123456789abcdef"))


def _text(value: Any) -> str:
    return json.dumps(value, indent=1)   # as push() writes them


def _pinned(name: str, value: Any, **known: str) -> None:
    """The record as pinned, but for the values that change with this deployer's version (the launch script
    names it): those are checked against what they are computed from, then stand as placeholders."""
    shown = dict(value)
    for key, expected in known.items():
        assert shown[key] == expected
        shown[key] = f"<{key}>"
    assert _text(shown) + "\n" == (RECORDS / name).read_text()


def test_router_records_are_the_previous_releases(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    member = fleet_of(fleet, _addr).router
    assert member is not None
    bundle = router_mod.render_router(member, URLS, fleet)
    _pinned("router-supervise.json", router_mod.router_supervise(member, fleet))
    _pinned("router-profile.json", router_mod.router_record(member, fleet, bundle, URLS),
            content_hash=bundle.content_hash, settings_hash=router_mod.settings_hash(member, fleet))


def test_the_probe_reads_the_engines_load_gauges_only_when_its_metrics_are_on(tmp_path: Path) -> None:
    profile = _engine(tmp_path)
    on = profile.patched(args={"enable_metrics": True})
    probe = cast(dict[str, Any], supervisor_config(on)["probe"])
    assert (probe["running_metrics"], probe["waiting_metrics"]) == (["sglang:num_running_reqs"],
                                                                     ["sglang:num_queue_reqs"])
    assert cast(dict[str, Any], supervisor_config(profile)["probe"])["running_metrics"] == []


def test_engine_records_are_the_previous_releases(tmp_path: Path) -> None:
    profile = _engine(tmp_path)
    bundle = render(profile)
    config = dict(supervisor_config(profile))
    # added since (the one-token probe after ready): a key the previous release's supervisor never reads
    assert config.pop("probe") == {
        "path": "/v1/completions", "model": profile.engine.served_model, "address": "127.0.0.1", "port": 30000,
        "health_path": "/health", "interval_s": 30.0, "failures": 3, "timeout_s": 30.0, "exit_grace_s": 60.0,
        "running_metrics": [],
        "waiting_metrics": []}  # SGLang without enable_metrics serves no /metrics: the supervisor never asks it
    _pinned("engine-supervise.json", config)
    record = dict(profile_record(profile, bundle, attempt=2, up_id="feedc0ffee12", written_hash="ab" * 32))
    assert record.pop("helper") == payload_bundle()[1]
    health = record["profile"]["health"]
    assert {k: health.pop(k) for k in ("probe_interval_s", "probe_failures", "probe_timeout_s")} == {
        "probe_interval_s": 30.0, "probe_failures": 3, "probe_timeout_s": 30.0}
    assert (health.pop("hang_s"), record["profile"]["restart"].pop("drain_s")) == ("auto", 0.0)  # issue 37's keys
    assert health.pop("probe_exit_grace_s") == 60.0   # issue 37 too: an engine frozen while idle
    _pinned("engine-profile.json", record, content_hash=bundle.content_hash)


def test_a_router_switches_to_its_new_run_after_what_served_stopped_and_both_ports_freed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = _fleet(tmp_path)
    member = fleet_of(fleet, _addr).router
    assert member is not None
    spec = router_mod.router_spec(member, fleet, URLS)
    assert spec.ports == (8000, 8001) and spec.grace_s == 10.0   # smg's metrics port too; the grace capped
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(switch, "stop", lambda remote, run, grace: calls.append(("stop", run.run_id, grace)))
    monkeypatch.setattr(switch, "check_port",
                        lambda remote, layout, port, wait_s: calls.append(("port", port, wait_s)))
    monkeypatch.setattr(switch, "set_current", lambda remote, layout, run: calls.append(("current", run.run_id)))
    monkeypatch.setattr(switch, "start", lambda remote, run: calls.append(("start", run.run_id)))
    layout = Layout("/w/qwen3-8b-fleet-router")
    remote: Any = object()
    switch.switch_to(remote, layout, layout.run("new"), spec, serving=layout.run("old"), port_wait_s=15.0)
    assert calls == [("stop", "old", 10.0), ("port", 8000, 15.0), ("port", 8001, 15.0), ("current", "new"),
                     ("start", "new")]
    calls.clear()
    switch.switch_to(remote, layout, layout.run("new"), spec, serving=None, port_wait_s=15.0)
    assert calls == [("port", 8000, 0.0), ("port", 8001, 0.0), ("current", "new"), ("start", "new")]
