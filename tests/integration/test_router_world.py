"""The fleet test world: the real SGLang Model Gateway (`smg` from PyPI, a Rust binary that runs on a CPU) in
front of stand-in engines on distinct loopback addresses, as deployer's fleet tests will use it (issue 14).

Proves that the stand-in speaks what the real router needs (health checks, model info, chat completions),
that the router spreads requests over the replicas, and that it notices a replica that died.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sshbed import free_port
from waiting import wait_for as _wait

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SMG_VENV = Path(os.environ.get("SMG_VENV", Path.home() / ".cache" / "deployer" / "smg-venv"))


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _chat(port: int) -> dict[str, Any]:
    body = json.dumps({"model": "Qwen/Qwen3-8B", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        data: dict[str, Any] = json.loads(reply.read())
        return data


@pytest.fixture()
def replicas(tmp_path: Path) -> Iterator[list[tuple[str, int, subprocess.Popen[bytes]]]]:
    procs = []
    try:
        for addr in ("127.0.0.2", "127.0.0.3"):
            port = free_port(addr)
            log = open(tmp_path / f"engine-{addr}.log", "wb")
            proc = subprocess.Popen(
                [sys.executable, "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--host", addr,
                 "--port", str(port)],
                env={**os.environ, "PYTHONPATH": str(REPO / "tests" / "standin")}, stdout=log,
                stderr=subprocess.STDOUT)
            procs.append((addr, port, proc))
        for addr, port, _ in procs:
            _wait(lambda: _get(f"http://{addr}:{port}/health")[0] == 200, f"stand-in on {addr}:{port}")
        yield procs
    finally:
        for _, _, proc in procs:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture()
def router(replicas: list[tuple[str, int, subprocess.Popen[bytes]]], tmp_path: Path) -> Iterator[int]:
    smg = SMG_VENV / "bin" / "smg"
    if not smg.exists():
        pytest.fail(f"no smg at {smg}: run `make smg-venv` (README's `make test` builds it)")
    port = free_port()
    urls = [f"http://{addr}:{p}" for addr, p, _ in replicas]
    log = open(tmp_path / "router.log", "wb")
    proc = subprocess.Popen([str(smg), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                             *urls, "--policy", "round_robin", "--health-check-interval-secs", "1"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: _readiness(port).get("healthy_workers") == len(urls), "every replica healthy in /readiness")
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _readiness(port: int) -> dict[str, Any]:
    status, body = _get(f"http://127.0.0.1:{port}/readiness")
    return json.loads(body) if body.startswith(b"{") else {"status": status}


def test_real_router_spreads_requests_over_standin_replicas(
        router: int, replicas: list[tuple[str, int, subprocess.Popen[bytes]]], tmp_path: Path) -> None:
    assert _readiness(router)["healthy_workers"] == 2
    answers = [_chat(router) for _ in range(6)]
    assert all(a["choices"][0]["message"]["content"] for a in answers)
    def served() -> list[int]:
        return [(tmp_path / f"engine-{addr}.log").read_text().count("POST /v1/chat/completions")
                for addr, _, _ in replicas]

    # a replica writes its access line just after its answer: wait (bounded) for the lines, never for more
    _wait(lambda: sum(served()) >= 6, "every answer's access line", 10)
    assert served() == [3, 3], served()  # round_robin: both replicas took their share


def test_real_router_notices_a_dead_replica(
        router: int, replicas: list[tuple[str, int, subprocess.Popen[bytes]]]) -> None:
    _, _, first = replicas[0]
    first.kill()
    first.wait(timeout=10)
    _wait(lambda: _readiness(router).get("healthy_workers") == 1, "the router to see one healthy worker")
    # what is left still serves through the router
    ok = 0
    for _ in range(6):
        try:
            ok += bool(_chat(router)["choices"][0]["message"]["content"])
        except OSError:
            pass
    assert ok >= 3, f"only {ok} of 6 requests got an answer with one replica down"
