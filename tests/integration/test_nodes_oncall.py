"""`deploy status|logs|down PROFILE [--node N]` of one engine across nodes (issue 14): the real CLI against
one real sshd per node (tests/hostbed.py) and the stand-in multi-node engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy_helpers import deploy
from hostbed import HostBed
from test_nodes_up import bed  # noqa: F401  (the fixture: two sshd hosts with the stand-in nvidia-smi)
from test_nodes_up import http_status, nodes_profile, state, up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_status_logs_and_down_per_node(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed, args={"enable_metrics": True})
    assert up(tmp_path, profile).returncode == 0
    home = tmp_path / "home"

    shown = deploy("status", str(profile), "--json", home=home)
    assert shown.returncode == 0, shown.stderr
    group = json.loads(shown.stdout)   # one shape for every kind: the group and its members, a row per node
    assert (group["kind"], group["name"], group["serving"], group["code"]) == ("nodes", "two-node", True, 0)
    rows = group["members"]
    assert [(r["node"], r["status"], r["port"]) for r in rows] == [(0, "ready", ports[0]), (1, "ready", ports[1])]
    # serving metrics (issue 26) are node 0's engine's, the one that serves the API; node 1's row has none
    assert rows[0]["metrics"]["engine"] == "sglang" and rows[0]["metrics"]["requests_running"] == 0, rows[0]
    assert rows[1]["metrics"] is None, rows[1]
    top = deploy("top", str(profile), "--once", "--json", home=home)
    assert top.returncode == 0, top.stderr
    assert [(r["member"], r["state"], r["requests_running"]) for r in json.loads(top.stdout)["rows"]] == \
        [("node 0", "ready", 0), ("node 1", "ready", None)], top.stdout
    one = deploy("status", str(profile), "--node", "1", home=home)
    assert one.returncode == 0 and "node 1 (dummy health):" in one.stdout and "node 0" not in one.stdout

    log1 = deploy("logs", str(profile), "--node", "1", "-n", "200", home=home)
    assert log1.returncode == 0, log1.stderr
    assert f"Dummy health check server started in background thread at 127.0.0.3:{ports[1]}" in log1.stdout
    assert "fired up and ready to roll" not in log1.stdout     # rank 1 has no API
    log0 = deploy("logs", str(profile), "--node", "0", "-n", "200", home=home)
    assert "fired up and ready to roll" in log0.stdout

    for argv, message in ((["logs", str(profile)], "runs on 2 nodes: give --node N"),
                          (["status", str(profile), "--node", "5"], "--node 5: two-node has nodes 0..1"),
                          (["status", "two-node", "--host", "127.0.0.2", "--node", "0"],
                           "--node needs a profile file with nodes:")):
        bad = deploy(*argv, home=home)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    down = deploy("down", str(profile), "--json", home=home)
    assert down.returncode == 0, down.stderr
    # all ranks asked at once: rank 0's graceful shutdown ends rank 1 (exit 0, not SIGKILL after the grace)
    downed = json.loads(down.stdout)
    assert (downed["kind"], downed["was_running"], downed["stopped"]) == ("nodes", True, True), downed
    assert [(r["node"], r["status"]) for r in downed["members"]] == [(0, "stopped"), (1, "stopped")]
    assert state(bed, 1).get("exit_code") == 0 and not state(bed, 1).get("signal")
    assert http_status("127.0.0.1", ports[0]) is None and http_status("127.0.0.3", ports[1]) is None
    after = deploy("status", str(profile), home=home)
    assert after.returncode == 8, after.stdout


def test_plan_checks_every_node_and_changes_nothing(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    home = tmp_path / "home"
    shown = deploy("plan", str(profile), home=home)
    assert shown.returncode == 0, shown.stderr + shown.stdout
    assert f"node 0 {bed.hosts[0].addr}: address 127.0.0.2, nic lo, port {ports[0]}, sglang 0.5.23, 1 GPU(s)" \
        in shown.stdout, shown.stdout
    assert f"node 1 {bed.hosts[1].addr}: address 127.0.0.3, nic lo, port {ports[1]}" in shown.stdout
    as_json = json.loads(deploy("plan", str(profile), "--json", home=home).stdout)
    assert [n["node"] for n in as_json["nodes"]] == [0, 1] and as_json["problems"] == []
    assert as_json["node0"] is not None
    assert not any((h.workdir / "two-node" / "runs").exists() and any((h.workdir / "two-node" / "runs").iterdir())
                   for h in bed.hosts)
    bad = deploy("plan", str(profile), "--set", "engine.nic=ens99", home=home)
    assert bad.returncode == 4 and "engine.nic ens99: no such interface on node 0" in bad.stderr, bad.stderr


def _current(bed: HostBed, rank: int) -> str:
    return (bed.hosts[rank].workdir / "two-node" / "current").resolve().name


def test_restart_of_a_nodes_profile_replaces_every_rank_as_one_group(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    assert up(tmp_path, profile).returncode == 0
    home = tmp_path / "home"
    before = [(_current(bed, r), state(bed, r).get("pid")) for r in (0, 1)]

    again = deploy("restart", str(profile), "--json", home=home, timeout=150)
    assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-3000:]
    after = [(_current(bed, r), state(bed, r).get("pid")) for r in (0, 1)]
    for rank in (0, 1):   # a new attempt on every node, none left on the old run
        assert after[rank][0] != before[rank][0] and after[rank][1] != before[rank][1], (before, after)
        assert state(bed, rank).get("status") == "ready", state(bed, rank)
    assert http_status("127.0.0.1", ports[0]) == 200 and http_status("127.0.0.3", ports[1]) == 200

    # a restart is a new attempt of the same version: rollback has no other version to go back to (issue 23:
    # rollback and smoke of a nodes: profile are built, tests/integration/test_nodes_smoke_rollback.py)
    back = deploy("rollback", str(profile), home=home)
    assert back.returncode == 7 and "no other version ever reached ready on every node" in back.stderr, back.stderr
    assert "Traceback" not in back.stderr
    assert [_current(bed, r) for r in (0, 1)] == [a[0] for a in after]   # refused: nothing changed
    assert deploy("down", str(profile), home=home).returncode == 0
