"""The one-token probe: readiness that means a generated token, not only an HTTP server that answers /health.

Owns the probe's request (a one-token completion: the engine's path and the model name it serves, as data from
the engine package), the judgement of its answer (a token, or why not), the load read from the engine's /metrics
(its running and waiting gauges, by the names the engine package gives), and `TokenWatch`: the supervisor's
periodic probe after ready, run in a thread so a hung engine never stalls the daemon's loop.

Both sides import it: deployer's watcher and smoke send the same request through the helper conversation and judge
the answer with `generated`; the daemon (daemon.py) runs `TokenWatch` on the target. Stdlib only,
Python >= 3.8.

A failed probe counts towards a crash only while the engine reports no request running or waiting: under load a
slow or failed probe is "unhealthy", never a restart (an engine whose /metrics cannot be read counts as idle:
nothing shows that it is busy). When its health endpoint fails too, the engine may be on its way down (a dead
worker: /health 503, the API server exits seconds later), and its exit, with its own diagnosis, is the crash to
judge: such failures make a crash only once they have gone on for the grace (health.probe_exit_grace_s). An engine
that never exits is not on its way down: one whose /health generates a token itself fails it while its stepping
process is frozen, and its gauges say idle for good (docs/on-call.md, "Hangs").
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

PROBE_PATH = "/v1/completions"
PROBE_PROMPT = "Hello"
METRICS_PATH = "/metrics"
METRICS_TIMEOUT_S = 5.0
REASON_MAX = 300
NO_TOKEN = "the engine's HTTP server answers but generates nothing"
# How long failed probes while /health fails too wait for the engine's own exit before they make a crash (an API
# server exits within seconds of its engine's death; a frozen engine never does).
EXIT_GRACE_S = 60.0

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def request_body(model: str) -> bytes:
    """The probe's JSON body: one token of `model` (the name the engine serves), greedy."""
    return json.dumps({"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}).encode()


def generated(status: int, body: bytes) -> Optional[str]:
    """None when the answer carries a generated token; else why not, in one line."""
    text = body[:REASON_MAX].decode("utf-8", "replace").replace("\n", " ")
    if status != 200:
        return "HTTP %d: %s" % (status, text) if text else "HTTP %d" % status
    try:
        reply = json.loads(body)
    except ValueError:
        return "an answer that is not JSON: %s" % text
    if not isinstance(reply, dict):
        return "an answer that is not a JSON object: %s" % text
    usage = reply.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 1:
        return None
    choices = reply.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    if isinstance(first.get("text"), str) and first["text"]:
        return None
    return "no token in the answer: %s" % text


def load_of(metrics: str, running: List[str], waiting: List[str]) -> Optional[Tuple[float, float]]:
    """(requests running, requests waiting) summed over every series of the given gauge names; None when the text
    has none of them (the engine does not expose them, or its metrics are off)."""
    sums = {"running": 0.0, "waiting": 0.0}
    seen = False
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name = match.group(1)
        which = "running" if name in running else "waiting" if name in waiting else None
        if which is None:
            continue
        try:
            sums[which] += float(match.group(3))
            seen = True
        except ValueError:
            continue
    return (sums["running"], sums["waiting"]) if seen else None


def exchange(address: str, port: int, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
         timeout: float) -> Tuple[int, bytes]:
    """One HTTP/1.1 exchange; raises OSError or http.client.HTTPException when nothing (whole) answers."""
    import http.client  # here, not at the top: a third of a helper start's imports, and most starts never ask

    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read(1 << 20)
    finally:
        conn.close()


class Verdict:
    """One probe's result: ok, or the reason it failed, the load the engine reported then and what its health
    endpoint said (the HTTP status; None: no answer)."""

    def __init__(self, generation: int, reason: Optional[str], load: Optional[Tuple[float, float]],
                 health: Optional[int] = 200) -> None:
        self.generation, self.reason, self.load, self.health = generation, reason, load, health

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def answering(self) -> bool:
        """The health endpoint answered 200."""
        return self.health == 200

    @property
    def busy(self) -> bool:
        return self.load is not None and (self.load[0] > 0 or self.load[1] > 0)

    @property
    def counts(self) -> bool:
        """A failure towards a crash: nothing runs or waits."""
        return not self.ok and not self.busy

    def health_said(self) -> str:
        """What /health said, for a note: "/health answers 503", "/health does not answer"."""
        return "/health does not answer" if self.health is None else "/health answers %d" % self.health


class TokenWatch:
    """The periodic probe after ready (supervise.json's "probe", see protocol.ProbeConfig).

    `due(now)` starts a probe in its own thread when the interval has passed and none is in flight; `result()`
    hands back a finished probe's Verdict once. `failures` counts failed probes in a row while the engine was idle;
    `dead()` says when that reached the configured number (and, while /health fails too, when the first of them is
    at least `exit_grace_s` old: time for an engine on its way down to exit)."""

    def __init__(self, cfg: Dict[str, Any], env: Dict[str, str]) -> None:
        self.path = str(cfg.get("path") or PROBE_PATH)
        self.model = str(cfg.get("model") or "")
        self.address = str(cfg.get("address") or "127.0.0.1")
        self.port = int(cfg.get("port") or 0)
        self.health_path = str(cfg.get("health_path") or "/health")
        self.interval_s = float(cfg.get("interval_s") or 0)
        self.limit = max(1, int(cfg.get("failures") or 3))
        self.timeout_s = float(cfg.get("timeout_s") or 30.0)
        grace = cfg.get("exit_grace_s")
        self.exit_grace_s = float(EXIT_GRACE_S if grace is None else grace)
        self.running = [str(n) for n in cfg.get("running_metrics") or []]
        self.waiting = [str(n) for n in cfg.get("waiting_metrics") or []]
        key_env = cfg.get("api_key_env")
        key = env.get(str(key_env)) if key_env else None
        self.headers = {"content-type": "application/json"}
        if key:
            self.headers["authorization"] = "Bearer " + key
        self.generation = 0
        self.failures = 0
        self.failing_since: Optional[float] = None   # monotonic time of the first of `failures`
        self.last: Optional[Verdict] = None          # the latest verdict counted
        self.next_at = 0.0
        self._thread: Optional[threading.Thread] = None
        self._done: Optional[Verdict] = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 and self.port > 0 and bool(self.model)

    def reset(self, now: float) -> None:
        """A new engine (a start or a restart): no failures yet, the first probe one interval after `now`;
        the verdict of a probe of the engine before is dropped."""
        with self._lock:
            self.generation += 1
            self.failures, self.failing_since, self.last = 0, None, None
            self.next_at = now + self.interval_s
            self._done = None

    def due(self, now: float) -> bool:
        """Starts a probe when one is due; True when it did."""
        if not self.enabled or now < self.next_at or (self._thread is not None and self._thread.is_alive()):
            return False
        self.next_at = now + self.interval_s
        self._thread = threading.Thread(target=self._probe, args=(self.generation,), daemon=True)
        self._thread.start()
        return True

    def result(self) -> Optional[Verdict]:
        """The verdict of the probe that finished since the last call (None: none did). Counts it."""
        with self._lock:
            verdict, self._done = self._done, None
        if verdict is None or verdict.generation != self.generation:
            return None
        self.failures = self.failures + 1 if verdict.counts else 0
        if self.failures == 1:
            self.failing_since = time.monotonic()
        self.last = verdict
        return verdict

    def dead(self, now: Optional[float] = None) -> bool:
        """`failures` failed idle probes in a row; while /health fails too, for at least `exit_grace_s`."""
        if self.failures < self.limit or self.last is None:
            return False
        if self.last.answering:
            return True
        since = self.failing_since if self.failing_since is not None else time.monotonic()
        return (time.monotonic() if now is None else now) - since >= self.exit_grace_s

    def _probe(self, generation: int) -> None:
        reason = self.once()
        load = None if reason is None else self.load()
        health = 200 if reason is None else self.health()
        with self._lock:
            self._done = Verdict(generation, reason, load, health)

    def health(self) -> Optional[int]:
        """The engine's health endpoint's HTTP status; None when it does not answer in METRICS_TIMEOUT_S."""
        import http.client

        try:
            status, _ = exchange(self.address, self.port, "GET", self.health_path, None, {}, METRICS_TIMEOUT_S)
        except (OSError, http.client.HTTPException):
            return None
        return status

    def once(self) -> Optional[str]:
        """One probe: None when a token came back, else why not."""
        import http.client

        started = time.monotonic()
        try:
            status, body = exchange(self.address, self.port, "POST", self.path, request_body(self.model), self.headers,
                                self.timeout_s)
        except (OSError, http.client.HTTPException) as e:
            waited = time.monotonic() - started
            return "no answer to a one-token completion after %.1f s: %s" % (waited, str(e) or type(e).__name__)
        return generated(status, body)

    def load(self) -> Optional[Tuple[float, float]]:
        """The engine's running and waiting requests from its /metrics; None when it does not say."""
        import http.client

        if not self.running and not self.waiting:
            return None
        try:
            status, body = exchange(self.address, self.port, "GET", METRICS_PATH, None, {}, METRICS_TIMEOUT_S)
        except (OSError, http.client.HTTPException):
            return None
        if status != 200:
            return None
        return load_of(body.decode("utf-8", "replace"), self.running, self.waiting)
