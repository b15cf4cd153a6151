"""Fleets without hosts: replica derivation, the router's launch script, fan-out's concurrency and isolation,
the fleet report's verdict and the status exit code."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.errors import LaunchFailed, PartlyFailed, ProfileError, TargetError, Unhealthy
from deployer.runner.fanout import TaggedSink, fan_out
from deployer.deployments.fleet.members import fleet_of, http_url
from deployer.deployments.fleet.oncall import _exit_code, _mark_in_router, pick_member
from deployer.deployments.status_text import fleet_lines as status_lines
from deployer.operate.deployment import status_code
from deployer.box.push import RunDir
from deployer.box.records import RunView
from deployer.deployments.fleet.report import FleetReport, ReplicaResult
from deployer.deployments.fleet.router import RouterReport, render_router, settings_hash
from deployer.profile.loader import load_profile
from deployer.host import probe_address
from deployer.profile.model import Target
from deployer.render.bundle import render
from deployer.events import Event, Info

ADDRESSES = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3"}


def addr(target: Target) -> str:
    return ADDRESSES[target.host]


def _profile(tmp_path: Path, **extra: Any) -> Any:
    data: dict[str, Any] = {
        "name": "qwen3-8b-fleet",
        "replicas": [{"host": "gpu-a"}, {"host": "gpu-b", "gpus": [1], "engine_port": 30001},
                     {"host": "gpu-a", "engine_port": 30002, "listen": "192.168.0.9", "workdir": "/srv/d"}],
        "engine": {"model_path": "Qwen/Qwen3-8B", "python": "/venv/bin/python", "gpus": [0],
                   "env": {"HF_TOKEN": "${TOKEN_FOR_TEST}"}},
        "router": {"python": "/workspace/router-venv/bin/python", "port": 8000, "policy": "cache_aware",
                   "args": {"health_check_interval_secs": 5, "api_key": "${ROUTER_KEY_FOR_TEST}"}},
    }
    data.update(extra)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile(path, environ={"TOKEN_FOR_TEST": "hf_secret_value", "ROUTER_KEY_FOR_TEST": "rk-secret-9"})


def test_each_replica_is_a_single_host_deployment_of_its_own(tmp_path: Path) -> None:
    fleet = fleet_of(_profile(tmp_path), addr)
    names = [r.name for r in fleet.replicas]
    assert names == ["qwen3-8b-fleet-r0", "qwen3-8b-fleet-r1", "qwen3-8b-fleet-r2"]   # two on gpu-a: own dirs
    r0, r1, r2 = (r.profile for r in fleet.replicas)
    assert not any(p.is_fleet for p in (r0, r1, r2))
    assert (r0.target.host, r0.engine.port, r0.engine.gpus, r0.engine.host) == ("gpu-a", 30000, [0], "10.0.0.1")
    assert (r1.target.host, r1.engine.port, r1.engine.gpus, r1.engine.host) == ("gpu-b", 30001, [1], "10.0.0.2")
    assert (r2.engine.host, r2.target.workdir) == ("192.168.0.9", "/srv/d")
    assert [r.url for r in fleet.replicas] == ["http://10.0.0.1:30000", "http://10.0.0.2:30001",
                                               "http://192.168.0.9:30002"]
    # the engine binds where the router reaches it, never 0.0.0.0
    script = render(r1).script
    assert "--host 10.0.0.2 --port 30001" in script and "0.0.0.0" not in script
    # secrets stay secrets in the derived profile: env file only, masked in what is stored
    bundle = render(r0)
    assert "hf_secret_value" not in bundle.script and "hf_secret_value" in bundle.env
    assert r0.public_dict()["engine"]["env"]["HF_TOKEN"] == "***"
    assert fleet.hosts() == ["gpu-a", "gpu-b"]


def test_router_defaults_to_the_first_replicas_host_and_renders_smg(tmp_path: Path) -> None:
    prof = _profile(tmp_path)
    fleet = fleet_of(prof, addr)
    assert fleet.router is not None
    assert (fleet.router.host, fleet.router.bind, fleet.router.name) == ("gpu-a", "10.0.0.1", "qwen3-8b-fleet-router")
    urls = [r.url for r in fleet.replicas]
    bundle = render_router(fleet.router, urls, prof)
    assert bundle.argv[:2] == ["/workspace/router-venv/bin/python", "-c"] and bundle.argv[3] == "launch"
    text = " ".join(bundle.argv)
    assert "--host 10.0.0.1 --port 8000 --policy cache_aware --prometheus-port 8001 --prometheus-host 10.0.0.1 " \
        "--worker-urls " + " ".join(urls) in text     # smg's metrics default (0.0.0.0:29000) would collide
    assert "--health-check-interval-secs 5" in text
    # the router's key: in the env file, never in launch.sh or argv (not even by reference: router_key.SHIM)
    assert "rk-secret-9" not in bundle.script and "rk-secret-9" not in text and "rk-secret-9" in bundle.env
    assert "--api-key" not in bundle.script and "DEPLOYER_SECRET_ROUTER_API_KEY" in bundle.env
    # the worker set is not the router's identity: the API changes it without a restart
    assert render_router(fleet.router, urls[:1], prof).content_hash != bundle.content_hash
    assert settings_hash(fleet.router, prof) == settings_hash(fleet.router, prof)
    changed = _profile(tmp_path, router={"python": "/other/python", "port": 8000})
    assert settings_hash(fleet_of(changed, addr).router, changed) != settings_hash(fleet.router, prof)  # type: ignore[arg-type]


def test_router_script_runs_under_bash_with_hostile_values(tmp_path: Path) -> None:
    prof = _profile(tmp_path, router={"python": "/bin/echo", "port": 8000,
                                      "args": {"served_model_name": "a b; $(touch /tmp/pwned-r14) `x`"}})
    fleet = fleet_of(prof, addr)
    assert fleet.router is not None
    bundle = render_router(fleet.router, ["http://10.0.0.1:30000"], prof)
    script = tmp_path / "launch.sh"
    script.write_text(bundle.script)
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("--served-model-name a b; $(touch /tmp/pwned-r14) `x`")
    assert not Path("/tmp/pwned-r14").exists()


@pytest.mark.parametrize("change, message", [
    ({"replicas": [{"host": "gpu-a"}, {"host": "gpu-a"}]}, "both use port 30000 on gpu-a"),
    ({"replicas": 3, "target": {"host": "gpu-a"}}, "a count is only for `deploy export k8s`"),
])
def test_fleets_that_cannot_be_deployed_say_why_in_one_line(tmp_path: Path, change: dict[str, Any],
                                                            message: str) -> None:
    with pytest.raises(ProfileError) as err:
        fleet_of(_profile(tmp_path, **change), addr)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_router_target_may_name_another_host(tmp_path: Path) -> None:
    prof = _profile(tmp_path, router={"target": {"host": "gpu-c", "user": "ops"}, "port": 9000})
    router = fleet_of(prof, addr).router
    assert router is not None and (router.host, router.target.user, router.bind) == ("gpu-c", "ops", "10.0.0.3")
    assert router.target.workdir == "/workspace/deployer"


def test_addresses() -> None:
    assert probe_address("0.0.0.0") == "127.0.0.1" and probe_address("::") == "127.0.0.1"
    assert probe_address("10.0.0.5") == "10.0.0.5" and probe_address("[fe80::1]") == "fe80::1"
    assert http_url("fe80::1", 80) == "http://[fe80::1]:80"


def test_fan_out_runs_hosts_at_once_and_a_hosts_members_in_turn() -> None:
    members = [("h1", 0), ("h2", 1), ("h1", 2), ("h3", 3)]
    running: dict[str, int] = {}
    peak = {"hosts": 0, "same_host": 0}
    lock = threading.Lock()

    def work(member: tuple[str, int], emit: Any) -> int:
        host, i = member
        with lock:
            running[host] = running.get(host, 0) + 1
            peak["hosts"] = max(peak["hosts"], sum(1 for v in running.values() if v))
            peak["same_host"] = max(peak["same_host"], running[host])
        emit(Info(message=f"m{i}"))
        time.sleep(0.2)
        with lock:
            running[host] -= 1
        if i == 3:
            raise TargetError("h3 is unfit")
        return i * 10

    seen: list[Event] = []
    done = fan_out(members, lambda m: m[0], lambda m: f"r{m[1]}", work, TaggedSink(seen.append), max_hosts=8)
    assert [d.value for d in done] == [0, 10, 20, None]
    assert done[3].error is not None and done[3].error.message == "h3 is unfit"   # the others are not hidden
    assert peak == {"hosts": 3, "same_host": 1}
    assert sorted((e.data["host"], e.data["member"]) for e in seen) == \
        [("h1", "r0"), ("h1", "r2"), ("h2", "r1"), ("h3", "r3")]


def test_fan_out_is_bounded() -> None:
    active, peak = [0], [0]
    lock = threading.Lock()

    def work(member: int, emit: Any) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1

    fan_out(list(range(12)), lambda m: f"h{m}", str, work, TaggedSink(lambda e: None), max_hosts=3)
    assert peak[0] == 3


def _result(i: int, status: str, restored: str | None = None) -> ReplicaResult:
    return ReplicaResult(i, f"h{i}", f"f-r{i}", f"http://h{i}:1", status, error=None if status != "failed" else "x",
                         restored={"status": restored} if restored else None)


def test_fleet_report_verdicts() -> None:
    ok = FleetReport("f", replicas=[_result(0, "ready"), _result(1, "already-running")],
                     router=RouterReport("f-router", "h0", "ready"))
    assert ok.settle().status == "ready"
    partial = FleetReport("f", replicas=[_result(0, "ready"), _result(1, "failed")],
                          router=RouterReport("f-router", "h0", "ready"))
    with pytest.raises(PartlyFailed) as err:
        partial.settle()
    assert err.value.exit_code == 9 and "1 of 2 replicas ready" in err.value.message and "r1@h1: x" in err.value.message
    rolled_back = FleetReport("f", replicas=[_result(0, "failed", restored="ready"), _result(1, "left-running")])
    with pytest.raises(PartlyFailed):
        rolled_back.settle()            # serving the old version is not a successful upgrade
    assert rolled_back.serving_urls() == ["http://h0:1", "http://h1:1"]
    none = FleetReport("f", replicas=[_result(0, "failed"), _result(1, "failed")],
                       router=RouterReport("f-router", "h0", "failed", detail="not started: no replica is ready"))
    with pytest.raises(LaunchFailed) as err2:
        none.settle()
    assert err2.value.exit_code == 5 and "router@h0: not started" in err2.value.message


def _row(role: str, status: str, healthy: bool) -> dict[str, Any]:
    return {"role": role, "status": status, "healthy": healthy}


def test_fleet_status_exit_codes() -> None:
    assert _exit_code([_row("replica", "ready", True), _row("router", "ready", True)]) == 0
    assert _exit_code([_row("replica", "ready", True), _row("replica", "exited", False),
                       _row("router", "ready", True)]) == 9          # degraded but serving
    assert _exit_code([_row("replica", "ready", True), _row("router", "exited", False)]) == 5   # nothing in front
    assert _exit_code([_row("replica", "stopped", False), _row("router", "stopped", False)]) == 8
    assert _exit_code([_row("replica", "absent", False), _row("router", "absent", False)]) == 7


def test_fleet_status_is_never_0_while_a_serving_replica_is_out_of_its_router() -> None:
    """Issue 22 finding 4: an interrupted rolling restart drained r1 and never added it back."""
    rows = [{**_row("replica", "ready", True), "url": "http://a:1"}, {**_row("replica", "ready", True),
            "url": "http://b:1"}, {**_row("router", "ready", True), "worker_states": {"http://a:1": "healthy"}}]
    _mark_in_router(rows)
    assert [r.get("in_router") for r in rows] == [True, False, None]
    assert [r.get("router_health") for r in rows] == ["healthy", "not registered", None]
    assert _exit_code(rows) == 9
    rows[2]["worker_states"] = {"http://a:1": "healthy", "http://b:1": "healthy"}
    _mark_in_router(rows)
    assert _exit_code(rows) == 0
    rows[2]["worker_states"] = {"http://a:1": "healthy", "http://b:1": "pending"}  # registered, not healthy
    _mark_in_router(rows)
    assert _exit_code(rows) == 9 and rows[1]["router_health"] == "pending"


def test_a_worker_the_fleet_did_not_add_is_an_alarm() -> None:
    """Issue 34 finding 2: a server another user registered with the router; status named it, exit 6."""
    both = {"http://a:1": "healthy", "http://b:1": "healthy"}
    rows = [{**_row("replica", "ready", True), "url": "http://a:1", "member": "r0", "host": "h"},
            {**_row("replica", "ready", True), "url": "http://b:1", "member": "r1", "host": "h"},
            {**_row("router", "ready", True), "worker_states": both, "foreign_workers": [], "member": "router",
             "host": "h", "url": "http://h:8"}]
    _mark_in_router(rows)
    assert _exit_code(rows) == 0
    rows[2]["foreign_workers"] = ["http://evil:9"]
    assert _exit_code(rows) == 6
    text = "\n".join(status_lines({"name": "f", "serving": False, "replicas": rows[:2], "router": rows[2]}))
    assert "ALARM: the router routes to http://evil:9, which is not a replica" in text
    rows[0]["status"], rows[0]["healthy"] = "exited", False      # a more urgent code stays
    rows[2]["worker_states"] = {"http://b:1": "healthy"}
    _mark_in_router(rows)
    assert _exit_code(rows) == 6                                  # partly (9) with a foreign worker: 6
    rows[2]["status"], rows[2]["healthy"] = "exited", False
    assert _exit_code(rows) == 5


def test_an_interrupted_replace_reads_interrupted_never_stopped() -> None:
    run = RunDir("/w/d/runs/1", "1")
    assert RunView(run, {}, {"status": "stopped", "stopped_for": "replace"}, None).status == "interrupted"
    assert RunView(run, {}, {"status": "stopped"}, None).status == "stopped"
    assert status_code("interrupted", False) == 5


def test_logs_picks_one_member(tmp_path: Path) -> None:
    fleet = fleet_of(_profile(tmp_path), addr)
    assert pick_member(fleet, replica=1, host=None, router=False).name == "qwen3-8b-fleet-r1"
    assert pick_member(fleet, replica=None, host="gpu-b", router=False).name == "qwen3-8b-fleet-r1"
    assert pick_member(fleet, replica=None, host=None, router=True).name == "qwen3-8b-fleet-router"
    for kwargs, message in [({"replica": 7, "host": None, "router": False}, "replicas 0..2, not 7"),
                            ({"replica": None, "host": "gpu-a", "router": False}, "add --replica N or --router"),
                            ({"replica": None, "host": "gpu-z", "router": False}, "no member on gpu-z"),
                            ({"replica": None, "host": None, "router": False}, "choose a member")]:
        with pytest.raises(ProfileError) as err:
            pick_member(fleet, **kwargs)  # type: ignore[arg-type]
        assert message in str(err.value)


def test_the_router_gets_the_replicas_key_by_reference(tmp_path: Path) -> None:
    prof = _profile(tmp_path, router={"port": 8000})
    prof = load_profile(tmp_path / "fleet.yaml", environ={"TOKEN_FOR_TEST": "t" * 8})  # no key anywhere
    assert fleet_of(prof, addr).router.api_key is None  # type: ignore[union-attr]
    data = yaml.safe_load((tmp_path / "fleet.yaml").read_text())
    data["engine"]["args"] = {"api_key": "${ENGINE_KEY_FOR_TEST}"}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(data))
    prof = load_profile(tmp_path / "fleet.yaml", environ={"TOKEN_FOR_TEST": "t" * 8, "ENGINE_KEY_FOR_TEST": "ek-77-secret"})
    router = fleet_of(prof, addr).router
    assert router is not None and router.api_key == "ek-77-secret" and "ek-77" not in repr(router)
    bundle = render_router(router, ["http://10.0.0.1:30000"], prof)
    assert "--api-key" not in bundle.script and "ek-77" not in bundle.script and "ek-77" not in " ".join(bundle.argv)
    assert "DEPLOYER_SECRET_ROUTER_API_KEY=ek-77-secret\n" in bundle.env


class FakeRouter:
    """smg's worker API as deployer uses it (GET/POST /workers, DELETE /workers/{id}), in memory: a removed worker
    is gone at once; one added is healthy when `heals` says so."""

    label = "fake-router"

    def __init__(self, healthy: dict[str, bool], heals: set[str]) -> None:
        self.workers = {url: {"id": f"id{i}", "url": url, "is_healthy": ok, "status": "ready" if ok else "failed"}
                        for i, (url, ok) in enumerate(healthy.items())}
        self.heals = heals
        self.calls: list[str] = []

    def request(self, method: str, port: int, path: str, *, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 5.0, address: str = "127.0.0.1") -> Any:
        import json as _json

        from deployer.remote.base import HttpReply

        self.calls.append(f"{method} {path}")
        if method == "GET":
            return HttpReply(200, _json.dumps({"workers": list(self.workers.values())}).encode(), {})
        if method == "DELETE":
            self.workers = {u: w for u, w in self.workers.items() if f"/workers/{w['id']}" != path}
            return HttpReply(202, b"{}", {})
        url = _json.loads(body or b"{}")["url"]
        ok = url in self.heals
        self.workers[url] = {"id": f"new-{url}", "url": url, "is_healthy": ok, "status": "ready" if ok else "pending"}
        return HttpReply(202, b"{}", {})


def test_rolling_replaces_the_unhealthy_first_and_never_goes_below_n_minus_1(tmp_path: Path,
                                                                             monkeypatch: Any) -> None:
    from deployer.deployments.fleet import rolling, router as router_mod

    monkeypatch.setattr(router_mod, "POLL_S", 0.01)
    monkeypatch.setattr(rolling, "READY_TIMEOUT_S", 0.5)   # r1 below never heals: its wait is bounded
    prof = _profile(tmp_path, router={"port": 8000})
    fleet = fleet_of(prof, addr)
    urls = [r.url for r in fleet.replicas]
    # r1 is down; r0 and r2 serve. r1 comes back: then r0 and r2 may go, one at a time.
    fake = FakeRouter({urls[0]: True, urls[1]: False, urls[2]: True}, heals=set(urls))
    replaced: list[str] = []

    class Report:
        status, run_dir, content_hash, attempts, restored = "ready", "/run", "h", [], None

    def replace(member: Any, emit: Any) -> Any:
        healthy_others = [u for u, w in fake.workers.items() if w["is_healthy"]]
        replaced.append(f"r{member.index} with {len(healthy_others)} serving")
        return Report()

    report = FleetReport("f")
    rolling.roll(fleet, report, TaggedSink(lambda e: None), replace, fake, None)  # type: ignore[arg-type]
    assert replaced == ["r1 with 2 serving", "r0 with 2 serving", "r2 with 2 serving"]
    assert [r.status for r in report.replicas] == ["ready", "ready", "ready"]

    # r1 is down and does not come back: taking r0 out would leave 1 of 3 serving, fewer than N-1 = 2
    fake = FakeRouter({urls[0]: True, urls[1]: False, urls[2]: True}, heals={urls[0], urls[2]})
    replaced.clear()
    report = FleetReport("f")
    rolling.roll(fleet, report, TaggedSink(lambda e: None), replace, fake, None)  # type: ignore[arg-type]
    assert replaced == ["r1 with 2 serving"]
    r0, r1, r2 = report.replicas
    assert r1.status == "failed" and "not back in the router" in str(r1.error)
    assert (r0.status, r2.status) == ("left-running", "left-running")       # untouched, still in the router
    assert fake.workers[urls[0]]["is_healthy"] and fake.workers[urls[2]]["is_healthy"]
    assert "rollout stopped at r1@gpu-b" in report.notes[0]


def test_rolling_refuses_to_take_out_a_serving_replica_when_another_is_down(tmp_path: Path) -> None:
    from deployer.deployments.fleet.rolling import roll_one

    prof = _profile(tmp_path, router={"port": 8000})
    fleet = fleet_of(prof, addr)
    urls = [r.url for r in fleet.replicas]
    fake = FakeRouter({urls[0]: True, urls[1]: False, urls[2]: True}, heals=set(urls))
    result = roll_one(fleet, fleet.replicas[0], TaggedSink(lambda e: None), lambda m, e: None, fake)  # type: ignore[arg-type]
    assert result.status == "left-running" and "fewer than 2 serving" in str(result.error)
    assert not any(c.startswith("DELETE") for c in fake.calls)


def test_a_replica_that_binds_every_interface_is_reached_at_its_hosts_address(tmp_path: Path) -> None:
    prof = _profile(tmp_path, replicas=[{"host": "gpu-a", "listen": "0.0.0.0"}, {"host": "gpu-b"}])
    fleet = fleet_of(prof, addr)
    assert fleet.replicas[0].profile.engine.host == "0.0.0.0"          # asked for, so written
    assert fleet.replicas[0].url == "http://10.0.0.1:30000"            # but the router goes to the host
    assert fleet.replicas[0].profile.engine.probe_address == "127.0.0.1"


def test_ctrl_c_ends_a_fan_out_at_once(tmp_path: Path) -> None:
    """Hosts still working do not hold an interrupted command (their work goes on on the targets)."""
    import signal
    import sys

    script = tmp_path / "fan.py"
    script.write_text(
        "import signal, time\n"
        "from deployer.runner.fanout import TaggedSink, fan_out\n"
        # a terminal's foreground command takes Ctrl-C; a child of a pytest worker inherits SIGINT ignored
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "print('started', flush=True)\n"
        "try:\n"
        "    fan_out(['a', 'b'], str, str, lambda m, e: time.sleep(60), TaggedSink(lambda e: None))\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert "interrupted" in out and proc.returncode == 0 and time.monotonic() - t0 < 5
    finally:
        proc.kill()


ROUTER_INSTALL = {"install": {"packages": ["smg==1.13.0"], "find_links": ["/opt/wheels"]}, "port": 8000}


def test_router_install_excludes_router_python_in_one_line(tmp_path: Path) -> None:
    prof = _profile(tmp_path, router=ROUTER_INSTALL)
    assert prof.router is not None and prof.router.install is not None
    assert prof.router.install.packages == ["smg==1.13.0"]
    with pytest.raises(ProfileError, match="router.python and router.install exclude each other"):
        _profile(tmp_path, router={**ROUTER_INSTALL, "python": "/venv/bin/python"})
    with pytest.raises(ProfileError, match="did you mean 'packages'"):
        _profile(tmp_path, router={"install": {"pakages": ["smg"]}})


def test_the_router_launches_from_its_managed_environment(tmp_path: Path) -> None:
    """With router.install the router's python is its environment's (what the run record names, so retention keeps
    it); the same spec is the same python, so an unchanged router is not replaced."""
    from deployer.deployments.fleet.router_env import launched_router
    from deployer.prepare.envspec import EnvPaths, EnvSpec

    prof = _profile(tmp_path, router=ROUTER_INSTALL)
    member = fleet_of(prof, addr).router
    assert member is not None and member.router.install is not None
    python = EnvPaths.of("/srv/w", EnvSpec.from_install(member.router.install)).python
    launched = launched_router(member, python)
    assert launched.router.install is None and render_router(launched, [], prof).argv[:2] == [python, "-c"]
    assert settings_hash(launched, prof) == settings_hash(launched_router(member, python), prof)
    assert settings_hash(launched, prof) != settings_hash(launched_router(member, "/other/bin/python"), prof)


def test_a_fleet_record_with_install_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fleet.json drops the default python beside engine.install / router.install: both keys would not load."""
    from deployer.deployments.fleet.record import read_record, write_record

    stored: dict[str, bytes] = {}

    class Disk:
        label = "gpu-a"

        def run(self, cmd: str, **_kw: Any) -> Any:
            return subprocess.CompletedProcess(cmd, 0, "", "")

        def put(self, data: bytes, path: str, mode: int) -> None:
            stored[path] = data

        def read(self, path: str, offset: int, size: int) -> bytes:
            return stored[path]

    engine = {"model_path": "Qwen/Qwen3-8B", "install": {"packages": ["sglang==0.5.23"]}}
    prof = _profile(tmp_path, router=ROUTER_INSTALL, engine=engine)
    monkeypatch.setattr("deployer.deployments.fleet.record.make_owned_dirs", lambda *a: None)
    monkeypatch.setattr("deployer.deployments.fleet.record.expand_workdir", lambda remote, workdir: workdir)
    remote: Any = Disk()
    write_record(remote, "/srv/w", prof)
    back = read_record(remote, "/srv/w", prof.name)
    assert back is not None and back.router is not None and back.router.install is not None
    assert back.engine.install is not None and back.engine.install.packages == ["sglang==0.5.23"]


def test_the_router_gets_its_credentials_from_its_environment_not_its_argv(tmp_path: Path) -> None:
    """Issue 34 finding 2: smg takes keys only as flags, and a flag is in /proc/PID/cmdline for every local user.
    launch.sh runs router_key.SHIM, which appends them from the environment inside the process: run here against a
    stand-in `smg.cli` that prints the argv smg's parser would get."""
    prof = _profile(tmp_path)
    member = fleet_of(prof, addr).router
    assert member is not None
    member = dataclasses.replace(member, control_key="ck-" + "9" * 20)
    bundle = render_router(member, ["http://10.0.0.1:30000"], prof)
    assert "ck-999" not in bundle.script and "rk-secret-9" not in bundle.script
    stand_in = tmp_path / "standin" / "smg"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("")
    (stand_in / "cli.py").write_text("import json\ndef main(argv):\n    print(json.dumps(argv))\n")
    env = {k: v for k, v in (line.split("=", 1) for line in bundle.env.splitlines()[1:])}
    env = {k: shlex.split(v)[0] for k, v in env.items()}
    argv = [sys.executable, *bundle.argv[1:]]
    out = subprocess.run(argv, env={**env, "PYTHONPATH": str(stand_in.parent)}, capture_output=True, text=True,
                         timeout=30, check=True)
    got = json.loads(out.stdout)
    assert got[:1] == ["launch"] and "--api-key=rk-secret-9" in got
    keys = got[got.index("--control-plane-api-keys") + 1:]
    assert keys == [f"deployer:deployer:admin:ck-{'9' * 20}"]
    assert not any("rk-secret" in word or "ck-999" in word for word in argv)


class CreatingRouter:
    """Stand-in for smg's worker API while an earlier POST of a URL still waits for its health check: 409 "Worker
    creation already in progress" for the first `busy` POSTs, then 202 (listed from then on)."""

    label = "creating-router"

    def __init__(self, busy: int) -> None:
        self.busy, self.posts, self.listed = busy, 0, False

    def request(self, method: str, port: int, path: str, *, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 5.0, address: str = "127.0.0.1") -> Any:
        from deployer.remote.base import HttpReply

        if method == "GET":
            found = [{"id": "w1", "url": "http://r1:1", "is_healthy": True}] if self.listed else []
            return HttpReply(200, json.dumps({"workers": found}).encode(), {})
        self.posts += 1
        if self.posts <= self.busy:
            text = {"error": "Worker creation already in progress for URL 'http://r1:1'", "code": "conflict"}
            return HttpReply(409, json.dumps(text).encode(), {})
        self.listed = True
        return HttpReply(202, b"{}", {})


def test_a_worker_being_created_is_asked_again_until_the_router_takes_it(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """Issue 34 finding 5: smg answered 409 "creation already in progress" while a replica was added back."""
    from deployer.deployments.fleet import router as router_mod

    monkeypatch.setattr(router_mod, "CREATING_EVERY_S", 0.01)
    member = fleet_of(_profile(tmp_path), addr).router
    assert member is not None
    busy = CreatingRouter(busy=3)
    router_mod.add_worker(busy, member, "http://r1:1")  # type: ignore[arg-type]
    assert busy.posts == 4 and busy.listed
    stuck = CreatingRouter(busy=10 ** 6)                 # never done: bounded in time (and count)
    start = time.monotonic()
    with pytest.raises(Unhealthy) as err:
        router_mod.add_worker(stuck, member, "http://r1:1", deadline_s=0.3)  # type: ignore[arg-type]
    assert time.monotonic() - start < 5 and stuck.posts <= router_mod.CREATING_TRIES
    assert "409" in err.value.message and "already in progress" in err.value.message
