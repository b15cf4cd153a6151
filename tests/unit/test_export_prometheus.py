"""`deploy export prometheus`'s core: the file_sd scrape targets of the shipped profiles (single host, a replica
fleet with its router, a node group), their labels, and the warnings (metrics off, loopback binds)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.engines import engine_for

from deployer.engines import kinds
from deployer.errors import ProfileError
from deployer.deployments.resolve import for_profile
from deployer.export.prometheus import METRICS_PATH, AddressOf, PromExport, written_address
from deployer.observe.names import load_metric_names
from deployer.observe.prometheus import parse
from deployer.profile.loader import load_profile
from deployer.profile.model import Profile, Target

REPO = Path(__file__).resolve().parents[2]
SECRETS = {"HF_TOKEN": "hf_testTOKENvalue42", "SGLANG_API_KEY": "sk-test-api-key-77"}
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # Prometheus' label name syntax


OFF = "engine.args.enable_metrics=null"  # the example profiles turn SGLang's metrics on; this takes it out again


def load(name: str, *overrides: str) -> Profile:
    return load_profile(REPO / "profiles" / f"{name}.yaml", environ=dict(SECRETS), overrides=list(overrides))


def written(tmp_path: Path, data: dict[str, Any]) -> Profile:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile(path)


def scrape_targets(profile: Profile, address_of: AddressOf = written_address) -> PromExport:
    """The scrape targets as `deploy export prometheus` asks them: of the profile's Deployment, whatever its kind."""
    return for_profile(profile).scrape_targets(address_of)


def by_address(export: PromExport) -> dict[str, dict[str, str]]:
    return {group["targets"][0]: group["labels"] for group in export.to_json()}


def test_a_single_host_is_one_engine_target_at_its_port() -> None:
    export = scrape_targets(load("llama33-70b-tp2", "engine.host=0.0.0.0"))
    assert by_address(export) == {"gpu-box:30001": {
        "__metrics_path__": "/metrics", "deployment": "llama33-70b-tp2", "profile": "llama33-70b-tp2",
        "role": "engine", "host": "gpu-box", "engine_kind": "sglang"}}
    assert export.warnings == []  # enable_metrics: true, bound to every interface


def test_a_pinned_engine_version_is_a_label() -> None:
    labels = by_address(scrape_targets(load("qwen3-8b-vllm", "engine.host=0.0.0.0")))["gpu-box:8000"]
    assert labels["engine_kind"] == "vllm" and labels["engine_version"] == "0.33.0"


def test_sglang_without_enable_metrics_is_listed_with_a_warning_to_add_it() -> None:
    export = scrape_targets(load("starter", "engine.host=0.0.0.0", "engine.args.enable_metrics=null"))
    assert list(by_address(export)) == ["gpu-box:30000"]
    assert len(export.warnings) == 1 and "enable_metrics: true" in export.warnings[0]
    assert scrape_targets(load("starter", "engine.host=0.0.0.0")).warnings == []  # the starter turns them on
    off = scrape_targets(load("starter", "engine.host=0.0.0.0", "engine.args.enable_metrics=false"))
    assert "enable_metrics" in off.warnings[0]


def test_vllm_serves_metrics_unless_its_stats_are_off() -> None:
    assert scrape_targets(load("qwen3-8b-vllm", "engine.host=0.0.0.0")).warnings == []
    off = scrape_targets(load("qwen3-8b-vllm", "engine.host=0.0.0.0", "engine.args.disable_log_stats=true"))
    assert len(off.warnings) == 1 and "disable_log_stats" in off.warnings[0]


def test_an_engine_on_loopback_of_another_host_is_written_at_the_host_with_a_warning() -> None:
    export = scrape_targets(load("llama33-70b-tp2"))  # engine.host: the default 127.0.0.1
    assert list(by_address(export)) == ["gpu-box:30001"]
    assert len(export.warnings) == 1
    assert "127.0.0.1 on gpu-box" in export.warnings[0] and "engine.host" in export.warnings[0]


def test_a_local_target_is_scraped_on_loopback_without_a_warning() -> None:
    export = scrape_targets(load("qwen3-8b-local", "engine.args.enable_metrics=true"))
    assert list(by_address(export)) == ["127.0.0.1:30002"]
    assert export.warnings == []


def test_a_fleet_is_every_replica_at_its_engine_port_and_the_routers_metrics_port() -> None:
    export = scrape_targets(load("qwen3-8b-fleet", OFF))
    targets = by_address(export)
    assert list(targets) == ["gpu-a:30000", "gpu-b:30001", "gpu-a:8001"]  # smg's metrics: router port + 1
    assert targets["gpu-a:30000"]["deployment"] == "qwen3-8b-fleet-r0"
    assert targets["gpu-b:30001"]["replica"] == "r1@gpu-b" and targets["gpu-b:30001"]["host"] == "gpu-b"
    assert {t["profile"] for t in targets.values()} == {"qwen3-8b-fleet"}
    router = targets["gpu-a:8001"]
    assert router == {"__metrics_path__": "/metrics", "deployment": "qwen3-8b-fleet-router",
                      "profile": "qwen3-8b-fleet", "role": "router", "host": "gpu-a"}
    # the shipped fleet leaves out --enable-metrics: one warning for the fleet, not one per replica
    assert len(export.warnings) == 1 and "enable_metrics" in export.warnings[0]
    assert scrape_targets(load("qwen3-8b-fleet")).warnings == []  # the example turns them on


def test_the_routers_own_prometheus_flags_win() -> None:
    profile = load("qwen3-8b-fleet", "router.args.prometheus_port=29100", "router.args.prometheus_host=10.0.0.9")
    assert "10.0.0.9:29100" in by_address(scrape_targets(profile))
    wildcard = load("qwen3-8b-fleet", "router.args.prometheus_host=0.0.0.0")
    assert "gpu-a:8001" in by_address(scrape_targets(wildcard))


def test_a_router_bound_to_loopback_is_warned_about() -> None:
    export = scrape_targets(load("qwen3-8b-fleet", "engine.args.enable_metrics=true", "router.args.host=127.0.0.1"))
    assert "gpu-a:8001" in by_address(export)
    assert len(export.warnings) == 1 and "qwen3-8b-fleet-router" in export.warnings[0]


def test_a_replica_listen_address_is_where_it_is_scraped(tmp_path: Path) -> None:
    profile = written(tmp_path, {
        "name": "pair", "engine": {"model_path": "m", "args": {"enable_metrics": True}},
        "replicas": [{"host": "gpu-a", "listen": "10.1.0.5"}, {"host": "gpu-b", "listen": "fd00::2"},
                     {"host": "gpu-c", "listen": "0.0.0.0", "engine_port": 31000}]})
    export = scrape_targets(profile)
    assert list(by_address(export)) == ["10.1.0.5:30000", "[fd00::2]:30000", "gpu-c:31000"]
    assert export.warnings == []


def test_a_node_group_is_one_target_per_node_with_its_rank() -> None:
    export = scrape_targets(load("llama-405b-2node", "engine.host=0.0.0.0", "engine.args.enable_metrics=true"))
    targets = by_address(export)
    assert list(targets) == ["node-0:30000", "node-1:30000"]
    assert [t["node_rank"] for t in targets.values()] == ["0", "1"]
    assert {t["deployment"] for t in targets.values()} == {"llama-405b-2node"}  # one engine, one deployment
    assert export.warnings == []


def test_node_0_on_loopback_is_warned_about_and_followers_are_not() -> None:
    export = scrape_targets(load("llama-405b-2node", OFF))  # no enable_metrics, rank 0 on the default 127.0.0.1
    assert list(by_address(export)) == ["node-0:30000", "node-1:30000"]
    assert len(export.warnings) == 2
    assert any("enable_metrics" in w for w in export.warnings)
    assert any("node 0" in w and "127.0.0.1 on node-0" in w for w in export.warnings)


def test_a_follower_port_of_its_own_is_its_target(tmp_path: Path) -> None:
    profile = written(tmp_path, {
        "name": "group", "engine": {"model_path": "m", "host": "0.0.0.0", "args": {"enable_metrics": True}},
        "nodes": [{"host": "n0"}, {"host": "n1", "engine_port": 31000}]})
    assert list(by_address(scrape_targets(profile))) == ["n0:30000", "n1:31000"]


def test_a_replica_count_names_no_host_to_scrape(tmp_path: Path) -> None:
    profile = written(tmp_path, {"name": "pods", "target": {"host": "gpu-a"}, "engine": {"model_path": "m"},
                                 "replicas": 2})
    with pytest.raises(ProfileError, match="count"):
        scrape_targets(profile)


def test_the_caller_may_resolve_ssh_aliases() -> None:
    def resolved(target: Target) -> str:
        return {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}[target.host]

    export = scrape_targets(load("qwen3-8b-fleet"), address_of=resolved)
    assert list(by_address(export)) == ["10.0.0.1:30000", "10.0.0.2:30001", "10.0.0.1:8001"]
    assert by_address(export)["10.0.0.1:30000"]["host"] == "gpu-a"  # the label stays the host as written


def test_the_file_is_file_sd_json() -> None:
    export = scrape_targets(load("qwen3-8b-fleet"))
    data = json.loads(export.text())
    assert data == export.to_json()
    for group in data:
        assert set(group) == {"targets", "labels"}
        assert all(isinstance(t, str) and re.fullmatch(r"[^\s/]+:\d+", t) for t in group["targets"])
        assert all(LABEL_NAME.match(k) and isinstance(v, str) for k, v in group["labels"].items())
        assert group["labels"]["__metrics_path__"] == METRICS_PATH


def test_no_target_label_renames_a_label_the_engines_put_on_their_series() -> None:
    """Prometheus renames a scraped label that a target label also names (to exported_<name>): none may."""
    theirs: set[str] = set()
    for capture in sorted((REPO / "tests" / "cases" / "metrics").glob("*/*.prom")):
        for family in parse(capture.read_text(encoding="utf-8")).families.values():
            theirs |= {k for sample in family.samples for k, _ in sample.labels}
    assert {"engine", "model_name", "tp_rank"} <= theirs  # the captures are read
    profiles = [load("qwen3-8b-fleet"), load("llama-405b-2node"), load("qwen3-8b-vllm")]
    ours = {k for p in profiles for group in scrape_targets(p).to_json() for k in group["labels"]}
    assert not ours & theirs


@pytest.mark.parametrize("kind", kinds())
def test_each_engines_metrics_switch_is_an_on_off_flag_of_its_real_parser(kind: str) -> None:
    """The switch lives in the engine's metrics.yaml; its flag is a store_true option in every flag table captured
    from the engine's real parser (tests/standin/<kind>/.../flags_<release>.json)."""
    path = engine_for(kind).knowledge.metrics
    assert path is not None
    switch = load_metric_names(path).switch
    assert switch is not None and switch.flag in switch.fix
    tables = sorted((REPO / "tests" / "standin" / kind).rglob("flags_*.json"))
    assert tables
    for table in tables:
        actions = {a["dest"]: a for a in json.loads(table.read_text(encoding="utf-8"))["actions"]}
        assert actions[switch.flag]["kind"] == "store_true", table.name


def test_the_cli_writes_the_file_sd_and_warns_on_stderr(tmp_path: Path) -> None:
    """`deploy export prometheus` needs no secret set (it writes addresses only); warnings go to stderr, one
    line each; -o writes the same JSON the core gives."""
    import subprocess
    import sys

    out = tmp_path / "targets.json"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no HF_TOKEN / SGLANG_API_KEY
    proc = subprocess.run([sys.executable, "-m", "deployer.cli", "export", "prometheus",
                           str(REPO / "profiles" / "qwen3-8b-fleet.yaml"), "--set", OFF, "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    written = json.loads(out.read_text())
    assert written == scrape_targets(load("qwen3-8b-fleet", OFF)).to_json()
    assert {t["labels"]["role"] for t in written} == {"engine", "router"}
    assert f"wrote {out} ({len(written)} targets)" in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    expected = [f"warning: {w}" for w in scrape_targets(load("qwen3-8b-fleet", OFF)).warnings]
    assert expected and all(line in warnings for line in expected)  # (and one per unset ${VAR}: not needed here)
    assert "Traceback" not in proc.stderr
