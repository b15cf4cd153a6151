"""One engine across nodes (issue 14), the pure parts: per-node rendering, the network facts, the rank that
failed first, and the supervisor's group watch (against real sockets and a real HTTP server on loopback)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.engines import engine_for
from deployer.cli.main import main as cli_main
from deployer.errors import PreflightFailed, ProfileError
from deployer.deployments.nodes.diagnose import RankEnd, first_crash, first_failure, first_traceback_at
from deployer.deployments.nodes.net import decide, parse_net
from deployer.deployments.nodes.plan import NodeNet, group_config, plan_nodes, supervisor_overrides
from deployer.deployments.nodes.checks import compare
from deployer.deployments.nodes.watch import NodeSession
from deployer.preflight.facts import Facts, Gpu, ModelFiles
from deployer.profile.loader import load_profile
from deployer.render.bundle import render
from deployer.supervisor.group import GroupWatch

PROFILE: dict[str, Any] = {
    "name": "llama-405b-2node",
    "nodes": [{"host": "node-0"}, {"host": "node-1", "gpus": [0, 1, 2, 3]}, {"host": "node-2", "engine_port": 31000}],
    "engine": {"model_path": "meta-llama/Llama-3.1-405B", "args": {"tp_size": 16}, "dist_init_port": 20000},
}


def load(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile(str(path))


def test_each_node_gets_its_rank_the_rendezvous_and_its_nic(tmp_path: Path) -> None:
    profile = load(tmp_path, PROFILE)
    nets = [NodeNet("10.0.0.10", "ens5"), NodeNet("10.0.0.11", "ens6"), NodeNet("10.0.0.12", "ens5")]
    plans = plan_nodes(profile, nets)
    argvs = [render(p.profile).argv for p in plans]
    for rank, argv in enumerate(argvs):
        text = " ".join(argv)
        assert f"--tp-size 16 --nnodes 3 --node-rank {rank} --dist-init-addr 10.0.0.10:20000" in text
    assert argvs[0][argvs[0].index("--host") + 1] == "127.0.0.1"      # rank 0: the API where engine.host says
    assert argvs[1][argvs[1].index("--host") + 1] == "10.0.0.11"      # followers: their own address
    assert [p.port for p in plans] == [30000, 30000, 31000]
    envs = [render(p.profile).masked_env for p in plans]
    assert envs[1] == {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "GLOO_SOCKET_IFNAME": "ens6", "NCCL_SOCKET_IFNAME": "ens6"}
    assert envs[0]["NCCL_SOCKET_IFNAME"] == "ens5" and "CUDA_VISIBLE_DEVICES" not in envs[0]
    assert all(p.profile.nodes is None and not p.profile.is_fleet for p in plans)  # single-host profiles
    assert [p.profile.target.host for p in plans] == ["node-0", "node-1", "node-2"]


def test_a_nic_set_in_the_profile_env_wins_and_ipv6_is_bracketed(tmp_path: Path) -> None:
    data = {**PROFILE, "engine": {**PROFILE["engine"], "env": {"NCCL_SOCKET_IFNAME": "ib0"}}}
    plans = plan_nodes(load(tmp_path, data), [NodeNet("fd00::1", "eth0")] * 3)
    env = render(plans[2].profile).masked_env
    assert env["NCCL_SOCKET_IFNAME"] == "ib0" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert "--dist-init-addr [fd00::1]:20000" in " ".join(render(plans[1].profile).argv)


def test_multinode_flags_by_hand_and_an_engine_without_them_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="engine.args.node_rank is set per node from nodes:"):
        plan_nodes(load(tmp_path, {**PROFILE, "engine": {**PROFILE["engine"], "args": {"node_rank": 1}}}))
    with pytest.raises(ProfileError, match="one vllm engine across nodes is not supported"):
        plan_nodes(load(tmp_path, {**PROFILE, "engine": {**PROFILE["engine"], "kind": "vllm"}}))


def test_two_nodes_on_one_host_and_workdir_are_refused(tmp_path: Path) -> None:
    data = {**PROFILE, "nodes": [{"host": "node-0"}, {"host": "node-1"}, {"host": "node-0"}]}
    with pytest.raises(ProfileError, match="nodes 0 and 2 are the same host and workdir"):
        plan_nodes(load(tmp_path, data))
    data["nodes"][2] = {"host": "node-0", "workdir": "/workspace/second"}
    assert len(plan_nodes(load(tmp_path, data))) == 3


def test_deploy_render_shows_every_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**PROFILE, "engine": {**PROFILE["engine"], "nic": "ens5"}}))
    with pytest.raises(SystemExit) as done:
        cli_main(["render", str(path)])
    out = capsys.readouterr().out
    assert done.value.code == 0
    for rank in range(3):
        assert f"--nnodes 3 --node-rank {rank} --dist-init-addr node-0:20000" in out
    assert out.count("# env file: ") == 3 and "NCCL_SOCKET_IFNAME=ens5" in out


def test_group_config_leader_watches_followers_and_followers_the_rendezvous(tmp_path: Path) -> None:
    plans = plan_nodes(load(tmp_path, PROFILE), [NodeNet("10.0.0.10", "ens5"), NodeNet("10.0.0.11", "ens5"),
                                                 NodeNet("10.0.0.12", "ens5")])
    leader = group_config(plans, 0, 2.0)
    assert leader["role"] == "leader"
    assert [(f["rank"], f["addr"], f["port"]) for f in leader["followers"]] == [(1, "10.0.0.11", 30000),
                                                                               (2, "10.0.0.12", 31000)]
    follower = supervisor_overrides(plans, 2, 2.0)
    assert follower["group"]["leader"] == {"addr": "10.0.0.10", "port": 20000}
    assert follower["ready_pattern"] == "Dummy health check server started in background thread at"
    assert "ready_pattern" not in supervisor_overrides(plans, 0, 2.0)


# --- network facts ----------------------------------------------------------------------------------------------

NODE0 = """@@ssh 10.1.1.5 52000 10.0.0.10 22
@@tz +0100
@@has-ip
@@addr 1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
@@addr 2: eth0    inet 192.168.7.3/24 brd 192.168.7.255 scope global eth0
@@addr 3: ens5    inet 10.0.0.10/24 brd 10.0.0.255 scope global ens5
"""
NODE1 = """@@ssh 10.1.1.5 52001 192.168.7.4 22
@@tz +0100
@@has-ip
@@addr 1: lo    inet 127.0.0.1/8 scope host lo
@@addr 2: eth0    inet 192.168.7.4/24 scope global eth0
@@addr 3: ens6    inet 10.0.0.11/24 scope global ens6
@@route 10.0.0.10 dev ens6 src 10.0.0.11 uid 0 \\    cache
"""


def test_the_nic_is_the_one_holding_node0s_address_and_the_followers_route_to_it() -> None:
    facts = [parse_net(NODE0), parse_net(NODE1)]
    assert facts[0].utc_offset_s == 3600
    nets = decide(facts, "10.0.0.10", ["node-0", "node-1"], None)
    # node 1 was reached over SSH on eth0, but its route to node 0 is ens6: that interface and its address
    assert nets == [NodeNet("10.0.0.10", "ens5"), NodeNet("10.0.0.11", "ens6")]


def test_loopback_is_refused_unless_every_node_is_on_loopback() -> None:
    looped = NODE1.replace("@@route 10.0.0.10 dev ens6 src 10.0.0.11", "@@route 10.0.0.10 dev lo src 127.0.0.1")
    with pytest.raises(PreflightFailed, match="over the loopback interface lo"):
        decide([parse_net(NODE0), parse_net(looped)], "10.0.0.10", ["node-0", "node-1"], None)
    bed0 = "@@ssh 127.0.0.1 5 127.0.0.2 22\n@@has-ip\n@@addr 1: lo    inet 127.0.0.1/8 scope host lo\n"
    bed1 = ("@@ssh 127.0.0.1 6 127.0.0.3 22\n@@has-ip\n@@addr 1: lo    inet 127.0.0.1/8 scope host lo\n"
            "@@route local 127.0.0.2 dev lo table local src 127.0.0.1 uid 0\n")
    assert decide([parse_net(bed0), parse_net(bed1)], "127.0.0.2", ["a", "b"], None) == \
        [NodeNet("127.0.0.2", "lo"), NodeNet("127.0.0.3", "lo")]


def test_a_given_nic_must_exist_on_every_node() -> None:
    with pytest.raises(PreflightFailed, match=r"engine.nic ens5: no such interface on node 1 \(node-1\); it has: "
                                              r"ens6, eth0, lo"):
        decide([parse_net(NODE0), parse_net(NODE1)], "10.0.0.10", ["node-0", "node-1"], "ens5")


# --- the rank that failed first --------------------------------------------------------------------------------

GLOO = ("[{t} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 2900, in run_scheduler_process\n'
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[10.0.0.11]:41234\n"
        "[{t}] Received sigquit from a child process. It usually means the child failed.\n")
CLIENT = ("[{t} TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
          '  File "x.py", line 1, in f\n'
          "torch.distributed.DistNetworkError: The client socket has timed out after 2000ms while trying to "
          "connect to (10.0.0.10, 20000).\n")


def epoch(stamp: str, offset: int = 0) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) - time.timezone - offset  # as UTC


def test_a_consequence_one_second_earlier_in_whole_seconds_yields_to_the_rank_that_failed() -> None:
    # rank 1 was SIGKILLed at :10.6 (its supervisor's exact time); rank 0's gloo traceback is stamped :10
    died = epoch("2026-12-01 05:00:10") + 0.6
    killed: dict[str, Any] = {"status": "exited", "ended_at": died, "signal": 9, "exit_code": None,
                              "last_crash": {"signal": 9, "exit_code": None}}
    ends = [RankEnd(0, GLOO.format(t="2026-12-01 05:00:10"), {"status": "exited", "ended_at": died + 1,
                                                               "last_crash": {"exit_code": 137}}),
            RankEnd(1, "[2026-12-01 05:00:01 TP1] Load weight end.\n", killed)]
    first = first_failure(ends, version="0.5.23", engine=engine_for("sglang"))
    assert first is not None and first.rank == 1 and first.diagnosis.signature == "killed-by-signal"
    alone = first_failure(ends[:1], version="0.5.23", engine=engine_for("sglang"))
    assert alone is not None and alone.diagnosis.signature == "peer-connection-closed" and alone.consequence


def test_the_earliest_own_failure_wins_across_time_zones() -> None:
    # node 1 logs in UTC+1: its 06:00:03 is 05:00:03 UTC, before node 0's own failure at 05:00:05 UTC
    ends = [RankEnd(0, CLIENT.format(t="2026-12-01 05:00:05"), {"status": "exited"}),
            RankEnd(1, CLIENT.format(t="2026-12-01 06:00:03"), {"status": "exited"}, utc_offset_s=3600)]
    first = first_failure(ends, version=None, engine=engine_for("sglang"))
    assert first is not None and (first.rank, first.diagnosis.signature) == (1, "dist-init-unreachable")
    assert first_traceback_at(ends[1].log, 3600) == epoch("2026-12-01 05:00:03")


def test_a_rank_stopped_for_its_group_is_never_the_cause() -> None:
    lost = {"status": "exited", "peer_lost": {"at": 100.0, "reason": "rank 1 at 10.0.0.11:30000 stopped answering"}}
    stopped = {"status": "stopped", "ended_at": 99.0}  # stopped by deployer: not a failure of its own
    first = first_failure([RankEnd(0, "", lost), RankEnd(1, "", stopped)], version=None, engine=engine_for("sglang"))
    assert first is not None and first.rank == 0 and first.diagnosis.signature == "group-peer-lost"
    assert first_failure([RankEnd(1, "", stopped)], version=None, engine=engine_for("sglang")) is None


# --- the supervisor's group watch -------------------------------------------------------------------------------

class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _lost_within(watch: GroupWatch, pgid: int | None, seconds: float) -> str | None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lost = watch.lost(pgid)
        if lost:
            return lost
        time.sleep(0.02)
    return None


def test_the_leader_calls_a_follower_lost_only_after_it_answered_and_then_stopped() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    never = socket.socket()
    never.bind(("127.0.0.1", 0))
    silent_port = never.getsockname()[1]
    never.close()
    watch = GroupWatch({"role": "leader", "every_s": 0.1, "misses": 2,
                        "followers": [{"rank": 1, "addr": "127.0.0.1", "port": port, "path": "/health"},
                                      {"rank": 2, "addr": "127.0.0.1", "port": silent_port, "path": "/health"}]})
    assert _lost_within(watch, None, 0.6) is None  # rank 2 never answered: not called lost (blind, not broken)
    server.shutdown()
    server.server_close()
    assert _lost_within(watch, None, 2.0) == f"rank 1 at 127.0.0.1:{port} stopped answering its health check"


def test_a_follower_sees_its_engines_rendezvous_connection_close() -> None:
    store = socket.socket()
    store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    store.bind(("127.0.0.1", 0))
    store.listen(4)
    port = store.getsockname()[1]
    # the "engine": its own process group, holding a connection to the rendezvous port
    engine = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                               f"c = socket.create_connection(('127.0.0.1', {port})); print('up', flush=True)\n"
                               "sys.stdin.read(); time.sleep(30)"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert engine.stdout is not None and engine.stdout.readline().strip() == b"up"
        peer, _ = store.accept()
        watch = GroupWatch({"role": "follower", "every_s": 0.05, "misses": 2,
                            "leader": {"addr": "127.0.0.1", "port": port}})
        assert _lost_within(watch, os.getpgid(engine.pid), 0.4) is None
        assert f"rank 0 at 127.0.0.1:{port}" in watch.seen
        peer.close()  # rank 0 is gone: the follower's end of the connection leaves ESTABLISHED
        assert _lost_within(watch, os.getpgid(engine.pid), 2.0) == \
            f"rank 0 at 127.0.0.1:{port} is gone (its rendezvous connection closed)"
    finally:
        engine.kill()
        engine.wait(timeout=10)
        store.close()


# --- cross-node preflight ----------------------------------------------------------------------------------------

def _facts(version: str | None, gpus: int, *, port_free: bool = True, model_error: str | None = None) -> Facts:
    model = ModelFiles(dir="/models/llama", error=model_error) if model_error is not None else \
        ModelFiles(dir="/models/llama", config={"architectures": ["LlamaForCausalLM"]})
    return Facts(gpus=[Gpu(i, "NVIDIA H200", f"GPU-{i}", 143771, 0, 143771) for i in range(gpus)],
                 engine_version=version, port_free=port_free, model=model)


def test_nodes_must_agree_on_engine_version_gpu_count_model_and_free_ports(tmp_path: Path) -> None:
    data = {**PROFILE, "nodes": PROFILE["nodes"][:2] + [{"host": "node-2"}],
            "engine": {**PROFILE["engine"], "model_path": "/models/llama"}}
    plans = plan_nodes(load(tmp_path, data))
    sessions = [NodeSession(plan=p, remote=None, layout=None) for p in plans]  # type: ignore[arg-type]
    same = [_facts("0.5.23", 4), _facts("0.5.23", 8), _facts("0.5.23", 4)]
    assert compare(sessions, plans, same, lenient=False) == []   # node 1 uses 4 of its 8 GPUs (gpus: [0..3])
    problems = compare(sessions, plans, [_facts("0.5.23", 4), _facts("0.5.22", 4),
                                          _facts("0.5.23", 2, port_free=False, model_error="no config.json")],
                        lenient=False)
    assert problems == [
        "engine versions differ: node 0 (node-0) 0.5.23, node 1 (node-1) 0.5.22, node 2 (node-2) 0.5.23",
        "GPU counts differ: node 0 (node-0) 4, node 1 (node-1) 4, node 2 (node-2) 2",
        "model /models/llama on node 2 (node-2): no config.json",
        "port 30000 is taken on node 2 (node-2)"]
    missing = compare(sessions, plans, [_facts("0.5.23", 4), _facts(None, 4), _facts("0.5.23", 4)], lenient=True)
    assert missing == ["no sglang found by python3 on node 1 (node-1)"]


def test_status_names_the_node_whose_crash_came_first_in_the_latest_fall() -> None:
    crashes: dict[int, tuple[dict[str, Any], str | None]] = {
        0: ({"at": 1000.4, "exit_code": 137}, "peer-connection-closed"),  # gloo: its peer went away
        1: ({"at": 1000.9, "signal": 9}, None),                         # killed: on its own
        2: ({"at": 400.0, "exit_code": 1}, "cuda-oom")}                 # an older fall: not this one
    assert first_crash(crashes, engine_for("sglang")) == 1
    crashes[0] = ({"at": 1000.4, "exit_code": 0, "peer_lost": "rank 1 ... stopped answering"}, None)
    assert first_crash(crashes, engine_for("sglang")) == 1
    assert first_crash({0: ({"at": 5.0}, "cuda-oom"), 1: ({"at": 9.0}, None)}, engine_for("sglang")) == 0
