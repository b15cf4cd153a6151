"""`deploy up` of one engine across nodes (issue 14), end to end: the real CLI, one real sshd per node
(tests/hostbed.py: 127.0.0.2 = node 0, 127.0.0.3 = node 1, rc-file-free login shells of their own), the
stand-in multi-node SGLang (rank 0 hosts the rendezvous, rank 1 serves only a dummy health and dies with
gloo's text when rank 0 dies, and vice versa).
"""

from __future__ import annotations

import http.client
import json
import socket
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import STANDIN, deploy, events
from deployer.deployments.nodes.plan import plan_nodes
from deployer.box.lock import DeploymentLock
from deployer.profile.loader import load_profile
from deployer.box.push import layout_for
from deployer.remote.connect import connect
from waiting import wait_for
from hostbed import HostBed, host_bed
from sshbed import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

STANDIN_BIN = STANDIN / "bin"


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        for host in hosts.hosts:  # each node is a GPU box: the stand-in nvidia-smi (one idle H200)
            (host.sshd.bin_dir / "nvidia-smi").symlink_to(STANDIN_BIN / "nvidia-smi")
        yield hosts


def nodes_profile(tmp_path: Path, bed: HostBed, *, env: dict[str, str] | None = None,
                  args: dict[str, Any] | None = None, restart: dict[str, Any] | None = None,
                  name: str = "two-node") -> tuple[Path, list[int]]:
    ports = [free_port(h.addr) for h in bed.hosts]
    nodes = [{**h.sshd.target(h.workdir), "engine_port": port} for h, port in zip(bed.hosts, ports)]
    data: dict[str, Any] = {
        "name": name,
        "nodes": nodes,
        "engine": {"kind": "sglang", "python": "/usr/bin/python3", "model_path": "Qwen/Qwen3-8B",
                   "port": ports[0], "args": {"tp_size": 2, **(args or {})},
                   "env": {"PYTHONPATH": str(STANDIN), **(env or {})},
                   "dist_init_port": free_port(bed.hosts[0].addr)},
        "health": {"interval_s": 0.3, "startup_timeout_s": 60, "stall_timeout_s": 30},
        "retry": {"max_attempts": 2, "backoff_s": 0.2},
        "restart": {"grace_s": 2, **(restart or {})},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, ports


def http_status(addr: str, port: int, path: str = "/health") -> int | None:
    try:
        conn = http.client.HTTPConnection(addr, port, timeout=2)
        conn.request("GET", path)
        status = conn.getresponse().status
        conn.close()
        return status
    except OSError:
        return None


def state(bed: HostBed, rank: int, name: str = "two-node") -> dict[str, Any]:
    path = bed.hosts[rank].workdir / name / "current" / "state.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def engine_pid(bed: HostBed, rank: int) -> int:
    pid = wait_for(lambda: state(bed, rank).get("pid"), f"node {rank}'s engine pid")
    return int(str(pid))


def report_of(stdout: str) -> dict[str, Any]:
    reports = [e for e in events(stdout) if e.get("event") == "report"]
    assert reports, stdout[-3000:]
    return reports[-1]


def up(tmp_path: Path, profile: Path, *extra: str, timeout: float = 150) -> Any:
    return deploy("up", str(profile), "--json", *extra, home=tmp_path / "home", timeout=timeout)


def test_up_of_two_nodes_serves_from_rank0_with_a_dummy_health_on_rank1(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    result = up(tmp_path, profile)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = report_of(result.stdout)
    assert report["status"] == "ready"
    assert [(n["node"], n["addr"], n["port"], n["nic"]) for n in report["nodes"]] == [
        (0, "127.0.0.2", ports[0], "lo"), (1, "127.0.0.3", ports[1], "lo")]
    assert http_status("127.0.0.1", ports[0], "/v1/models") == 200          # rank 0: the API, on engine.host
    assert http_status("127.0.0.3", ports[1], "/health") == 200             # rank 1: the dummy health only
    assert http_status("127.0.0.3", ports[1], "/v1/models") == 404
    # each node's run dir holds its own launch: the same engine, its own rank, node 0's rendezvous
    launch = [(h.workdir / "two-node" / "current" / "launch.sh").read_text() for h in bed.hosts]
    dist = json.loads((bed.hosts[0].workdir / "two-node" / "current" / "profile.json").read_text())
    dist_port = dist["profile"]["engine"]["dist_init_port"]
    for rank, text in enumerate(launch):
        assert f"--nnodes 2 --node-rank {rank} --dist-init-addr 127.0.0.2:{dist_port}" in text
    env1 = (bed.hosts[1].workdir / "two-node" / "current" / "env").read_text()
    assert "NCCL_SOCKET_IFNAME=lo" in env1 and "GLOO_SOCKET_IFNAME=lo" in env1
    assert state(bed, 0)["status"] == "ready" and state(bed, 1)["status"] == "ready"
    assert all(e.get("host") for e in events(result.stdout) if e.get("event") == "phase")
    # ready once the supervisors see their peers (the group's fate after `up` depends on it)
    assert state(bed, 0)["group_seen"] == [f"rank 1 at 127.0.0.3:{ports[1]}"]
    assert state(bed, 1)["group_seen"] == [f"rank 0 at 127.0.0.2:{dist_port}"]
    assert not [w for w in report["warnings"] if "cannot see" in w]
    with sqlite3.connect(tmp_path / "home" / "history.sqlite3") as db:  # the local history: a row per node
        rows = db.execute("SELECT host, attempt, outcome FROM attempts ORDER BY host").fetchall()
    assert [(r[1], r[2]) for r in rows] == [(1, "ready"), (1, "ready")]
    assert {r[0].split("@")[-1].split(":")[0] for r in rows} == {"127.0.0.2", "127.0.0.3"}


@pytest.mark.parametrize("peer_death", ["die", "hang"])
def test_a_killed_follower_restarts_the_whole_group(tmp_path: Path, bed: HostBed, peer_death: str) -> None:
    """`die`: rank 0's engine fails in its scheduler when its peer goes (gloo), each supervisor restarts its own
    rank. `hang`: no engine notices (a collective that never returns): only the supervisors' group-fate check
    takes rank 0 down and records it (peer_lost), and the group is whole again only through it. Both with the
    default restart policy (issue 22: a crash at 3 a.m. is brought back unless the profile opts out)."""
    env = {"STANDIN_PEER_DEATH": peer_death} if peer_death != "die" else None
    profile, ports = nodes_profile(tmp_path, bed, env=env, restart={"backoff_s": [0.5, 2]})
    assert up(tmp_path, profile).returncode == 0
    old0, old1 = engine_pid(bed, 0), engine_pid(bed, 1)
    killed = bed.run("node-1", f"kill -KILL {old1}")
    assert killed.returncode == 0, killed.stderr
    # after `up` has exited: the supervisors restart both ranks, and rank 0 serves again
    wait_for(lambda: state(bed, 0).get("pid") not in (None, old0) and state(bed, 1).get("pid") not in (None, old1),
             "both ranks' engines replaced", 45)
    wait_for(lambda: state(bed, 0).get("status") == "ready" and state(bed, 1).get("status") == "ready",
             "the group ready again", 45)
    s0, s1 = state(bed, 0), state(bed, 1)
    assert s0["pid"] != old0 and s1["pid"] != old1 and s0["restarts"] >= 1 and s1["restarts"] >= 1, (s0, s1)
    assert http_status("127.0.0.1", ports[0], "/v1/models") == 200
    crash0 = s0["last_crash"]
    if peer_death == "hang":  # the group restart, as its supervisor recorded it (it stopped a serving engine)
        assert crash0["peer_lost"] == f"rank 1 at 127.0.0.3:{ports[1]} stopped answering its health check", crash0
        return
    assert crash0["exit_code"] != 0 or crash0["signal"], crash0  # rank 0's engine went down with its peer
    # status names the node whose crash came first: rank 1 (SIGKILL), not rank 0 (gloo: closed by peer)
    shown = deploy("status", str(profile), "--json", home=tmp_path / "home")
    rows = {r["node"]: r for r in json.loads(shown.stdout)["members"]}
    assert (rows[1]["first_crash"], rows[0]["first_crash"]) == (True, False), shown.stdout
    assert rows[1]["last_crash_diagnosis"]["signature"] == "killed-by-signal"
    assert rows[0]["last_crash_diagnosis"]["signature"] == "peer-connection-closed"


def test_rank0_outliving_a_dead_follower_is_stopped_and_restarted(tmp_path: Path, bed: HostBed) -> None:
    """sgl-project/sglang#3099: rank 0 keeps serving after rank 1 died; its supervisor sees the follower's
    dummy health gone and takes rank 0 down too, so the restart is of the whole group."""
    profile, ports = nodes_profile(tmp_path, bed, env={"STANDIN_PEER_DEATH": "stay",
                                                       "STANDIN_PEER_DEATH_DELAY_S": "0.1"},
                                   restart={"policy": "on-failure", "backoff_s": [0.5, 2]})
    assert up(tmp_path, profile).returncode == 0
    old0 = engine_pid(bed, 0)
    assert bed.run("node-1", f"kill -KILL {engine_pid(bed, 1)}").returncode == 0
    wait_for(lambda: (state(bed, 0).get("last_crash") or {}).get("peer_lost"), "rank 0 stopped for its group", 30)
    reason = state(bed, 0)["last_crash"]["peer_lost"]
    assert f"rank 1 at 127.0.0.3:{ports[1]} stopped answering its health check" == reason
    wait_for(lambda: state(bed, 0).get("status") == "ready" and state(bed, 0).get("pid") != old0,
             "rank 0 restarted with the group", 45)
    wait_for(lambda: state(bed, 1).get("status") == "ready", "rank 1 restarted", 30)


def _python_slowed_on(bed: HostBed, rank: int, seconds: float) -> Path:
    """An engine python that starts late on one node only (weights loading late there, say). The nodes of the
    bed share one filesystem, so one file serves both; it tells the ranks apart by --node-rank."""
    wrapper: Path = bed.hosts[0].workdir.parent / "python-slow-on-node"
    wrapper.write_text(f'#!/bin/bash\ncase " $* " in *" --node-rank {rank} "*) sleep {seconds};; esac\n'
                       'exec /usr/bin/python3 "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_a_follower_that_fails_first_is_the_diagnosis(tmp_path: Path, bed: HostBed) -> None:
    """Node 0 starts late: rank 1 gives up on the rendezvous first (torch's client timeout), rank 0 would time
    out waiting for it later. The diagnosis is rank 1's, named as such."""
    profile, _ = nodes_profile(tmp_path, bed, args={"dist_timeout": 2})
    slow = _python_slowed_on(bed, 0, 6)
    result = up(tmp_path, profile, "--skip-preflight", "--no-heal", "--set", f"engine.python={slow}")
    assert result.returncode == 5, result.stderr[-3000:]
    report = report_of(result.stdout)
    diagnosis = report["attempts"][0]["diagnosis"]
    assert (diagnosis["node"], diagnosis["signature"]) == (1, "dist-init-unreachable"), diagnosis
    assert "node 1 failed first" in report["attempts"][0]["detail"]
    assert "error: " in result.stderr and "node 1 failed first" in result.stderr
    assert state(bed, 0).get("status") == "stopped" and state(bed, 1).get("status") == "exited"


def test_rank0_timing_out_at_the_rendezvous_is_diagnosed(tmp_path: Path, bed: HostBed) -> None:
    """Rank 1 never joins within --dist-timeout: rank 0's DistStoreError is the diagnosis (no rank failed
    before it), with the hint to look at the other nodes."""
    profile, _ = nodes_profile(tmp_path, bed, args={"dist_timeout": 2})
    slow = _python_slowed_on(bed, 1, 30)
    result = up(tmp_path, profile, "--skip-preflight", "--no-heal", "--set", f"engine.python={slow}")
    assert result.returncode == 5, result.stderr[-3000:]
    diagnosis = report_of(result.stdout)["attempts"][0]["diagnosis"]
    assert (diagnosis["node"], diagnosis["signature"]) == (0, "dist-init-clients-missing"), diagnosis
    assert "1/2 clients joined" in " ".join(diagnosis["evidence"])
    assert "deploy logs NAME --node N" in diagnosis["hint"]
    # the whole group is down: rank 1 (still sleeping before its start) was stopped with rank 0
    assert state(bed, 1).get("status") == "stopped"


def test_a_follower_left_hanging_by_a_dead_rank0_is_stopped_and_the_group_restarted(tmp_path: Path,
                                                                                     bed: HostBed) -> None:
    """Rank 0 dies and rank 1 does not (a collective that never returns): rank 1's supervisor sees its
    engine's rendezvous connection to node 0 close, stops the rank and restarts it with the new rank 0."""
    profile, ports = nodes_profile(tmp_path, bed, env={"STANDIN_PEER_DEATH": "hang"},
                                   restart={"policy": "on-failure", "backoff_s": [0.5, 2]})
    assert up(tmp_path, profile).returncode == 0
    old1 = engine_pid(bed, 1)
    dist = json.loads((bed.hosts[0].workdir / "two-node" / "current" / "profile.json").read_text())
    dist_port = dist["profile"]["engine"]["dist_init_port"]
    assert bed.run("node-0", f"kill -KILL {engine_pid(bed, 0)}").returncode == 0
    wait_for(lambda: (state(bed, 1).get("last_crash") or {}).get("peer_lost"), "rank 1 stopped for its group", 30)
    assert state(bed, 1)["last_crash"]["peer_lost"] == \
        f"rank 0 at 127.0.0.2:{dist_port} is gone (its rendezvous connection closed)"
    wait_for(lambda: state(bed, 0).get("status") == "ready" and state(bed, 1).get("status") == "ready"
             and state(bed, 1).get("pid") != old1, "the group ready again", 45)
    assert http_status("127.0.0.1", ports[0], "/v1/models") == 200


def _runs(bed: HostBed) -> list[Path]:
    return [p for h in bed.hosts for p in (h.workdir / "two-node" / "runs").glob("*")]


def test_a_nic_that_a_node_lacks_is_one_line_and_changes_nothing(tmp_path: Path, bed: HostBed) -> None:
    profile, _ = nodes_profile(tmp_path, bed)
    result = up(tmp_path, profile, "--set", "engine.nic=ens99")
    assert result.returncode == 4, result.stderr
    assert "engine.nic ens99: no such interface on node 0 (127.0.0.2); it has: " in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert _runs(bed) == []


def test_a_taken_dist_init_port_is_refused_before_anything_starts(tmp_path: Path, bed: HostBed) -> None:
    profile, _ = nodes_profile(tmp_path, bed)
    port = yaml.safe_load(profile.read_text())["engine"]["dist_init_port"]
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", port))
        busy.listen(1)
        result = up(tmp_path, profile)
    assert result.returncode == 4, result.stderr
    assert f"dist-init port {port} is taken on node 0 (127.0.0.2)" in result.stderr, result.stderr
    assert _runs(bed) == []


def _current(bed: HostBed) -> list[str]:
    return [(h.workdir / "two-node" / "current").resolve().name for h in bed.hosts]


def test_a_failed_replace_brings_the_serving_group_back(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    assert up(tmp_path, profile).returncode == 0
    serving = _current(bed)
    slow = _python_slowed_on(bed, 1, 30)  # the new version's rank 1 never joins: rank 0 times out
    result = up(tmp_path, profile, "--no-heal", "--set", "engine.args.dist_timeout=2",
                "--set", f"engine.python={slow}")
    assert result.returncode == 5, result.stderr[-3000:]
    report = report_of(result.stdout)
    assert report["attempts"][0]["diagnosis"]["signature"] == "dist-init-clients-missing"
    assert report["restored"]["status"] == "ready" and report["restored"]["run_id"] == serving[0]
    assert "brought back the previous version" in result.stderr and "it is serving again" in result.stderr
    assert _current(bed) == serving
    assert http_status("127.0.0.1", ports[0], "/v1/models") == 200
    # a restored follower's supervisor marks it ready on its own ready line, which may come just after rank 0's
    wait_for(lambda: [state(bed, r).get("status") for r in (0, 1)] == ["ready", "ready"], "both ranks ready", 15)
    assert state(bed, 0)["status"] == "ready" and state(bed, 1)["status"] == "ready"


def test_no_rollback_leaves_the_group_down_and_save_fixed_writes_what_worked(tmp_path: Path, bed: HostBed) -> None:
    profile, _ = nodes_profile(tmp_path, bed)
    assert up(tmp_path, profile).returncode == 0
    slow = _python_slowed_on(bed, 1, 30)
    failed = up(tmp_path, profile, "--no-heal", "--no-rollback", "--set", "engine.args.dist_timeout=2",
                "--set", f"engine.python={slow}")
    assert failed.returncode == 5 and "was not brought back (--no-rollback)" in failed.stderr, failed.stderr
    assert state(bed, 0)["status"] in ("stopped", "exited")
    fixed = tmp_path / "fixed.yaml"
    again = up(tmp_path, profile, "--save-fixed", str(fixed))
    assert again.returncode == 0, again.stderr[-2000:]
    assert report_of(again.stdout)["saved_fixed"] == str(fixed)
    saved = yaml.safe_load(fixed.read_text())
    assert saved["nodes"] == yaml.safe_load(profile.read_text())["nodes"] and "target" not in saved


def test_a_known_failure_is_healed_on_every_node(tmp_path: Path, bed: HostBed) -> None:
    """Every rank fails CUDA graph capture (the stand-in's memory model): the remedy (a lower
    --mem-fraction-static) is made once and the next attempt runs it on every node."""
    profile, _ = nodes_profile(tmp_path, bed, env={"STANDIN_MODE": "mem", "STANDIN_MAX_MFS": "0.86"},
                               args={"mem_fraction_static": 0.9})
    data = yaml.safe_load(profile.read_text())
    data["retry"]["max_attempts"] = 3
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    result = up(tmp_path, profile, "--skip-preflight")
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    report = report_of(result.stdout)
    first = report["attempts"][0]
    assert first["diagnosis"]["signature"] == "capture-cuda-graph-failed" and first["change"]
    final = float(first["change"]["args"]["mem_fraction_static"])
    assert final < 0.86 and report["attempts"][-1]["outcome"] == "ready"
    for host in bed.hosts:
        assert f"--mem-fraction-static {final:g}" in (host.workdir / "two-node" / "current" / "launch.sh").read_text()


def test_a_node_locked_by_someone_else_refuses_up_before_any_node_changes(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = nodes_profile(tmp_path, bed)
    assert up(tmp_path, profile).returncode == 0
    serving, pids = _current(bed), [engine_pid(bed, 0), engine_pid(bed, 1)]
    plans = plan_nodes(load_profile(str(profile)))
    remote = connect(bed.hosts[1].sshd.spec())
    try:
        layout = layout_for(remote, plans[1].profile)
        with DeploymentLock(remote, layout, "someone else"):
            refused = up(tmp_path, profile, "--force")
    finally:
        remote.close()
    assert refused.returncode == 4, refused.stderr
    assert "(someone else)" in refused.stderr and "Traceback" not in refused.stderr
    assert _current(bed) == serving and [engine_pid(bed, 0), engine_pid(bed, 1)] == pids
    assert _runs(bed) == [p for p in _runs(bed) if p.name in serving]  # no new run dir on any node
    assert http_status("127.0.0.1", ports[0], "/v1/models") == 200
    # node 0's lock was given back: the next command takes it at once
    assert deploy("down", str(profile), "--node", "0", home=tmp_path / "home").returncode == 0
