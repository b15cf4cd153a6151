"""`deploy upgrade FLEET` (issue 39): the plan is made on the first replica's host and its changes carried to the
fleet profile itself (deployer.operate.upgrade.carry, deployer.deployments.fleet.upgrade); `--save` writes the upgraded fleet
profile (extends and ${VAR} as written); `--apply` is the canary rollout; a node group is refused in one line.
The flag table is a small hand-made one (synthetic, saying so), as in tests/unit/test_upgrade_compare.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from deployer.deployments.resolve import for_profile, is_fleet
from deployer.engines.registry import engine_for
from deployer.engines.renames import load_renames
from deployer.errors import PartlyFailed, ProfileError
from deployer.events import Event
from deployer.deployments.fleet import upgrade as fleet_upgrade
from deployer.deployments.fleet.canary import CanaryResult
from deployer.deployments.fleet.canary_judge import WindowNumbers, judge
from deployer.deployments.fleet.members import fleet_of
from deployer.deployments.fleet.report import FleetReport, ReplicaResult
from deployer.operate.upgrade.carry import carried
from deployer.operate.upgrade.compare import Side, compare
from deployer.operate.upgrade.outcome import Upgraded
from deployer.operate.upgrade.plan import UpgradeOptions, UpgradePlan
from deployer.operate.upgrade.release import Release
from deployer.preflight.flags import Flag, FlagSet
from deployer.profile.loader import load_profile
from deployer.profile.model import Canary, Profile

REPO = Path(__file__).resolve().parents[2]
SGLANG = engine_for("sglang").knowledge
NEW = FlagSet("sglang", "0.5.23", tuple(Flag((o,), o.lstrip("-").replace("-", "_"))
                                        for o in ("--tp-size", "--mamba-radix-cache-strategy")))
ENV = {"HF_TOKEN": "hf_secret"}


def address(_target: Any) -> str:
    return "127.0.0.1"


def quiet(_event: Event) -> None:
    pass


def fleet_files(tmp_path: Path, *, router: bool = True) -> Path:
    """base.yaml (the engine's python and model) and fleet.yaml extending it: the flags, a secret as ${HF_TOKEN},
    two replicas (the second with its own GPUs) and a router."""
    (tmp_path / "base.yaml").write_text("engine:\n  python: /old/python\n  model_path: m\n  version: 0.5.10\n")
    data: dict[str, Any] = {"extends": "base.yaml", "name": "fl",
                            "replicas": [{"host": "gpu-a", "engine_port": 30001},
                                         {"host": "gpu-b", "engine_port": 30002, "gpus": [1]}],
                            "engine": {"args": {"tp_size": 1, "mamba_scheduler_strategy": "extra_buffer"},
                                       "env": {"SGLANG_ENABLE_SPEC_V2": "1", "HF_TOKEN": "${HF_TOKEN}"}}}
    if router:
        data["router"] = {"python": "/smg/python", "port": 31000}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return tmp_path / "fleet.yaml"


def planned_on(single: Profile) -> UpgradePlan:
    """The plan `upgrade_plan` makes on one host, from the synthetic 0.5.23 flag table (no target reached)."""
    renames = load_renames(SGLANG)
    old = Side("0.5.10", None, dict(single.engine.args), "done", {})
    new = Side("0.5.23", NEW, {}, "done", {})
    result = compare("sglang", old, new, dict(single.engine.env), renames, SGLANG, single.secret_env_keys())
    upgraded = single.with_engine(single.engine.model_copy(update={"args": result.args, "env": result.env}))
    report: Any = SimpleNamespace(problems=[])
    return UpgradePlan(single.name, result, upgraded, report, report)


def fleet_and_plan(tmp_path: Path) -> tuple[Profile, UpgradePlan]:
    fleet = load_profile(str(fleet_files(tmp_path)), overrides=[], host=None, environ=ENV)
    return fleet, planned_on(fleet_of(fleet, address).replicas[0].profile)


def test_the_fleet_profile_gets_the_replicas_changes_and_keeps_its_replicas(tmp_path: Path) -> None:
    fleet, plan = fleet_and_plan(tmp_path)
    up = carried(plan, fleet, "/new/python")
    assert up.name == "fl" and up.profile.name == "fl"
    assert up.profile.engine.args == {"tp_size": 1, "mamba_radix_cache_strategy": "extra_buffer"}
    assert "SGLANG_ENABLE_SPEC_V2" not in up.profile.engine.env and up.profile.engine.env["HF_TOKEN"] == "hf_secret"
    assert (up.profile.engine.python, up.profile.engine.install, up.profile.engine.version) == \
        ("/new/python", None, "0.5.23")
    assert up.profile.replicas == fleet.replicas and up.profile.router == fleet.router
    assert up.profile.engine.port == fleet.engine.port and up.profile.engine.host == fleet.engine.host
    members = fleet_of(up.profile, address).replicas          # each replica runs the carried flags
    assert [m.profile.engine.port for m in members] == [30001, 30002] and members[1].profile.engine.gpus == [1]
    assert all(m.profile.engine.args == up.profile.engine.args for m in members)
    assert "HF_TOKEN" in up.profile.secret_env_keys()
    managed = carried(plan, fleet, None).profile.engine             # no --python: a managed environment per host
    assert managed.install is not None and managed.install.packages == ["sglang==0.5.23"]


def test_save_writes_a_fleet_profile_that_keeps_extends_and_its_variables(tmp_path: Path) -> None:
    fleet, plan = fleet_and_plan(tmp_path)
    dest = tmp_path / "fleet-0523.yaml"
    Upgraded(carried(plan, fleet, "/new/python"), fleet, "/new/python").save(dest)
    written = dest.read_text()
    data = yaml.safe_load(written)
    assert data["extends"] == "base.yaml" and "hf_secret" not in written
    assert data["engine"]["env"] == {"HF_TOKEN": "${HF_TOKEN}"}
    assert data["replicas"] == yaml.safe_load((tmp_path / "fleet.yaml").read_text())["replicas"]
    again = load_profile(str(dest), overrides=[], host=None, environ=ENV)
    assert is_fleet(again) and again.name == "fl" and again.replicas == fleet.replicas
    assert again.engine.args == {"tp_size": 1, "mamba_radix_cache_strategy": "extra_buffer"}
    assert (again.engine.version, again.engine.python) == ("0.5.23", "/new/python")
    assert "SGLANG_ENABLE_SPEC_V2" not in again.engine.env and again.engine.env["HF_TOKEN"] == "hf_secret"


def options() -> UpgradeOptions:
    return UpgradeOptions(Release("sglang", "0.5.23"), "/new/python", cache_dir=Path("/nonexistent"))


def test_the_plan_is_made_on_the_first_replicas_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = load_profile(str(fleet_files(tmp_path)), overrides=[], host=None, environ=ENV)
    asked: list[Profile] = []

    def plan_on(profile: Profile, _opts: Any, _trust: bool, _emit: Any) -> UpgradePlan:
        asked.append(profile)
        return planned_on(profile)

    monkeypatch.setattr(fleet_upgrade, "upgrade_plan", plan_on)
    done = fleet_upgrade.upgrade_fleet(fleet, options(), False, False, quiet, address)
    [single] = asked
    assert (single.name, single.target.host, single.replicas, single.engine.port) == ("fl-r0", "gpu-a", None, 30001)
    assert done.plan.profile.replicas == fleet.replicas and done.original is fleet and done.applied is None
    assert done.to_json()["engine_args"] == {"tp_size": 1, "mamba_radix_cache_strategy": "extra_buffer"}
    done.check("sglang==0.5.23", apply_it=False)


def rolled_back() -> CanaryResult:
    canary = WindowNumbers(0, 40, 0, 0.05, 0.09, 30.0)
    others = [WindowNumbers(1, 40, 0, 0.05, 0.03, 90.0)]
    verdict = judge(canary, others, Canary(window_s=4, min_requests=8), 4)
    report = FleetReport("fl", mode="canary", canary=verdict, outcome="rolled-back", replicas=[
        ReplicaResult(0, "gpu-a", "fl-r0", "http://127.0.0.1:30001", "rolled-back", restored={"status": "ready"},
                      error="the canary was rolled back: itl_p99: FAILED"),
        ReplicaResult(1, "gpu-b", "fl-r1", "http://127.0.0.1:30002", "left-running")])
    return CanaryResult("rolled-back", verdict, report, "fl: 0 of 2 replicas ready")


def test_apply_is_the_canary_with_the_upgraded_fleet_and_a_roll_back_exits_as_up_canary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = load_profile(str(fleet_files(tmp_path)), overrides=[], host=None, environ=ENV)
    rolled: list[Profile] = []

    def canary(profile: Profile, opts: Any, _emit: Any, **_kw: Any) -> CanaryResult:
        rolled.append(profile)
        assert opts.what == "upgrade"
        return rolled_back()

    monkeypatch.setattr(fleet_upgrade, "upgrade_plan", lambda p, *_a: planned_on(p))
    monkeypatch.setattr(fleet_upgrade, "run_canary", canary)
    done = fleet_upgrade.upgrade_fleet(fleet, options(), False, True, quiet, address)
    [profile] = rolled
    assert profile.name == "fl" and profile.replicas == fleet.replicas and profile.engine.version == "0.5.23"
    assert "mamba_radix_cache_strategy" in profile.engine.args
    text = done.text()
    assert "apply: canary rolled-back" in text and "itl_p99: FAILED" in text and "r1@gpu-b: left-running" in text
    assert "  check traffic: ok (canary 40 requests" in text and "  check itl_p99: FAILED (" in text   # every gate
    assert done.to_json()["apply"]["report"]["canary"]["decision"] == "roll-back"
    with pytest.raises(PartlyFailed) as failed:
        done.check("sglang==0.5.23", apply_it=True)
    assert failed.value.exit_code == 9 and "r0@gpu-a: the canary was rolled back: itl_p99" in failed.value.message


def test_apply_without_a_router_is_refused_before_anything_is_planned(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = load_profile(str(fleet_files(tmp_path, router=False)), overrides=[], host=None, environ=ENV)
    monkeypatch.setattr(fleet_upgrade, "upgrade_plan", lambda *_a: pytest.fail("planned"))
    with pytest.raises(ProfileError, match="--canary needs a router"):
        fleet_upgrade.upgrade_fleet(fleet, options(), False, True, quiet, address)


def test_a_node_group_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump({"name": "group", "nodes": [{"host": "node-0"}, {"host": "node-1"}],
                                    "engine": {"model_path": "m", "python": "/p", "dist_init_port": 20000}}))
    group = for_profile(load_profile(str(path), overrides=[], host=None, environ={}))
    with pytest.raises(ProfileError, match="not a node group"):
        group.upgrade(options(), False, quiet)
    run = subprocess.run([sys.executable, "-m", "deployer.cli", "upgrade", str(path), "--engine", "sglang==0.5.23"],
                         capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(tmp_path / "home")})
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "error: group: `deploy upgrade` moves a single host or a replica fleet, not a node group (one engine over "
        "several hosts): give it the release's engine.python or engine.install and `deploy up`"]


def test_a_fleet_file_upgrades_as_a_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`deploy upgrade FLEET` reaches the fleet's operation (the kinds are told apart in deployer.deployments)."""
    from deployer.deployments.fleet import deployment as fleet_kind

    fleet = load_profile(str(fleet_files(tmp_path)), overrides=[], host=None, environ=ENV)
    seen: list[tuple[str, bool]] = []
    done: Any = object()

    def upgrade_fleet(profile: Profile, _opts: Any, _trust: bool, apply_it: bool, _emit: Any) -> Any:
        seen.append((profile.name, apply_it))
        return done

    monkeypatch.setattr(fleet_kind, "upgrade_fleet", upgrade_fleet)
    assert for_profile(fleet).upgrade(options(), True, quiet) is done and seen == [("fl", True)]
