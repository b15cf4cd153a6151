"""The router's launch.sh and env file, pinned byte for byte: a different byte changes the router's settings hash,
and every running router would then be restarted by the next `up` instead of being brought to its worker set.

Captured again, on purpose, when smg moved behind its control key and its credentials out of its argv (issue 34:
deployments/fleet/router_key.py): a router an earlier release started has an open worker API and is replaced once by the next
`up`. The member carries a fixed control key here (a real one is random, kept by the running router).

The captured files stand under records/router-launch/, with this deployer's version as `<version>` (the script
names it). Set DEPLOYER_CAPTURE_ROUTER_LAUNCH=1 to write them again (only ever on purpose)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer import __version__
from deployer.deployments.fleet import router as router_mod
from deployer.deployments.fleet.members import fleet_of
from deployer.profile.loader import load_profile
from deployer.profile.model import Target

PINNED = Path(__file__).parent / "records" / "router-launch"
ADDRESSES = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}
URLS = ["http://10.0.0.1:30000", "http://10.0.0.2:30001"]
ENVIRON = {"TOKEN_FOR_TEST": "hf_secret_value", "ROUTER_KEY_FOR_TEST": "rk-secret-9",
           "ENGINE_KEY_FOR_TEST": "-ek 'quoted' $x", "PLANE_KEY_FOR_TEST": "cp-1"}
VERSION = "<version>"

BASE: dict[str, Any] = {
    "name": "qwen3-8b-fleet",
    "replicas": [{"host": "gpu-a"}, {"host": "gpu-b", "engine_port": 30001}],
    "engine": {"model_path": "Qwen/Qwen3-8B", "python": "/venv/bin/python", "gpus": [0],
               "env": {"HF_TOKEN": "${TOKEN_FOR_TEST}"}},
}
CASES: dict[str, dict[str, Any]] = {
    # the fleet of the pinned records: the router's own key, one plain flag
    "keyed": {"router": {"python": "/workspace/router-venv/bin/python", "port": 8000, "policy": "cache_aware",
                         "args": {"health_check_interval_secs": 5, "api_key": "${ROUTER_KEY_FOR_TEST}"}}},
    # defaults: no key, no args
    "plain": {"router": {"port": 8000}},
    # the replicas' key by reference, metrics port given, hostile, list, dict, bool, negative and templated values
    "various": {"engine": {**BASE["engine"], "args": {"api_key": "${ENGINE_KEY_FOR_TEST}"}},
                "router": {"python": "/opt/r v/bin/python", "port": 65535, "policy": "round_robin",
                           "target": {"host": "gpu-b"},
                           "args": {"host": "0.0.0.0", "prometheus_port": 9100,
                                    "served_model_name": "a b; $(touch /tmp/pwned) `x`",
                                    "retry_delays": [1, 2.5, "x y"], "request_id_headers": {"b": 1, "a": "z"},
                                    "enable_trace": True, "disable_retries": False, "nothing": None,
                                    "offset": -3, "control_plane_api_keys": ["${PLANE_KEY_FOR_TEST}", "cp-2"]}}},
}


def _addr(target: Target) -> str:
    return ADDRESSES[target.host]


def _fleet(tmp_path: Path, case: str) -> Any:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({**BASE, **CASES[case]}))
    return load_profile(path, environ=ENVIRON)


def _placeholder(text: str) -> str:
    return text.replace(shlex.quote(__version__), VERSION)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("urls", [URLS, []], ids=["workers", "settings"])
def test_the_router_launch_files_are_the_previous_releases(tmp_path: Path, case: str, urls: list[str]) -> None:
    fleet = _fleet(tmp_path, case)
    member = fleet_of(fleet, _addr).router
    assert member is not None
    member = dataclasses.replace(member, control_key="ck-fixed-for-test")
    bundle = router_mod.render_router(member, urls, fleet)
    stem = f"{case}-{'workers' if urls else 'settings'}"
    script, env = PINNED / f"{stem}.launch.sh", PINNED / f"{stem}.env"
    if os.environ.get("DEPLOYER_CAPTURE_ROUTER_LAUNCH") == "1":
        script.write_text(_placeholder(bundle.script))
        env.write_text(bundle.env)
    pinned_script = script.read_text().replace(VERSION, shlex.quote(__version__))
    assert bundle.script == pinned_script
    assert bundle.env == env.read_text()
    assert bundle.content_hash == hashlib.sha256(pinned_script.encode() + b"\0" + env.read_text().encode()).hexdigest()
    if not urls:
        assert router_mod.settings_hash(member, fleet) == bundle.content_hash
