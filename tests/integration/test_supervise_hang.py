"""The hang rule and the draining stop, for real (issue 37): the target-side supervisor runs the step stand-in
(tests/standin/stepengine.py: an HTTP server and a forked core that steps while requests run) through its CLI,
no SSH. A core that stops stepping with requests in flight is hung: its stacks are taken into the run dir and it
is restarted like a crash; a core that is merely slow, with its slots full and a queue waiting, is never
restarted; a stop with restart.drain_s lets the requests in flight finish."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sshbed import free_port
from test_supervise_bash import READY, make_run, start, state_of, sup, wait_for
from deployer.diagnose.hangkinds import classify
from deployer.diagnose.hung import hung_diagnosis
from deployer.supervisor.hang import reading_of

pytestmark = pytest.mark.integration
__all__ = ["make_run"]  # the fixture, used by name

STEPENGINE = Path(__file__).resolve().parents[1] / "standin" / "stepengine.py"
RUNNING, WAITING, PROGRESS = ["vllm:num_requests_running"], ["vllm:num_requests_waiting"], \
    ["vllm:iteration_tokens_total_count"]
RESTART = {"policy": "on-failure", "max": 3, "backoff_s": [0.2, 0.2], "window_s": 60}


def _engine(port: int) -> str:
    return (f"import runpy, sys\nsys.argv = [{str(STEPENGINE)!r}, '{port}']\n"
            f"runpy.run_path({str(STEPENGINE)!r}, run_name='__main__')\n")


def _probe(port: int, hang_s: float) -> dict[str, Any]:
    return {"port": port, "model": "standin", "interval_s": 0, "running_metrics": RUNNING,
            "waiting_metrics": WAITING, "progress_metrics": PROGRESS, "hang_s": hang_s, "hang_poll_s": 0.2}


def _ask(port: int, tokens: int, out: list[Any]) -> None:
    body = json.dumps({"model": "standin", "prompt": "x", "max_tokens": tokens}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            out.append(json.loads(reply.read())["usage"]["completion_tokens"])
    except (OSError, urllib.error.URLError, ValueError) as e:
        out.append(e)


def _load(port: int) -> tuple[float, float, float | None] | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reading_of(reply.read().decode(), RUNNING, WAITING, PROGRESS)


def _send(port: int, tokens: int, n: int) -> tuple[list[threading.Thread], list[Any]]:
    out: list[Any] = []
    threads = [threading.Thread(target=_ask, args=(port, tokens, out), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, out


def test_a_core_that_stops_stepping_under_load_is_hung_its_stacks_kept_and_restarted(
        make_run: Callable[..., Path], tmp_path: Path) -> None:
    port, freeze = free_port(), tmp_path / "freeze"
    run = make_run(_engine(port), restart=RESTART, env={"STEPENGINE_FREEZE_FILE": str(freeze)}, grace_s=2,
                   probe=_probe(port, 2.0))
    start(run)
    first = wait_for(lambda: (lambda s: s if s["status"] == "ready" else None)(state_of(run)), 15, "ready")
    _send(port, 100000, 2)
    wait_for(lambda: (_load(port) or (0,))[0] == 2, 10, "two requests running")
    freeze.touch()
    crashed = wait_for(lambda: (state_of(run).get("last_crash") or {}).get("hung"), 20, "hung")
    freeze.unlink()
    back = wait_for(lambda: (lambda s: s if s["status"] == "ready" and s["restarts"] == 1 else None)(state_of(run)),
                    15, "restarted")
    assert back["pid"] != first["pid"] and back["hung"] is None
    # the two clients, and the watch's own nudge once it reached the engine (a free slot, no step either)
    assert crashed["running"] in (2.0, 3.0) and crashed["hang_s"] == 2.0 and crashed["stalled_s"] >= 2.0, crashed
    stacks = crashed["stacks"]
    assert stacks["file"] == "hang-stacks-0.txt" and (run / stacks["file"]).is_file()
    assert len(stacks["processes"]) == 2, stacks  # the HTTP server and its core: every process of the group
    assert all(p["top"] for p in stacks["processes"]), stacks
    found = classify(stacks)
    assert found is not None and found[0].kind == "lock", (found, stacks)  # the core waits on its Event
    diagnosis = hung_diagnosis(back["last_crash"])
    assert diagnosis is not None and diagnosis.signature == "hung" and "lock" in diagnosis.summary


def test_a_slow_core_with_a_full_queue_is_never_hung(make_run: Callable[..., Path]) -> None:
    """Steps of 0.6 s against hang_s 2: slow prefill-like steps, four running and four waiting."""
    port = free_port()
    run = make_run(_engine(port), restart=RESTART, env={"STEPENGINE_STEP_S": "0.6"}, grace_s=2,
                   probe=_probe(port, 2.0))
    start(run)
    wait_for(lambda: state_of(run)["status"] == "ready", 15, "ready")
    threads, out = _send(port, 5, 8)
    wait_for(lambda: (_load(port) or (0, 0))[1] == 4, 10, "four requests waiting")
    for t in threads:
        t.join(60)
    st = state_of(run)
    assert out == [5] * 8, out
    assert st["status"] == "ready" and st["restarts"] == 0 and st.get("hung") is None, st


def test_a_stop_with_a_drain_lets_the_requests_in_flight_finish(make_run: Callable[..., Path]) -> None:
    """restart.drain_s 6, grace 0.5: a 2 s request in flight when the stop comes still gets its answer."""
    port = free_port()
    run = make_run(_engine(port), restart={"policy": "no", "drain_s": 6}, env={"STEPENGINE_STEP_S": "0.05"},
                   grace_s=0.5)
    start(run)
    wait_for(lambda: state_of(run)["status"] == "ready", 15, "ready")
    threads, out = _send(port, 40, 2)
    wait_for(lambda: (_load(port) or (0,))[0] == 2, 10, "two requests running")
    stopped = sup("stop", str(run))
    assert stopped.returncode == 0, stopped.stderr
    for t in threads:
        t.join(10)
    assert out == [40, 40], out
    assert json.loads(stopped.stdout)["status"] == "stopped"
    assert "SIGTERM: draining 2 requests in flight" in (run / "engine.log").read_text()
    assert READY
