"""The multi-node test world (issue 14): one stand-in SGLang engine spread over two hosts of tests/hostbed.py.

Each rank is started over plain ssh on its own sshd (127.0.0.2 = node-0, 127.0.0.3 = node-1), the way a
deployer will start them; these tests pin down what that world does, so multi-node deploys can be built on
it: rank 0 serves the API once every rank joined, rank 1 only a dummy health, a dead rank takes the others
down with gloo's text, and a missing or unreachable rank 0 fails with torch's real rendezvous timeouts.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from hostbed import Host, HostBed, host_bed
from waiting import wait_for
from sshbed import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STANDIN = Path(__file__).resolve().parents[1] / "standin"
MODEL = "Qwen/Qwen3-8B"
DEADLINE_S = 15.0
T = TypeVar("T")


@dataclass
class Rank:
    """One rank started over ssh: where it runs, its port, and its files in the host's workdir."""

    host: Host
    port: int
    node_rank: int

    def file(self, name: str) -> Path:
        return self.host.workdir / f"rank{self.node_rank}.{name}"

    def log(self) -> str:
        path = self.file("log")
        return path.read_text(errors="replace") if path.exists() else ""

    def rc(self) -> int | None:
        path = self.file("rc")
        text = path.read_text().strip() if path.exists() else ""
        return int(text) if text else None

    def pid(self) -> int:
        path = self.file("pid")
        return int(_wait(lambda: path.read_text().strip() if path.exists() else "", f"rank {self.node_rank}'s pid"))

    def get(self, path: str) -> int | None:
        status, _ = _get(self.host.addr, self.port, path)
        return status


def _get(addr: str, port: int, path: str) -> tuple[int | None, bytes]:
    try:
        conn = http.client.HTTPConnection(addr, port, timeout=2)
        conn.request("GET", path)
        reply = conn.getresponse()
        body = reply.read()
        conn.close()
        return reply.status, body
    except OSError:
        return None, b""


def _wait(predicate: Callable[[], T], what: str, deadline_s: float = DEADLINE_S) -> T:
    return wait_for(predicate, what, deadline_s, poll_s=0.05)


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


def start_rank(bed: HostBed, node_rank: int, dist_init_addr: str, *, tp: int = 2, extra: str = "",
               env: str = "") -> Rank:
    host = bed.hosts[node_rank]
    rank = Rank(host=host, port=free_port(host.addr), node_rank=node_rank)
    argv = (f"--model-path {MODEL} --host {host.addr} --port {rank.port} --tp-size {tp} --nnodes 2 "
            f"--node-rank {node_rank} --dist-init-addr {dist_init_addr} {extra}")
    name = f"rank{node_rank}"
    # the subshell execs into the engine, so its pid file names the engine; the rc file gets its exit status
    command = (f"cd {host.workdir} && (echo $BASHPID > {name}.pid; exec env PYTHONPATH={STANDIN} {env} "
               f"/usr/bin/python3 -m sglang.launch_server {argv}) > {name}.log 2>&1; echo $? > {name}.rc")
    bed.popen(host.alias, command, host.workdir / f"{name}.ssh.log")
    return rank


def kill(bed: HostBed, rank: Rank, signal_name: str = "KILL") -> None:
    result = bed.run(rank.host.alias, f"kill -{signal_name} {rank.pid()}")
    assert result.returncode == 0, result.stderr


def two_ranks(bed: HostBed, env: str = "", tp: int = 2) -> tuple[Rank, Rank]:
    dist_init = f"{bed.hosts[0].addr}:{free_port(bed.hosts[0].addr)}"
    rank0 = start_rank(bed, 0, dist_init, env=env, tp=tp)
    rank1 = start_rank(bed, 1, dist_init, env=env, tp=tp)
    _wait(lambda: rank0.get("/health") == 200, "rank 0 healthy")
    _wait(lambda: rank1.get("/health") == 200, "rank 1's dummy health")
    return rank0, rank1


def test_rank0_serves_the_api_and_rank1_only_a_dummy_health(bed: HostBed) -> None:
    rank0, rank1 = two_ranks(bed, tp=4)
    status, body = _get(rank0.host.addr, rank0.port, "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL
    assert [rank1.get(p) for p in ("/health", "/health_generate", "/ping")] == [200, 200, 200]
    assert rank1.get("/v1/models") == 404 and rank1.get("/model_info") == 404
    log0, log1 = rank0.log(), rank1.log()
    assert "The server is fired up and ready to roll!" in log0
    for rank0_only in ("fired up", "Uvicorn running", "Engine startup timings"):
        assert rank0_only not in log1
    assert f"Dummy health check server started in background thread at {rank1.host.addr}:{rank1.port}" in log1
    assert '"GET /health' not in log1  # the dummy server runs uvicorn at log level warning
    # each node logs its own TP ranks (node 1 holds TP2 and TP3 of tp 4), main-process lines carry no tag
    assert {"TP0", "TP1"} <= set(re.findall(r"^\[[\d\- :]+ (TP\d+)\]", log0, re.M)) and "TP2" not in log0
    assert set(re.findall(r"^\[[\d\- :]+ (TP\d+)\]", log1, re.M)) == {"TP2", "TP3"}
    assert len(re.findall(r"^\[[\d\- :]+ TP[23]\] Load weight begin", log1, re.M)) == 2
    assert re.search(r"^\[[\d\- :]+\] server_args=", log1, re.M)


def test_killing_rank1_takes_rank0_down_with_the_gloo_text(bed: HostBed) -> None:
    rank0, rank1 = two_ranks(bed)
    kill(bed, rank1)
    _wait(lambda: rank0.rc() is not None, "rank 0 to die after rank 1")
    assert rank0.rc() == 137 and rank1.rc() == 137
    log0 = rank0.log()
    assert re.search(r"^\[[\d\- :]+ TP0\] Scheduler hit an exception: Traceback", log0, re.M), log0
    assert re.search(r"RuntimeError: \[\S+/gloo/transport/tcp/pair\.cc:\d+\] Connection closed by peer "
                     rf"\[{re.escape(rank1.host.addr)}\]:\d+", log0), log0
    assert "Received sigquit from a child process. It usually means the child failed." in log0


def test_killing_rank0_takes_rank1_down_with_the_gloo_text(bed: HostBed) -> None:
    rank0, rank1 = two_ranks(bed)
    kill(bed, rank0)
    _wait(lambda: rank1.rc() is not None, "rank 1 to die after rank 0")
    assert rank1.rc() == 137 and rank1.get("/health") is None
    log1 = rank1.log()
    assert re.search(r"^\[[\d\- :]+ TP1\] Scheduler hit an exception: Traceback", log1, re.M), log1
    assert f"Connection closed by peer [{rank0.host.addr}]:" in log1


def test_sigterm_is_ignored_by_rank1_and_a_graceful_rank0_stops_both(bed: HostBed) -> None:
    rank0, rank1 = two_ranks(bed)
    kill(bed, rank1, "TERM")
    _wait(lambda: "SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq" in rank1.log(),
          "rank 1's SIGTERM warning")
    time.sleep(0.5)
    assert rank1.rc() is None and rank1.get("/health") == 200
    kill(bed, rank0, "TERM")
    _wait(lambda: rank0.rc() is not None and rank1.rc() is not None, "both ranks to stop")
    assert (rank0.rc(), rank1.rc()) == (0, 0)
    assert "Connection closed by peer" not in rank0.log() + rank1.log()


def test_rank0_can_outlive_a_dead_follower_like_sglang_3099(bed: HostBed) -> None:
    rank0, rank1 = two_ranks(bed, env="STANDIN_PEER_DEATH=stay STANDIN_PEER_DEATH_DELAY_S=0.1")
    kill(bed, rank1)
    time.sleep(1.0)
    assert rank0.rc() is None and rank0.get("/health") == 200


def test_rank0_times_out_when_rank1_never_comes(bed: HostBed) -> None:
    dist_init = f"{bed.hosts[0].addr}:{free_port(bed.hosts[0].addr)}"
    t0 = time.monotonic()
    rank0 = start_rank(bed, 0, dist_init, extra="--dist-timeout 2")
    _wait(lambda: rank0.rc() is not None, "rank 0 to give up waiting")
    assert time.monotonic() - t0 >= 3.0  # torch reports (and waits) whole seconds past the timeout
    log0 = rank0.log()
    assert ("torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. 1/2 clients joined."
            in log0), log0
    assert re.search(r"^\[[\d\- :]+ TP0\] Scheduler hit an exception", log0, re.M)
    assert rank0.rc() == 137 and rank0.get("/health") is None


def test_rank1_times_out_on_a_wrong_dist_init_address(bed: HostBed) -> None:
    wrong = f"127.0.0.9:{free_port('127.0.0.9')}"
    rank1 = start_rank(bed, 1, wrong, extra="--dist-timeout 2")
    _wait(lambda: rank1.rc() is not None, "rank 1 to give up connecting")
    log1 = rank1.log()
    port = wrong.split(":")[1]
    text = f"The client socket has timed out after 2000ms while trying to connect to (127.0.0.9, {port})."
    assert f"torch.distributed.DistNetworkError: {text}" in log1, log1
    assert re.search(rf"^\[E\d{{4}} [\d:.]+ socket\.cpp:\d+\] \[c10d\] {re.escape(text)}$", log1, re.M), log1
    assert rank1.rc() == 137 and rank1.get("/health") is None


def test_rank0_dist_init_port_taken(bed: HostBed) -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        rank0 = start_rank(bed, 0, f"{bed.hosts[0].addr}:{port}", extra="--dist-timeout 2")
        _wait(lambda: rank0.rc() is not None, "rank 0 to fail on a busy dist-init port")
    assert (f"torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            f"address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use") in rank0.log()
    assert rank0.rc() == 137
