"""The Deployment interface's seams without a target: resolve's rules (which kind a file or a name means), the
typed reports' JSON and exit codes, the one JUnit writer for every smoke report, and deployer.api's defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer import api
from deployer.cli import show
from deployer.output import text_runs  # noqa: F401 (adds the text forms of up-like reports)
from deployer.deployments.base import Select
from deployer.deployments.fleet.deployment import ReplicaFleet
from deployer.deployments.nodes.deployment import NodeGroup
from deployer.deployments.reports import (FleetDown, FleetStatus, HostDown, HostStatus, NodeDown, NodeStatus,
                                          StatusRow)
from deployer.deployments.resolve import CHANGE, READ, STOP, for_profile, resolve
from deployer.deployments.single.deployment import SingleHost
from deployer.operate.rows import DownResult
from deployer.errors import LaunchFailed, NotFound, ProfileError, Unhealthy
from deployer.deployments.fleet.smoke import Case, FleetSmokeReport
from deployer.output.junit import smoke_suite
from deployer.runner.up import UpOptions
from deployer.smoke import Answer, SmokeReport

ENGINE = {"model_path": "Qwen/Qwen3-8B", "python": "/venv/bin/python", "port": 30000}


def write(tmp_path: Path, name: str, data: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "engine": dict(ENGINE), **data}))
    return str(path)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))


def single_file(tmp_path: Path) -> str:
    return write(tmp_path, "one", {"target": {"host": "gpu-a"}})


def nodes_file(tmp_path: Path) -> str:
    data = {"nodes": [{"host": "node-0"}, {"host": "node-1"}], "engine": {**ENGINE, "dist_init_port": 20000}}
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump({"name": "group", **data}))
    return str(path)


def fleet_file(tmp_path: Path) -> str:
    return write(tmp_path, "fleet", {"replicas": [{"host": "gpu-a"}, {"host": "gpu-b"}]})


@pytest.mark.parametrize("mode", [READ, STOP, CHANGE])
def test_a_file_resolves_to_the_kind_it_describes(tmp_path: Path, mode: Any) -> None:
    assert isinstance(resolve(single_file(tmp_path), mode=mode), SingleHost)
    assert isinstance(resolve(nodes_file(tmp_path), mode=mode), NodeGroup)
    assert isinstance(resolve(fleet_file(tmp_path), mode=mode), ReplicaFleet)


def test_a_name_is_a_single_host_that_needs_a_host(tmp_path: Path) -> None:
    dep = resolve("demo", "gpu-a", "/srv/d")
    assert isinstance(dep, SingleHost) and dep.ref.name == "demo" and dep.ref.workdir == "/srv/d"
    with pytest.raises(ProfileError, match="give --host"):
        resolve("demo").status()


def test_selectors_need_their_kind(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="--node needs a profile file with nodes:"):
        resolve("demo", "gpu-a", select=Select(node=0))
    with pytest.raises(NotFound, match="--replica and --router need a fleet profile file"):
        resolve("demo", None, select=Select(replica=1))
    group = resolve(nodes_file(tmp_path), select=Select(node=1))
    assert isinstance(group, NodeGroup) and group.node == 1


def test_a_fleet_refuses_host_where_its_hosts_are_in_the_profile(tmp_path: Path) -> None:
    fleet = resolve(fleet_file(tmp_path), "gpu-z")
    with pytest.raises(ProfileError, match="--host does not apply to `status` of a fleet profile"):
        fleet.status()


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every time a profile file is read (the loader's one entry point)."""
    from deployer.profile import loader

    seen: list[str] = []
    real = loader.load

    def counted(path: Path, **kwargs: Any) -> Any:
        seen.append(path.name)
        return real(path, **kwargs)

    monkeypatch.setattr(loader, "load", counted)
    return seen


@pytest.mark.parametrize("mode", [READ, STOP, CHANGE])
def test_resolve_reads_a_profile_file_once(tmp_path: Path, mode: Any, loads: list[str]) -> None:
    single = resolve(single_file(tmp_path), mode=dataclasses.replace(mode, remembered=False))
    assert isinstance(single, SingleHost) and single.ref.name == "one" and single.ref.spec.host == "gpu-a"
    hosted = resolve(single_file(tmp_path), "ops@gpu-z:2222", mode=dataclasses.replace(mode, remembered=False))
    assert isinstance(hosted, SingleHost)
    assert (hosted.ref.spec.user, hosted.ref.spec.host, hosted.ref.spec.port) == ("ops", "gpu-z", 2222)
    for kind, path in ((NodeGroup, nodes_file(tmp_path)), (ReplicaFleet, fleet_file(tmp_path))):
        many = resolve(path, mode=mode)
        assert isinstance(many, kind)
        with pytest.raises(ProfileError, match="this command works on one host"):  # from the same load
            many.as_single.ref  # type: ignore[attr-defined]
    assert loads == ["one.yaml", "one.yaml", "group.yaml", "fleet.yaml"]


def test_host_on_a_loaded_profile_is_what_the_loader_makes_of_it(tmp_path: Path) -> None:
    from deployer.profile.loader import load_profile, with_host

    path = write(tmp_path, "one", {"target": {"host": "gpu-a", "user": "me", "port": 2200, "workdir": "/srv/d/"}})
    for text in ("gpu-z", "ops@gpu-z", "gpu-z:2222", "ops@gpu-z:2222"):
        assert with_host(load_profile(path), text) == load_profile(path, host=text), text
    moved = with_host(load_profile(path), "gpu-z")
    assert moved.source == Path(path).resolve() and moved.files == [Path(path).resolve()]
    with pytest.raises(ProfileError) as bad:
        with_host(load_profile(path), "ops@gpu-z:99999")
    assert str(bad.value) == str(pytest.raises(ProfileError, load_profile, path, host="ops@gpu-z:99999").value)


def test_a_fleet_file_with_host_is_refused_where_it_needs_one_deployment(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="target: not allowed with replicas"):
        resolve(fleet_file(tmp_path), "gpu-z").history()


def test_for_profile_picks_the_same_kinds(tmp_path: Path) -> None:
    assert isinstance(api.deployment(api.load(single_file(tmp_path))), SingleHost)
    assert isinstance(for_profile(api.load(nodes_file(tmp_path))), NodeGroup)
    assert isinstance(for_profile(api.load(fleet_file(tmp_path))), ReplicaFleet)
    assert "--nnodes" in for_profile(api.load(nodes_file(tmp_path))).render()


ROW = {"name": "a", "host": "gpu-a", "status": "ready", "pid": 7, "uptime_s": 3.0, "healthy": True, "attempt": 1,
       "content_hash": "c0ffee", "run_dir": "/w/a/runs/r1", "port": 30000, "restarts": 0, "last_crash": None,
       "exit_code": None, "signal_name": None, "drift": [], "runs": 1, "diagnosis": None, "lock": None,
       "serving": True, "metrics": None, "unhealthy": None, "engine": "vllm", "engine_version": "0.32.0",
       "model": "tiny", "supervisor": None}
SHARED = {"name", "kind", "serving", "healthy", "code", "members", "router"}


def test_status_reports_json_and_exit_codes() -> None:
    """A single host's status: its row's keys (as before the shape was shared) and the shared ones."""
    row = dict(ROW)
    typed = StatusRow.of(row)
    one = {**row, "kind": "single", "code": 0, "members": [row], "router": None}
    assert HostStatus([typed]).to_json() == one and HostStatus([typed], one=False).to_json() == [one]
    assert HostStatus([typed]).exit_code == 0
    assert HostStatus([typed.replace(status="stopped", healthy=False)]).exit_code == 8
    assert NodeStatus([typed, typed.replace(status="exited", healthy=False)]).exit_code == 5
    assert FleetStatus({"name": "f"}, 9).exit_code == 9




def test_every_kinds_status_json_is_one_shape_a_deployment_with_its_members() -> None:
    """docs/json.md `deploy status NAME --json`: the same keys for a single host, a node group and a fleet; the
    members are the rows (a single host's one row, a row per node, a row per replica)."""
    row = StatusRow.of(ROW)
    sick = row.replace(status="exited", healthy=False, serving=False)
    single = HostStatus([row]).to_json()
    nodes = NodeStatus([row, sick.replace(host="gpu-b")]).to_json()
    replicas = [{"name": "f-r0", "host": "gpu-a", "healthy": True, "serving": True},
                {"name": "f-r1", "host": "gpu-b", "healthy": True, "serving": True}]
    router = {"name": "f-router", "host": "gpu-c", "healthy": False, "serving": False}
    fleet = FleetStatus({"name": "f", "serving": True, "code": 6, "replicas": replicas, "router": router}, 6).to_json()
    assert SHARED <= set(single) and SHARED <= set(nodes) == SHARED and SHARED <= set(fleet)
    assert (single["kind"], nodes["kind"], fleet["kind"]) == ("single", "nodes", "fleet")
    assert single["members"] == [row.to_json()] and single["router"] is None and single["status"] == "ready"
    assert [m["host"] for m in nodes["members"]] == ["gpu-a", "gpu-b"] and nodes["name"] == "a"
    # a node group serves through rank 0's API; healthy only when every node is; its code is the worst row's
    assert (nodes["serving"], nodes["healthy"], nodes["code"]) == (True, False, 5)
    # a fleet: its replicas are its members (and still `replicas`), its router apart; an unhealthy router: unhealthy
    assert fleet["members"] == replicas == fleet["replicas"] and fleet["router"] == router
    assert (fleet["serving"], fleet["healthy"], fleet["code"]) == (True, False, 6)
    assert HostStatus([sick]).to_json()["code"] == HostStatus([sick]).exit_code == 5


DOWN_SHARED = {"name", "kind", "was_running", "stopped", "code", "members", "router"}


def test_every_kinds_down_json_is_one_shape_a_deployment_with_its_members() -> None:
    """docs/json.md `deploy down NAME --json`: the status shape's twin for a single host, a node group and a fleet."""
    stopped = DownResult("a", "gpu-a", True, "stopped", run_dir="/w/a/runs/1", stopped_from="ready")
    idle = DownResult("a", "gpu-b", False, "absent")
    single = HostDown(stopped).to_json()
    nodes = NodeDown([dataclasses.replace(stopped, node=0), dataclasses.replace(idle, node=1)]).to_json()
    rows = [{"name": "f-r0", "host": "gpu-a", "was_running": True, "status": "stopped", "role": "replica"},
            {"name": "f-router", "host": "gpu-c", "was_running": False, "status": "absent", "role": "router"},
            {"name": "f-r1", "host": "gpu-b", "was_running": False, "status": "failed", "role": "replica"}]
    fleet = FleetDown({"name": "f", "members": rows}).to_json()
    assert DOWN_SHARED <= set(single) and set(nodes) == DOWN_SHARED == set(fleet)
    assert (single["kind"], nodes["kind"], fleet["kind"]) == ("single", "nodes", "fleet")
    # a single host keeps its row's keys at the top (the shape `down NAME --json` had before)
    assert single["members"] == [stopped.to_json()] and single["status"] == "stopped" and single["router"] is None
    assert (single["was_running"], single["stopped"], single["code"]) == (True, True, 0)
    assert [m["node"] for m in nodes["members"]] == [0, 1] and nodes["name"] == "a"
    assert (nodes["was_running"], nodes["stopped"]) == (True, True)
    # a fleet: its replicas are its members, its router apart; a replica that failed to stop: not stopped
    assert [m["name"] for m in fleet["members"]] == ["f-r0", "f-r1"] and fleet["router"] == rows[1]
    assert (fleet["was_running"], fleet["stopped"]) == (True, False)
    assert NodeDown([dataclasses.replace(idle, node=0)]).to_json()["was_running"] is False


def test_the_reports_that_render_themselves_print_their_lines_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """down's, prune's and config's reports render themselves (lines()); show.text prints them, on stdout."""
    from deployer.deployments.known import ConfigReport
    from deployer.deployments.reports import PruneReport

    show.text(HostDown(DownResult("a", "gpu-a", True, "stopped")))
    show.text(NodeDown([DownResult("a", "gpu-a", False, "stopped", node=0), DownResult("a", "gpu-b", True, "stopped",
                                                                                        node=1)]))
    show.text(FleetDown({"name": "f", "members": [{"member": "router", "host": "gpu-c", "name": "f-router",
                                                   "was_running": True}]}))
    show.text(PruneReport({"name": "a", "host": "gpu-a", "runs": 3, "keep": 2, "delete": ["r1"], "drop_env": [],
                           "protected": {"r2": "current"}, "models": {"removed": ["c" * 64], "freed_bytes": 2048}},
                          dry_run=True))
    show.text(ConfigReport([], "/home/u/.config/deployer/config.yaml", exists=False))
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out.splitlines() == [
        "a: stopped on gpu-a", "a node 0: not running on gpu-a", "a node 1: stopped on gpu-b",
        "router@gpu-c: f-router stopped",
        "a on gpu-a: 3 runs, keeping the newest 2 (dry run: nothing changed)", "  would delete run r1",
        "  kept run r2: current", "  would delete the pushed model dir cccccccccccc (no kept run loads it)",
        "  2.0 kB to free by the model dirs",
        "config file: /home/u/.config/deployer/config.yaml (not there: no defaults from it)"]


def test_every_report_type_has_a_text_form(capsys: pytest.CaptureFixture[str]) -> None:
    smoke = SmokeReport("one", "gpu-a")
    show.text(smoke)
    show.text(FleetSmokeReport("fleet", [Case("up", "r0", "gpu-a", "passed", 1.0, "ready")]))
    out = capsys.readouterr().out
    assert "smoke one on gpu-a: ok" in out and "smoke fleet (fleet): ok" in out


def test_one_junit_writer_for_a_single_host_smoke() -> None:
    report = SmokeReport("one", "root@gpu-a")
    report.phases["preflight"].status, report.phases["preflight"].duration_s = "passed", 1.5
    report.phases["request"].status, report.phases["request"].details = "failed", "empty answer"
    report.error = Unhealthy("empty answer")
    report.answer = Answer("qwen", "hello there", "content", 12.34, 1.0)
    suite = smoke_suite(report, "p.yaml")
    assert suite.name == "deploy smoke one"
    assert [(c.name, c.classname, c.status) for c in suite.cases][:5:4] == [
        ("preflight", "smoke.one", "passed"), ("request", "smoke.one", "failed")]
    request = suite.cases[4]
    assert request.kind == "Unhealthy" and request.message == "empty answer" and request.text == "empty answer"
    assert suite.cases[0].stdout == "" and suite.cases[0].time_s == 1.5
    assert list(suite.properties.items()) == [("profile", "p.yaml"), ("host", "root@gpu-a"), ("exit_code", "6"),
                                              ("model", "qwen"), ("latency_ms", "12.3"), ("answer", "hello there")]


def test_one_junit_writer_for_a_fleet_smoke() -> None:
    report = FleetSmokeReport("fl", [Case("up", "r0", "gpu-a", "passed", 2.0, "ready at http://x"),
                                     Case("request", "router", "gpu-a", "failed", 0.5, "refused")])
    report.error = Unhealthy("refused")
    suite = smoke_suite(report, "fleet.yaml")
    assert suite.name == "deploy smoke fl"
    assert [(c.name, c.classname, c.status, c.stdout) for c in suite.cases] == [
        ("up r0@gpu-a", "smoke.fl.gpu-a", "passed", "ready at http://x"),
        ("request router@gpu-a", "smoke.fl.gpu-a", "failed", "")]
    assert suite.cases[1].kind == "Unhealthy" and suite.cases[1].text == "refused"
    assert list(suite.properties.items()) == [("profile", "fleet.yaml"), ("exit_code", "6"), ("fleet", "fl")]


def test_the_api_keeps_no_local_history_by_default() -> None:
    assert api.UpOptions().local_history is False and api.UpOptions(local_history=True).local_history is True
    assert UpOptions().local_history is True and isinstance(api.UpOptions(), UpOptions)


def test_smoke_keeps_local_history_only_where_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The smoke's deploy gets the smoke's `local_history`: off for the API's SmokeOptions, on for the CLI's."""
    from deployer import smoke as smoke_run
    from deployer.errors import DeployError
    from deployer.deployments.fleet import smoke as fleet_smoke

    seen: list[bool] = []

    def up(profile: Any, opts: Any, emit: Any) -> Any:
        seen.append(opts.local_history)
        raise LaunchFailed("no engine here")   # the smoke then asks nothing and stops nothing

    monkeypatch.setattr(fleet_smoke, "fleet_up", lambda profile, opts, emit: up(profile, opts, emit))
    single, fleet = api.load(single_file(tmp_path)), api.load(fleet_file(tmp_path))
    cases = [(api.SmokeOptions(keep=True), False), (api.SmokeOptions(keep=True, local_history=True), True),
             (smoke_run.SmokeOptions(keep=True), True)]
    for opts, expected in cases:
        seen.clear()
        report = smoke_run.run(single, opts, lambda e: None, stand=smoke_run.Stand(up=up))
        assert isinstance(report.error, DeployError) and seen == [expected]
        seen.clear()
        assert not fleet_smoke.smoke_fleet(fleet, opts, lambda e: None).ok and seen == [expected]
    assert api.SmokeOptions().local_history is False and isinstance(api.SmokeOptions(), smoke_run.SmokeOptions)
