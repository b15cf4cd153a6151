"""Helpers for the fleet tests: a `replicas:` profile over tests/hostbed.py hosts, the real router (smg), requests."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import STANDIN, deploy
from hostbed import HostBed
from sshbed import free_port

SMG_VENV = Path(os.environ.get("SMG_VENV", Path.home() / ".cache" / "deployer" / "smg-venv"))


def smg_python() -> str:
    python = SMG_VENV / "bin" / "python"
    if not (SMG_VENV / "bin" / "smg").exists():
        pytest.fail(f"no smg in {SMG_VENV}: run `make smg-venv` (README's `make test` builds it)")
    return str(python)


def fleet_profile(tmp_path: Path, bed: HostBed, *, name: str = "fleet", router: bool = True,
                  env: dict[str, str] | None = None, replicas: list[dict[str, Any]] | None = None,
                  extra: dict[str, Any] | None = None) -> tuple[Path, dict[str, Any]]:
    """One replica per host of the bed (distinct engine ports: the bed's hosts share one machine), the real
    router on the first host."""
    entries = replicas or [{"host": h.alias, "workdir": str(h.workdir), "engine_port": free_port(h.addr)}
                           for h in bed.hosts]
    data: dict[str, Any] = {
        "name": name,
        "replicas": entries,
        "engine": {"kind": "sglang", "python": "/usr/bin/python3", "model_path": "Qwen/Qwen3-8B",
                   "env": {"PYTHONPATH": str(STANDIN), **(env or {})}},
        "health": {"interval_s": 0.2, "startup_timeout_s": 60, "stall_timeout_s": 20},
        "retry": {"max_attempts": 2, "backoff_s": 0.2},
        "restart": {"grace_s": 3},
    }
    if router:
        data["router"] = {"python": smg_python(), "port": free_port(bed.hosts[0].addr), "policy": "round_robin",
                          "args": {"health_check_interval_secs": 1}}
    data.update(extra or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


def fleet_deploy(bed: HostBed, *argv: str, home: Path, timeout: float = 180, env: dict[str, str] | None = None) -> Any:
    return deploy(*argv, home=home, timeout=timeout, env={"DEPLOYER_SSH_CONFIG": str(bed.ssh_config), **(env or {})})


def chat(addr: str, port: int, timeout: float = 10.0) -> dict[str, Any]:
    body = json.dumps({"model": "Qwen/Qwen3-8B", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"http://{addr}:{port}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        data: dict[str, Any] = json.loads(reply.read())
        return data


def get_json(url: str, timeout: float = 3.0, key: str | None = None) -> tuple[int, Any]:
    """GET `url` (with `key` as the bearer): its HTTP status and JSON (0 when nothing answers)."""
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return 0, None


def engine_log(workdir: str, name: str) -> str:
    return (Path(workdir) / name / "current" / "engine.log").read_text(errors="replace")


def router_key(workdir: Path | str, router: str) -> str:
    """The control key of the router deployment `router` (its current run's 0600 env file: deployments/fleet/router_key.py)."""
    for line in (Path(workdir) / router / "current" / "env").read_text().splitlines():
        if line.startswith("DEPLOYER_SECRET_ROUTER_CONTROL_KEY="):
            return line.split("=", 1)[1].strip("'")
    raise AssertionError(f"no control key in {router}'s env file")
