"""A router replaced after its settings change, end to end (issue 22, 10): a fleet with the real smg router, its
policy and arguments changed in the profile, `up` again: the router is replaced (a new run dir, a new process
with the new settings, the old one gone) in front of the same, untouched replicas, and requests are served
through it again."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deploy_helpers import events
from fleet_helpers import chat, fleet_deploy, fleet_profile, get_json
from hostbed import HostBed, host_bed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


def router_state(bed: HostBed) -> dict[str, object]:
    return dict(json.loads((bed.hosts[0].workdir / "fleet-router" / "current" / "state.json").read_text()))


def replica_pids(bed: HostBed) -> list[object]:
    return [json.loads((h.workdir / f"fleet-r{i}" / "current" / "state.json").read_text())["pid"]
            for i, h in enumerate(bed.hosts)]


def test_a_router_whose_settings_changed_is_replaced_and_serves(tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed)
    first = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home)
    assert first.returncode == 0, first.stderr[-3000:] + first.stdout[-3000:]
    before = events(first.stdout)[-1]
    old_run, old_pid = before["router"]["run_dir"], router_state(bed)["pid"]
    engines = replica_pids(bed)

    data["router"]["policy"] = "random"
    data["router"]["args"]["health_check_interval_secs"] = 2
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    again = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home)
    assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-3000:]
    report = events(again.stdout)[-1]
    router = report["router"]
    assert router["action"] == "replaced" and router["status"] == "ready", router
    assert router["run_dir"] != old_run and sorted(router["workers"]) == sorted(r["url"] for r in report["replicas"])
    assert [r["status"] for r in report["replicas"]] == ["unchanged", "unchanged"], report["replicas"]
    assert replica_pids(bed) == engines  # the replicas were not touched
    state = router_state(bed)
    assert state["status"] in ("running", "ready") and state["pid"] != old_pid, state
    launch = (Path(router["run_dir"]) / "launch.sh").read_text()
    assert "random" in launch and "round_robin" not in launch, launch[-1500:]
    assert not (Path(old_run) / "state.json").exists() or \
        json.loads((Path(old_run) / "state.json").read_text())["status"] not in ("running", "ready")

    addr, port = bed.hosts[0].addr, data["router"]["port"]
    deadline = time.monotonic() + 20
    while get_json(f"http://{addr}:{port}/readiness")[1] in (None, {}) and time.monotonic() < deadline:
        time.sleep(0.2)
    code, ready = get_json(f"http://{addr}:{port}/readiness")
    assert code == 200 and ready["healthy_workers"] == 2, ready
    answers = [chat(addr, port) for _ in range(6)]
    assert all(a["choices"][0]["message"]["content"] for a in answers)
    st = fleet_deploy(bed, "status", str(prof), "--json", home=home)
    assert st.returncode == 0 and json.loads(st.stdout)["router"]["healthy"] is True, st.stdout + st.stderr
    assert fleet_deploy(bed, "down", str(prof), home=home).returncode == 0
