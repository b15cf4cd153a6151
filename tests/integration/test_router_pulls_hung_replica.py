"""A hung fleet replica pulled from the real router first, and added back once it serves again (issue 37): the real
smg (SMG_VENV) under the target-side supervisor with its `replica_watch`, in front of two step stand-ins
(tests/standin/stepengine.py, each under its own supervisor with the hang rule), no SSH. One replica's core is
frozen (STEPENGINE_FREEZE_FILE) under load: the router's watch DELETEs it from smg and records the pull; every
request sent then reaches the other; its own supervisor restarts it, and the watch POSTs it back once it serves."""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from sshbed import free_port
from test_supervise_bash import LAUNCH, make_run, start, state_of, sup, wait_for
from deployer.deployments.fleet.router_key import CONTROL_KEY_VAR
from deployer.supervisor.protocol import REPLICAS_FILE

pytestmark = pytest.mark.integration
__all__ = ["make_run"]  # the fixture, used by name

STANDIN = Path(__file__).resolve().parents[1] / "standin"
SMG = Path(os.environ.get("SMG_VENV", Path.home() / ".cache" / "deployer" / "smg-venv")) / "bin" / "smg"
KEY = "control-key-for-test"
NAMES = {"running_metrics": ["vllm:num_requests_running"], "waiting_metrics": ["vllm:num_requests_waiting"],
         "progress_metrics": ["vllm:iteration_tokens_total_count"]}
RESTART = {"policy": "on-failure", "max": 3, "backoff_s": [0.2, 0.2], "window_s": 60}
HANG_S = 2.0


def _engine(port: int) -> str:
    """The step stand-in, with the model list smg asks a worker for before it registers it (/v1/models) and its
    process's start time in /metrics (as vLLM's prometheus_client exposes it)."""
    return (f"import json, sys, time\nsys.path.insert(0, {str(STANDIN)!r})\nimport stepengine\n"
            "_get, _metrics, _started = stepengine.Handler.do_GET, stepengine.Engine.metrics, time.time()\n"
            "stepengine.Engine.metrics = lambda self: _metrics(self) + "
            "'process_start_time_seconds %r\\n' % _started\n"
            "def do_GET(self):\n"
            "    if self.path == '/v1/models':\n"
            "        self._send(200, json.dumps({'object': 'list', 'data': [{'id': 'standin'}]}).encode())\n"
            "    else:\n"
            "        _get(self)\n"
            "stepengine.Handler.do_GET = do_GET\n"
            f"sys.argv = [stepengine.__file__, '{port}']\nsys.exit(stepengine.main())\n")


def _router_engine(port: int, metrics_port: int, urls: list[str]) -> str:
    argv = [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics_port), "--policy", "round_robin", "--worker-urls", *urls]
    return (f"import os\nargv = {argv!r} + ['--control-plane-api-keys', "
            f"'deployer:deployer:admin:' + os.environ[{CONTROL_KEY_VAR!r}]]\nos.execv(argv[0], argv)\n")


@pytest.fixture()
def router_run(tmp_path: Path) -> Iterator[Callable[[str, dict[str, Any]], Path]]:
    """A router run dir where the supervisor expects it (<deployment>/runs/<id>); stopped at teardown."""
    made: list[Path] = []

    def build(engine: str, watch: dict[str, Any]) -> Path:
        run = tmp_path / "fleet-router" / "runs" / "r1"
        run.mkdir(parents=True)
        (run / "launch.sh").write_text(LAUNCH)
        (run / "launch.sh").chmod(0o700)
        (run / "engine.py").write_text(engine)
        (run / "env").write_text(f"{CONTROL_KEY_VAR}={shlex.quote(KEY)}\n")
        (run / "supervise.json").write_text(json.dumps({
            "launch": "launch.sh", "env_file": "env", "log": "engine.log", "grace_s": 2,
            "ready_pattern": "Starting router on", "restart": {"policy": "no"}, "replica_watch": watch}))
        made.append(run)
        return run

    yield build
    for run in made:
        sup("stop", str(run), "--grace", "0.5")


def _workers(port: int) -> dict[str, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/workers", headers={"authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        return {w["url"]: w for w in json.loads(reply.read())["workers"]}


def _healthy(port: int, urls: list[str]) -> bool:
    try:
        have = _workers(port)
    except OSError:
        return False
    return all(u in have and have[u]["is_healthy"] and have[u].get("status") != "draining" for u in urls)


def _complete(port: int, tokens: int, timeout: float, out: list[Any]) -> None:
    body = json.dumps({"model": "standin", "prompt": "x", "max_tokens": tokens}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            out.append(json.loads(reply.read())["usage"]["completion_tokens"])
    except (OSError, urllib.error.URLError, ValueError) as e:
        out.append(e)


def test_a_frozen_replica_is_pulled_from_the_real_router_and_added_back_once_it_serves(
        make_run: Callable[..., Path], router_run: Callable[[str, dict[str, Any]], Path], tmp_path: Path) -> None:
    if not SMG.exists():
        pytest.fail(f"no smg at {SMG}: run `make smg-venv` (README's `make test` builds it)")
    began = time.monotonic()
    freeze = tmp_path / "freeze"
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    probe = {"model": "standin", "interval_s": 0, "hang_s": HANG_S, "hang_poll_s": 0.2, **NAMES}
    replicas = [make_run(_engine(p), restart=RESTART, grace_s=2, probe={"port": p, **probe},
                         env={"STEPENGINE_FREEZE_FILE": str(freeze)} if i == 1 else {})
                for i, p in enumerate(ports)]
    for run in replicas:
        start(run)
    for run in replicas:
        wait_for(lambda: state_of(run)["status"] == "ready", 15, "replica ready")
    port, frozen = free_port(), urls[1]
    watch = {"address": "127.0.0.1", "port": port, "control_key_env": CONTROL_KEY_VAR, "hang_s": HANG_S,
             "poll_s": 0.2, "path": "/v1/completions", "model": "standin", "health_path": "/health", **NAMES}
    router = router_run(_router_engine(port, free_port(), urls), watch)
    (router.parents[1] / REPLICAS_FILE).write_text(json.dumps({"urls": urls}))   # as `up` writes it
    start(router)
    wait_for(lambda: _healthy(port, urls), 30, "both replicas healthy in smg")

    freeze.touch()                            # the second replica's core stops stepping; load through the router
    load: list[Any] = []
    for _ in range(4):                        # round robin: two each; those on the frozen replica never end
        threading.Thread(target=_complete, args=(port, 20, 30, load), daemon=True).start()
    pulled = wait_for(lambda: (state_of(router).get("pulled") or {}).get(frozen), 20, "the frozen replica pulled")
    assert pulled["why"] == "hung" and pulled["hang_s"] == HANG_S and "running" in pulled["reason"], pulled
    have = _workers(port)
    assert frozen not in have or have[frozen]["status"] == "draining", have
    after: list[Any] = []                     # the freeze still on: one reaching the frozen replica would not end
    for _ in range(8):
        _complete(port, 2, 5, after)
    assert after == [2] * 8, after

    crashed = wait_for(lambda: (state_of(replicas[1]).get("last_crash") or {}).get("hung"), 20, "replica hung")
    assert crashed["hang_s"] == HANG_S
    freeze.unlink()                           # its own supervisor restarts it; the watch asks it back
    wait_for(lambda: _healthy(port, urls) and not state_of(router).get("pulled"), 40, "the replica added back")
    assert state_of(replicas[1])["restarts"] >= 1 and state_of(replicas[0])["restarts"] == 0
    events = [json.loads(line) for line in (router.parents[1] / "lock-events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["url"]) for e in events] == [("pulled", frozen), ("added-back", frozen)], events
    assert all(e["what"] == "replica watch" for e in events)
    print(f"\npulled, 8 requests to the other, restarted and added back in {time.monotonic() - began:.1f} s")
