"""Readiness that means a token: the one-token probe's judgement, the load it reads from real /metrics captures,
the supervisor's periodic probe (`TokenWatch`) against a real HTTP server on loopback, the watcher's wait for a
token before `ready` (the scripted fake target), and the probe as supervise.json carries it."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.errors import RetriesExhausted
from deployer.profile.model import Profile
from deployer.remote.fake import EngineScript, FakeRemote
from deployer.runner.up import UpOptions, up
from deployer.supervisor.probe import NO_TOKEN, TokenWatch, generated, load_of, request_body
from deployer.box.push import supervisor_config
from waiting import wait_for

CAPTURES = Path(__file__).resolve().parents[1] / "cases" / "metrics"


def test_only_a_generated_token_counts() -> None:
    token = {"choices": [{"index": 0, "text": " hi", "finish_reason": "length"}],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    assert generated(200, json.dumps(token).encode()) is None
    # a token whose text decodes to nothing (a special token) is still a token: the usage says so
    assert generated(200, json.dumps({**token, "choices": [{"text": ""}]}).encode()) is None
    assert generated(200, json.dumps({"choices": [{"text": "x"}]}).encode()) is None
    assert "no token" in str(generated(200, json.dumps({"choices": [{"text": ""}], "usage": {}}).encode()))
    assert str(generated(503, b'{"error": "EngineDeadError"}')).startswith("HTTP 503: ")
    assert "not JSON" in str(generated(200, b"<html>"))
    assert "not a JSON object" in str(generated(200, b"[1]"))
    assert json.loads(request_body("m")) == {"model": "m", "prompt": "Hello", "max_tokens": 1, "temperature": 0}


@pytest.mark.parametrize("capture, names, before, during", [
    ("vllm-0.32.0", (["vllm:num_requests_running"], ["vllm:num_requests_waiting"]), (0.0, 0.0), (4.0, 0.0)),
    ("sglang-0.5.23", (["sglang:num_running_reqs"], ["sglang:num_queue_reqs"]), (0.0, 0.0), (1.0, 0.0)),
])
def test_load_from_real_metrics_captures(capture: str, names: tuple[list[str], list[str]],
                                         before: tuple[float, float], during: tuple[float, float] | None) -> None:
    text = (CAPTURES / capture / "before.prom").read_text()
    assert load_of(text, *names) == before
    if during is not None:
        assert load_of((CAPTURES / capture / "during.prom").read_text(), *names) == during
    assert load_of(text, ["no_such_gauge"], []) is None   # not exposed: unknown, not 0


class _Engine(http.server.BaseHTTPRequestHandler):
    """An engine whose HTTP server lives: completions answer a token, 503, or hang (`mode`); /metrics says how
    many requests run."""

    mode = "token"
    running = 0.0
    seen: list[dict[str, Any]] = []
    released = threading.Event()  # a hanging completion waits for this (set when the test ends), never answers

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        type(self).seen.append({"path": self.path, "body": body, "auth": self.headers.get("authorization")})
        if self.mode == "hang":
            type(self).released.wait(30)
            return
        if self.mode in ("dead", "dying"):
            self._send(503, b'{"error": "engine dead"}')
            return
        self._send(200, json.dumps({"choices": [{"text": " a"}], "usage": {"completion_tokens": 1}}).encode())

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._send(503 if self.mode == "dying" else 200, b"")
            return
        self._send(200, f'sglang:num_running_reqs{{tp_rank="0"}} {self.running}\n'
                        'sglang:num_queue_reqs{tp_rank="0"} 0.0\n'.encode())

    def _send(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def engine_port() -> Iterator[int]:
    _Engine.mode, _Engine.running, _Engine.seen, _Engine.released = "token", 0.0, [], threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        _Engine.released.set()
        server.shutdown()
        server.server_close()


def _watch(port: int, **extra: Any) -> TokenWatch:
    cfg = {"path": "/v1/completions", "model": "tiny", "port": port, "interval_s": 0.01, "failures": 3,
           "timeout_s": 2.0,  # a token takes ms; a loaded 2-core box may take a second; a hang never answers
           "running_metrics": ["sglang:num_running_reqs"],
           "waiting_metrics": ["sglang:num_queue_reqs"], **extra}
    return TokenWatch(cfg, {"DEPLOYER_SECRET_API_KEY": "sk-1"})


_CLOCK = [time.monotonic()]


def _next(watch: TokenWatch) -> Any:
    """The verdict of exactly one probe, started by this call: a probe started earlier (asked before the test changed
    the engine's mode) would answer for the old mode. The watch's clock is moved far ahead once, so `due` starts one
    probe and no other while this one runs or after it ends. The clock never falls behind the real one: `reset` takes
    the real time, and a suite can reach this test more than 1000 s after importing it."""
    wait_for(lambda: watch._thread is None or not watch._thread.is_alive(), "the previous probe to end", 10, 0.01)
    _CLOCK[0] = max(_CLOCK[0], time.monotonic()) + 1000.0
    assert watch.due(_CLOCK[0]), "no probe started"
    return wait_for(watch.result, "the probe's verdict", 10, 0.01)


def test_idle_failures_in_a_row_make_a_crash(engine_port: int) -> None:
    watch = _watch(engine_port, api_key_env="DEPLOYER_SECRET_API_KEY")
    watch.reset(time.monotonic())
    assert _next(watch).ok and watch.failures == 0
    assert _Engine.seen[-1] == {"path": "/v1/completions", "auth": "Bearer sk-1",
                                "body": {"model": "tiny", "prompt": "Hello", "max_tokens": 1, "temperature": 0}}
    _Engine.mode = "dead"
    for n in (1, 2):
        verdict = _next(watch)
        assert not verdict.ok and not verdict.busy and verdict.load == (0.0, 0.0)
        assert watch.failures == n and not watch.dead()
    _Engine.mode = "token"   # one token between failures: the count starts again
    assert _next(watch).ok and watch.failures == 0
    _Engine.mode = "hang"    # no answer within the probe's timeout is a failure too
    for _ in range(3):
        verdict = _next(watch)
    assert watch.dead() and "no answer to a one-token completion after" in verdict.reason


def test_failures_under_load_are_never_a_crash(engine_port: int) -> None:
    watch = _watch(engine_port)
    watch.reset(time.monotonic())
    _Engine.mode, _Engine.running = "dead", 2.0
    for _ in range(5):
        verdict = _next(watch)
        assert verdict.busy and verdict.load == (2.0, 0.0) and verdict.reason.startswith("HTTP 503")
    assert watch.failures == 0 and not watch.dead()


def test_failures_while_health_fails_too_wait_for_the_engines_own_exit(engine_port: int) -> None:
    """An engine on its way down (vLLM's dead worker: /health 503, the API server exits seconds later): its exit
    is the crash, with its own diagnosis; within exit_grace_s the probes do not make one, however many fail."""
    watch = _watch(engine_port)    # exit_grace_s: the default, 60 s
    watch.reset(time.monotonic())
    _Engine.mode = "dying"
    for n in range(1, 5):
        verdict = _next(watch)
        assert not verdict.ok and verdict.health == 503 and not verdict.answering and verdict.counts
        assert watch.failures == n and not watch.dead()
    assert watch.failing_since is not None and watch.exit_grace_s == 60.0
    assert watch.dead(watch.failing_since + 60.0) and not watch.dead(watch.failing_since + 59.0)


def test_an_engine_frozen_while_idle_whose_health_fails_for_good_is_a_crash(engine_port: int) -> None:
    """A real SGLang whose scheduler froze while idle (a .ci/run on 2026-12-05): its gauges say idle for good, its
    /health (a one-token generation of its own) answers 503, and it never exits. Once the failures in a row have
    gone on for exit_grace_s, they make the crash; a token in between starts the count and the wait again."""
    watch = _watch(engine_port, exit_grace_s=0.5)
    watch.reset(time.monotonic())
    _Engine.mode = "dying"
    for _ in range(3):
        _next(watch)
    first = watch.failing_since
    _Engine.mode = "token"
    assert _next(watch).ok and watch.failures == 0 and not watch.dead()
    _Engine.mode = "dying"
    started = time.monotonic()
    for _ in range(2000):   # bounded: ~0.5 s of probes of a few ms each
        verdict = _next(watch)
        if watch.dead():
            break
    assert watch.dead() and watch.failures >= 3 and time.monotonic() - started >= 0.5
    assert watch.failing_since is not None and first is not None and watch.failing_since > first
    assert verdict.health == 503 and verdict.load == (0.0, 0.0) and verdict.reason.startswith("HTTP 503")


def test_a_probe_of_the_engine_before_a_restart_is_dropped(engine_port: int) -> None:
    watch = _watch(engine_port)
    watch.reset(time.monotonic())
    _Engine.mode = "dead"
    assert watch.due(time.monotonic() + 1)
    time.sleep(0.3)
    watch.reset(time.monotonic())     # restarted while that probe ran
    assert watch.result() is None and watch.failures == 0


def test_off_without_an_interval() -> None:
    assert not TokenWatch({"model": "m", "port": 1, "interval_s": 0}, {}).due(time.monotonic() + 100)
    assert not TokenWatch({}, {}).enabled     # an older supervise.json: no probe key at all


def _profile(**health: Any) -> Profile:
    return Profile.model_validate({
        "name": "demo", "target": {"host": "gpu-box", "workdir": "~/deploy"},
        "engine": {"kind": "vllm", "python": "/usr/bin/python3", "model_path": "/models/tiny", "port": 30000,
                   "args": {"served_model_name": ["tiny-chat", "alias"], "api_key": "sk-x"}},
        "health": {"interval_s": 0.05, "startup_timeout_s": 20, "stall_timeout_s": 10, **health},
        "retry": {"max_attempts": 1, "backoff_s": 0}, "restart": {"grace_s": 1}})


def test_supervise_json_carries_the_probe() -> None:
    probe = supervisor_config(_profile(probe_interval_s=5, probe_failures=2))["probe"]
    assert probe == {"path": "/v1/completions", "model": "tiny-chat", "address": "127.0.0.1", "port": 30000,
                     "health_path": "/health", "interval_s": 5.0, "failures": 2, "timeout_s": 30.0, "exit_grace_s": 60.0,
                     "running_metrics": ["vllm:num_requests_running"],
                     "waiting_metrics": ["vllm:num_requests_waiting"],
                     "progress_metrics": ["vllm:iteration_tokens_total_count"],  # the hang rule's (issue 37)
                     "engine_labels": ["engine"],  # each data-parallel engine core judged alone
                     "api_key_env": "VLLM_API_KEY"}  # the key stays in the 0600 env file, in vLLM's own variable


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))


def test_up_is_ready_only_once_a_token_comes_back(home: None) -> None:
    fake = FakeRemote()
    report = up(_profile(), UpOptions(skip_preflight=True), lambda e: None, connection=fake).to_json()
    assert report["status"] == "ready"
    asked = [r for r in fake.requests if r.get("op") == "http" and r.get("path") == "/v1/completions"]
    assert asked and json.loads(__import__("base64").b64decode(asked[-1]["body_b64"]))["model"] == "tiny-chat"


def test_health_without_a_token_is_not_ready_and_says_why(home: None) -> None:
    fake = FakeRemote(engine=lambda n, record: EngineScript("loading\nApplication startup complete.\n",
                                                             generates=False))
    events: list[Any] = []
    with pytest.raises(RetriesExhausted) as failed:
        up(_profile(startup_timeout_s=1.0), UpOptions(skip_preflight=True), events.append, connection=fake)
    report = failed.value.outcome.to_json()
    assert report["status"] != "ready"
    attempt = report["attempts"][0]
    assert attempt["outcome"] == "timeout"
    said = json.dumps(attempt)
    assert NO_TOKEN in said and "HTTP 503" in said and "engine core is dead" in said
    shown = [e.line for e in events if type(e).__name__ == "Progressed" and "generated token" in (e.line or "")]
    assert len(shown) == 1 and "HTTP 503" in shown[0]   # once per reason, not once per poll
