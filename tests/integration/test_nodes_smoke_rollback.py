"""`deploy smoke` and `deploy rollback` of one engine across nodes (issue 23: they fall out of the Deployment
interface): the real CLI against one real sshd per node (tests/hostbed.py) and the stand-in multi-node engine.

smoke: the group up, one real chat completion through node 0's port (the single-host smoke's request code),
the group down; the same report and JUnit as a single host's. rollback: back to the newest other version that
every node ran and that reached ready, refused (exit 7, nothing changed) when there is none.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from deploy_helpers import deploy
from hostbed import HostBed
from test_nodes_up import bed  # noqa: F401  (the fixture: two sshd hosts with the stand-in nvidia-smi)
from test_nodes_up import http_status, nodes_profile, report_of, state, up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _current(bed: HostBed, rank: int) -> str:
    return (bed.hosts[rank].workdir / "two-node" / "current").resolve().name


def _record(bed: HostBed, rank: int) -> dict[str, object]:
    return dict(json.loads((bed.hosts[rank].workdir / "two-node" / "current" / "profile.json").read_text()))


def test_smoke_of_a_nodes_profile_asks_node0_and_stops_the_group(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    junit_file = tmp_path / "smoke.xml"
    done = deploy("smoke", str(profile), "--json", "--skip-preflight", "--junit", str(junit_file),
                  home=tmp_path / "home", timeout=200)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = report_of(done.stdout)
    assert report["ok"] is True and report["exit_code"] == 0 and report["name"] == "two-node"
    assert [(p["name"], p["status"]) for p in report["phases"]] == [
        ("preflight", "passed"), ("push", "passed"), ("start", "passed"), ("ready", "passed"),
        ("request", "passed"), ("stop", "passed")], report["phases"]
    assert report["answer"] and report["model"]
    assert report["host"].endswith(bed.hosts[0].addr) or bed.hosts[0].addr in report["host"]
    suite = ET.parse(junit_file).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "deploy smoke two-node"
    assert [c.get("name") for c in suite.iter("testcase")] == ["preflight", "push", "start", "ready", "request",
                                                               "stop"]
    assert suite.get("failures") == "0"
    # the group was stopped: every node (rank 0 first, the follower with it)
    assert http_status("127.0.0.1", ports[0]) is None and http_status("127.0.0.3", ports[1]) is None
    assert state(bed, 0).get("status") == "stopped" and state(bed, 1).get("status") == "stopped"


def test_smoke_keep_leaves_the_group_serving(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    home = tmp_path / "home"
    done = deploy("smoke", str(profile), "--skip-preflight", "--keep", home=home, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "smoke two-node on" in done.stdout and "left running (--keep)" in done.stdout
    assert http_status("127.0.0.1", ports[0]) == 200 and http_status("127.0.0.3", ports[1]) == 200
    assert deploy("down", str(profile), home=home).returncode == 0


def test_rollback_brings_back_the_version_every_node_ran(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    home = tmp_path / "home"
    assert up(tmp_path, profile, "--skip-preflight").returncode == 0
    first = [_record(bed, r)["content_hash"] for r in (0, 1)]
    second = up(tmp_path, profile, "--skip-preflight", "--set", "engine.env.SMOKE_VERSION=2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert [_record(bed, r)["content_hash"] for r in (0, 1)] != first

    back = deploy("rollback", str(profile), "--json", home=home, timeout=200)
    assert back.returncode == 0, back.stderr[-3000:] + back.stdout[-3000:]
    assert report_of(back.stdout)["status"] == "ready"
    for rank in (0, 1):   # every node runs the first version again, ready, as a new attempt of the group
        record = _record(bed, rank)
        assert record["content_hash"] == first[rank], (rank, record["content_hash"], first)
        assert "SMOKE_VERSION" not in (record.get("env") or {})
        assert state(bed, rank).get("status") == "ready"
    assert http_status("127.0.0.1", ports[0]) == 200 and http_status("127.0.0.3", ports[1]) == 200
    assert deploy("down", str(profile), home=home).returncode == 0


def test_rollback_is_refused_when_no_other_version_reached_ready(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    home = tmp_path / "home"
    assert up(tmp_path, profile, "--skip-preflight").returncode == 0
    before = [_current(bed, r) for r in (0, 1)]
    back = deploy("rollback", str(profile), home=home)
    assert back.returncode == 7, back.stderr + back.stdout
    assert "two-node: no other version ever reached ready on every node; nothing to go back to" in back.stderr
    assert "Traceback" not in back.stderr
    assert [_current(bed, r) for r in (0, 1)] == before        # refused: nothing changed
    assert http_status("127.0.0.1", ports[0]) == 200
    assert deploy("down", str(profile), home=home).returncode == 0
