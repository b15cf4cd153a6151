"""`deploy upgrade FLEET --engine sglang==0.5.23 --python ... --apply` end to end (issue 39): two hosts of real sshd
(tests/hostbed.py), the real router (smg, SMG_VENV), the stand-in SGLang of two eras as two releases (each behind
its own engine python, as tests/integration/test_upgrade_apply.py makes them).

The fleet serves the seed era (0.5.10, `mamba_scheduler_strategy`); the upgrade is planned on the first replica's
host (the flag renamed with its value), and `--apply` rolls the upgraded fleet profile out through the canary while
clients send requests through the router: the canary is judged on its live metrics, promoted, and every replica
then runs 0.5.23 with the renamed flag; no client request fails.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import STANDIN
from fleet_helpers import chat, fleet_deploy, fleet_profile
from hostbed import HostBed, host_bed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400),
              pytest.mark.slow("a fleet on the stand-in's old era, the upgrade's plan, then a canary rollout with "
                               "its window behind the real router")]
WORLD = {"STANDIN_CHAT_DELAY_S": "0.05", "STANDIN_DRAIN_S": "0.5"}
ROLLOUT = {"canary": {"window_s": 4, "min_requests": 8}}
TRAFFIC_LIMIT_S = 300.0


def era_python(tmp: Path, name: str, version: str) -> str:
    """A stand-in engine python of one SGLang release: /usr/bin/python3 with that era's env."""
    path = tmp / name
    path.write_text(f'#!/bin/sh\nSTANDIN_SGLANG_VERSION={version} exec /usr/bin/python3 "$@"\n')
    path.chmod(0o755)
    return str(path)


class Traffic:
    """Two threads sending chat completions through the router until stopped (bounded in time)."""

    def __init__(self, addr: str, port: int) -> None:
        self.addr, self.port = addr, port
        self.answered = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._send, daemon=True) for _ in range(2)]

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _send(self) -> None:
        deadline = time.monotonic() + TRAFFIC_LIMIT_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                assert chat(self.addr, self.port, timeout=15)["choices"][0]["message"]["content"]
                self.answered += 1
            except Exception as exc:  # noqa: BLE001 (any failure counts)
                self.failed.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.01)


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    """Two hosts, each a GPU box for preflight (the stand-in nvidia-smi: one idle H200)."""
    with host_bed(tmp_path / "hosts", 2) as hosts:
        for host in hosts.hosts:
            (host.sshd.bin_dir / "nvidia-smi").symlink_to(STANDIN / "bin" / "nvidia-smi")
        yield hosts


def running(bed: HostBed, index: int, name: str) -> dict[str, Any]:
    """What replica `index` runs: its current run's record (the argv, and the profile it was made from)."""
    path = bed.hosts[index].workdir / f"{name}-r{index}" / "current" / "profile.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_a_fleet_is_upgraded_through_its_canary_with_the_renamed_flag(tmp_path: Path, bed: HostBed) -> None:
    old = era_python(tmp_path, "standin-0510", "0.5.10")
    new = era_python(tmp_path, "standin-0523", "0.5.23")
    prof, data = fleet_profile(tmp_path, bed, name="upf", env=WORLD, extra={"rollout": ROLLOUT})
    data["engine"].update(python=old, version="0.5.10",
                          args={"enable_metrics": True, "mamba_scheduler_strategy": "extra_buffer"})
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    home = tmp_path / "home"
    up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        saved = tmp_path / "upf-0523.yaml"
        with Traffic(bed.hosts[0].addr, data["router"]["port"]) as traffic:
            time.sleep(1.0)
            ran = fleet_deploy(bed, "upgrade", str(prof), "--engine", "sglang==0.5.23", "--python", new, "--apply",
                               "--save", str(saved), "--json", home=home, timeout=300)
            time.sleep(0.5)
        assert ran.returncode == 0, ran.stderr[-3000:]
        report = json.loads(ran.stdout.splitlines()[-1])
        assert (report["name"], report["from"], report["to"]) == ("upf", "0.5.10", "0.5.23"), report
        assert [c["name"] for c in report["changes"] if c["what"] == "renamed"] == ["mamba_scheduler_strategy"]
        applied = report["apply"]
        assert applied["decision"] == "promoted", applied
        verdict = applied["report"]["canary"]
        assert verdict["decision"] == "promote" and verdict["canary"]["replica"] == 0, verdict
        assert {c["name"]: c["passed"] for c in verdict["checks"]}["traffic"] is True
        assert [r["status"] for r in applied["report"]["replicas"]] == ["ready", "ready"]
        for i in (0, 1):
            run = running(bed, i, "upf")
            engine = run["profile"]["engine"]
            assert (engine["version"], engine["python"]) == ("0.5.23", new), engine
            assert run["argv"][0] == new and run["argv"][-2:] == ["--mamba-radix-cache-strategy", "extra_buffer"]
            assert engine["args"].get("mamba_radix_cache_strategy") == "extra_buffer", engine["args"]
            assert "mamba_scheduler_strategy" not in engine["args"]
        again = yaml.safe_load(saved.read_text())
        assert again["replicas"] == data["replicas"] and again["engine"]["version"] == "0.5.23"
        assert traffic.failed == [], traffic.failed[:5]
        assert traffic.answered >= 16, traffic.answered
    finally:
        fleet_deploy(bed, "down", str(prof), home=home)
