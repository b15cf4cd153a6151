"""`deploy smoke` of a fleet: a request through the real router and one to each replica; JUnit case per host and
phase, written when a host fails too."""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deploy_helpers import events
from fleet_helpers import engine_log, fleet_deploy, fleet_profile, get_json, router_key
from hostbed import HostBed, host_bed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


def _cases(junit: Path) -> dict[str, str]:
    root = ET.parse(junit).getroot()
    out = {}
    for case in root.iter("testcase"):
        status = "failed" if case.find("failure") is not None else "skipped" if case.find("skipped") is not None \
            else "passed"
        out[case.get("name", "")] = status
    return out


def test_fleet_smoke_asks_the_router_and_every_replica(tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, name="smk")
    # the replicas' key: the router gets it too (smg --api-key), and then its worker API asks for it
    data["engine"]["args"] = {"api_key": "${FLEET_TEST_KEY}"}
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    key = "sk-fleet-smoke-4242"
    junit = tmp_path / "junit.xml"
    run = fleet_deploy(bed, "smoke", str(prof), "--skip-preflight", "--junit", str(junit), "--json", "--keep",
                       home=home, env={"FLEET_TEST_KEY": key})
    assert run.returncode == 0, run.stderr[-3000:]
    assert key not in run.stdout + run.stderr + junit.read_text()
    router_dir = bed.hosts[0].workdir / "smk-router" / "current"
    assert key not in (router_dir / "launch.sh").read_text() and key in (router_dir / "env").read_text()
    assert key not in (bed.hosts[0].workdir / "smk" / "fleet.json").read_text()
    addr, port = bed.hosts[0].addr, data["router"]["port"]
    assert get_json(f"http://{addr}:{port}/workers")[0] == 401          # smg's API wants a key ...
    assert get_json(f"http://{addr}:{port}/workers", key=key)[0] == 401  # ... not the clients' one ...
    assert get_json(f"http://{addr}:{port}/workers", key=router_key(bed.hosts[0].workdir, "smk-router"))[0] == 200
    down = fleet_deploy(bed, "down", str(prof), home=home, env={"FLEET_TEST_KEY": key})
    assert down.returncode == 0, down.stderr
    report = events(run.stdout)[-1]
    assert report["ok"] is True
    cases = _cases(junit)
    assert cases == {                                                   # ... and deployer sent it
        "up r0@node-0": "passed", "up r1@node-1": "passed", "router router@node-0": "passed",
        "request router@node-0": "passed", "request r0@node-0": "passed", "request r1@node-1": "passed",
        "stop r0@node-0": "skipped", "stop r1@node-1": "skipped", "stop router@node-0": "skipped",
    }, cases
    # one request through the router (round_robin sends it to one replica) plus one straight to each
    served = [engine_log(str(h.workdir), f"smk-r{i}").count("POST /v1/chat/completions")
              for i, h in enumerate(bed.hosts)]
    assert sum(served) == 3 and min(served) >= 1, served   # the engines are stopped: their logs are complete
    assert get_json(f"http://{bed.hosts[0].addr}:{data['router']['port']}/readiness")[0] == 0   # stopped


def test_fleet_smoke_with_a_failed_host_names_it_in_junit(tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    junit = tmp_path / "junit.xml"
    prof, data = fleet_profile(tmp_path, bed, name="smkf")
    # bad input first: two replicas on one host and one port -> one line, exit 2, nothing started
    clash = {**data, "replicas": [data["replicas"][0], {**data["replicas"][0]}]}
    prof.write_text(yaml.safe_dump(clash, sort_keys=False))
    bad = fleet_deploy(bed, "smoke", str(prof), "--skip-preflight", home=home)
    assert bad.returncode == 2 and "both use port" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert not (bed.hosts[0].workdir / "smkf-r0").exists()

    # r1's port is held by a process that is not ours on node-1: that host fails, the others carry on
    with socket.socket() as holder:
        holder.bind((bed.hosts[1].addr, 0))
        holder.listen(1)
        data["replicas"][1]["engine_port"] = holder.getsockname()[1]
        prof.write_text(yaml.safe_dump(data, sort_keys=False))
        run = fleet_deploy(bed, "smoke", str(prof), "--skip-preflight", "--junit", str(junit), home=home)
    assert run.returncode == 9, run.stderr[-3000:]
    cases = _cases(junit)
    assert cases["up r0@node-0"] == "passed" and cases["up r1@node-1"] == "failed"
    assert cases["request router@node-0"] == "passed" and cases["request r0@node-0"] == "passed"
    assert cases["request r1@node-1"] == "skipped"
    assert "r1@node-1" in run.stdout and "FAILED (exit 9)" in run.stdout
