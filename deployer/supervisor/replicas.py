"""The router's watch of its replicas: a fleet replica that hangs is pulled from the router before its own restart,
and added back once it serves again (issue 37; docs/fleet-router.md "A hung replica and the router").

Runs in the router's supervisor (the daemon of `<fleet>-router`), configured by supervise.json's `replica_watch`
(deployments/fleet/router.py): the replicas' engine metric names and `health.hang_s`, the router's API address, and the env
file variables that hold its control key and the replicas' API key. Every `poll_s`, in a thread of its own (a hung
replica never stalls the daemon's loop), one cycle (`ReplicaWatch.cycle`):

- nothing while a client holds the router deployment's lease (`up`, `restart`, `rollback`, a rolling restart own
  the worker set while they run; their `set_workers` supersedes any pull), and every rule starts afresh after it;
- `GET /workers` (with the control key); each worker smg lists healthy that is one of the fleet's replicas as the
  last `up` put them in the router (REPLICAS_FILE in the router's deployment dir) gets a `HangRule`
  (hang: the same rule, on the same series, as the replica's own supervisor), fed `GET <url>/metrics`;
- a replica the rule says is hung is DELETEd from smg (it stops routing to it at once; what is in flight on it is
  left to the replica's restart) and recorded as pulled (`pulled`, the daemon's state.json and a lock event);
- a pulled replica is added back once its /metrics shows a new engine (its progress went back, or it answers again
  after it did not) and it answers its health path and a one-token completion: POSTed (a pending creation job of
  smg's is deleted and the worker POSTed again, as the guard's re-add does), then forgotten once smg lists it;
  bounded by READD_S after the pull (then it stays pulled and says so). A pulled URL that someone else registered
  again (an `up`) is forgotten.

One cycle asks its replicas one after the other: one that does not answer holds the cycle up to ASK_TIMEOUT_S (and
a pulled one's one-token completion up to TOKEN_TIMEOUT_S); the rule is judged on the times of the readings, so
that delays the others' verdicts by as much, never makes one.

Workers it did not pull are never touched: a foreign worker (not a replica of the fleet) is never judged, a
draining or unhealthy one never pulled. The router's HTTP calls here are the guard's too (guard's re-add).

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple
from urllib.parse import urlsplit

from .base import UnsafePath, open_file
from .hang import HangRule, readings_of
from .lease import held, read_lease
from .probe import METRICS_PATH, exchange, generated, request_body
from .protocol import REPLICAS_FILE

POLL_S = 1.0
ASK_TIMEOUT_S = 5.0         # one /workers, /metrics or /health question
TOKEN_TIMEOUT_S = 10.0      # the one-token completion before an add-back
READD_S = 300.0             # a pulled replica is asked back this long after its pull at most
READD_EVERY_S = 5.0         # a POST not yet listed is repeated this often
WORKER_HEALTH_PATH = "/health"
START_TIME = "process_start_time_seconds"   # prometheus_client's process collector: a new process, a new value
_PENDING = re.compile(r"in progress.* with ID ([0-9A-Za-z_-]{1,128})")

# (address, port, method, path, body, headers, timeout) -> (status, body); raises OSError/HTTPException: no answer
Http = Callable[[str, int, str, str, Optional[bytes], Dict[str, str], float], Tuple[int, bytes]]


def _bearer(secret: str) -> Dict[str, str]:
    return {"authorization": "Bearer " + secret} if secret else {}


def router_ask(address: str, port: int, secret: str, method: str, path: str, body: Any = None,
               send: Http = exchange) -> Optional[Tuple[int, Any]]:
    """One request to the router's API: (HTTP status, the JSON answer or None); None when it does not answer."""
    import http.client  # on first use (deployer.supervisor.probe.exchange says why)

    headers = dict(_bearer(secret), **({"content-type": "application/json"} if body is not None else {}))
    try:
        status, data = send(address, port, method, path, json.dumps(body).encode() if body is not None else None,
                            headers, ASK_TIMEOUT_S)
    except (OSError, http.client.HTTPException):
        return None
    try:
        return status, json.loads(data or b"null")
    except ValueError:
        return status, None


def router_call(address: str, port: int, secret: str, method: str, path: str, body: Any = None,
                send: Http = exchange) -> Any:
    """One request to the router's API; the JSON answer, None when it does not answer (or not JSON)."""
    answer = router_ask(address, port, secret, method, path, body, send)
    return None if answer is None else answer[1]


def _at(url: str) -> Optional[Tuple[str, int]]:
    try:
        parts = urlsplit(url)
        return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def ask_url(url: str, method: str, path: str, body: Optional[bytes], secret: str, timeout: float,
            send: Http = exchange) -> Optional[Tuple[int, bytes]]:
    """One request to a worker at `url`; None when it does not answer."""
    import http.client

    where = _at(url)
    if where is None:
        return None
    headers = dict(_bearer(secret), **({"content-type": "application/json"} if body is not None else {}))
    try:
        return send(where[0], where[1], method, path, body, headers, timeout)
    except (OSError, http.client.HTTPException):
        return None


def worker_answers(url: str, secret: str, send: Http = exchange) -> bool:
    """Whether the worker answers its /health now (smg's job for a worker asked before it answers looks again only
    every --worker-startup-check-interval, 30 s by default: deployments/fleet/router_pending.py)."""
    answer = ask_url(url, "GET", WORKER_HEALTH_PATH, None, secret, 2.0, send)
    return answer is not None and answer[0] == 200


def pending_job(answer: Any) -> str:
    """The id of the creation job smg's 409 "creation already in progress ... with ID <id>" names, else ''."""
    found = _PENDING.search(str(answer.get("error") or "")) if isinstance(answer, dict) else None
    return found.group(1) if found else ""


def start_time(metrics: str) -> Optional[float]:
    """prometheus_client's `process_start_time_seconds` in one /metrics text (an engine's API server may expose it), else
    None."""
    for line in metrics.splitlines():
        if line.startswith(START_TIME + " "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def _state(worker: Dict[str, Any]) -> str:
    """smg's word for a worker: `draining` once removed (whatever its health), `healthy`, else its status."""
    status = str(worker.get("status") or "")
    if status == "draining":
        return status
    return "healthy" if worker.get("is_healthy") is True else status or "unhealthy"


def read_lease_at(lock: str) -> Dict[str, Any]:
    """The deployment's lease as its lock file holds it ({} when there is none)."""
    try:
        fd = open_file(lock, os.O_RDONLY, 0, "lock")
    except (OSError, UnsafePath):
        return {}
    try:
        return read_lease(fd)
    finally:
        os.close(fd)


class _Pull:
    """What the watch keeps of a replica it pulled, beside its public record."""

    def __init__(self, since: float, progress: Optional[float], started: Optional[float] = None) -> None:
        self.since = since            # monotonic time of the pull
        self.progress = progress      # the progress counters' sum at the pull
        self.started = started        # its process's start time then (process_start_time_seconds), if it says
        self.gone = False             # /metrics did not answer since the pull (its engine was ended)
        self.posted_at: Optional[float] = None
        self.posts = 0


class ReplicaWatch:
    """The router's watch of its replicas (module docstring). `cycle(now)` is one poll and returns its events
    ({"event": pulled | added-back | not-back | forgotten, "url", "detail"}); `due`/`result` run it in a thread."""

    def __init__(self, cfg: Dict[str, Any], env: Dict[str, str], deployment: str, send: Http = exchange) -> None:
        self.send = send
        self.deployment = deployment
        self.address = str(cfg.get("address") or "127.0.0.1")
        self.port = int(cfg.get("port") or 0)
        self.control = env.get(str(cfg.get("control_key_env") or ""), "")
        self.api_key = env.get(str(cfg.get("api_key_env") or ""), "")
        self.running = [str(n) for n in cfg.get("running_metrics") or []]
        self.waiting = [str(n) for n in cfg.get("waiting_metrics") or []]
        self.progress = [str(n) for n in cfg.get("progress_metrics") or []]
        self.engine_labels = [str(n) for n in cfg.get("engine_labels") or []]
        hang_s = cfg.get("hang_s")
        self.hang_s = float(hang_s) if isinstance(hang_s, (int, float)) and hang_s > 0 else None
        self.poll_s = float(cfg.get("poll_s") or POLL_S)
        self.path = str(cfg.get("path") or "/v1/completions")
        self.model = str(cfg.get("model") or "")
        self.health_path = str(cfg.get("health_path") or WORKER_HEALTH_PATH)
        self.rules: Dict[str, HangRule] = {}
        self.pulled: Dict[str, Dict[str, Any]] = {}   # url -> its record (the daemon's state.json `pulled`)
        self._pulls: Dict[str, _Pull] = {}
        self._started: Dict[str, Optional[float]] = {}   # url -> the start time its last /metrics said
        self.next_at = 0.0
        self._thread: Optional[threading.Thread] = None
        self._done: Optional[List[Dict[str, Any]]] = None
        self._pulled: Dict[str, Dict[str, Any]] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.port > 0 and bool(self.progress) and bool(self.running or self.waiting)

    # -- the daemon's side: one cycle at a time, in a thread -------------------------------------------------
    def due(self, now: float) -> bool:
        if not self.enabled or now < self.next_at or (self._thread is not None and self._thread.is_alive()):
            return False
        self.next_at = now + self.poll_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return True

    def _run(self, now: Optional[float] = None) -> None:
        events = self.cycle(time.monotonic() if now is None else now)
        pulled = {url: dict(record) for url, record in self.pulled.items()}   # copied in the cycle's thread
        with self._lock:
            self._done, self._pulled = (self._done or []) + events, pulled

    def result(self) -> Tuple[List[Dict[str, Any]], Dict[str, Dict[str, Any]]]:
        """The events of the cycles finished since the last call, and the pulled replicas after the last one."""
        with self._lock:
            done, self._done = self._done, None
            return done or [], dict(self._pulled)

    # -- one cycle ----------------------------------------------------------------------------------------------
    def cycle(self, now: float) -> List[Dict[str, Any]]:
        if held(read_lease_at(os.path.join(self.deployment, "lock")), time.time()):
            self.rules.clear()      # a client owns the worker set: nothing is judged or changed meanwhile
            return []
        listed = self.workers()
        if listed is None:
            return []
        events: List[Dict[str, Any]] = []
        for url in list(self.pulled):
            events += self._bring_back(url, listed, now)
        ours = self.replicas()
        judged = {url for url, (_, state) in listed.items() if state == "healthy" and url in ours}
        self.rules = {url: rule for url, rule in self.rules.items() if url in judged}
        for url in sorted(judged - set(self.pulled)):
            record = self._judge(url, now)
            if record is not None:
                events += self._pull(url, listed[url][0], record, now)
        return events

    def workers(self) -> Optional[Dict[str, Tuple[str, str]]]:
        """smg's workers: url -> (id, `healthy` or its status); None when it does not answer."""
        data = router_call(self.address, self.port, self.control, "GET", "/workers", send=self.send)
        if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
            return None
        return {str(w["url"]): (str(w.get("id")), _state(w))
                for w in data["workers"] if isinstance(w, dict) and isinstance(w.get("url"), str)}

    def replicas(self) -> Set[str]:
        """The fleet's replica URLs the last `up` put in the router (REPLICAS_FILE); none when it wrote none."""
        try:
            fd = open_file(os.path.join(self.deployment, REPLICAS_FILE), os.O_RDONLY, 0, "replicas")
        except (OSError, UnsafePath):
            return set()
        try:
            data = json.loads(os.read(fd, 1 << 20).decode("utf-8", "replace") or "null")
        except ValueError:
            return set()
        finally:
            os.close(fd)
        urls = data.get("urls") if isinstance(data, dict) else None
        return {str(u) for u in urls} if isinstance(urls, list) else set()

    def _metrics(self, url: str) -> Tuple[bool, Optional[Dict[str, Tuple[float, float, Optional[float]]]]]:
        """(answered, readings) of one /metrics of the replica; the engine process's start time kept (`started`)."""
        answer = ask_url(url, "GET", METRICS_PATH, None, self.api_key, ASK_TIMEOUT_S, self.send)
        if answer is None:
            return False, None
        if answer[0] != 200:
            return True, None
        text = answer[1].decode("utf-8", "replace")
        self._started[url] = start_time(text)
        return True, readings_of(text, self.running, self.waiting, self.progress, self.engine_labels)

    def _judge(self, url: str, now: float) -> Optional[Dict[str, Any]]:
        rule = self.rules.setdefault(url, HangRule(self.hang_s))
        answered, readings = self._metrics(url)
        return rule.feed(now, readings, answered)

    def _pull(self, url: str, worker_id: str, record: Dict[str, Any], now: float) -> List[Dict[str, Any]]:
        answer = router_ask(self.address, self.port, self.control, "DELETE", "/workers/" + worker_id,
                            send=self.send)
        if answer is None or answer[0] not in (200, 202, 204, 404):
            return []               # not done (no answer, refused): judged, and asked, again next poll
        rule = self.rules.pop(url, None)
        progress = [c.progress for c in rule.clocks.values() if c.progress is not None] if rule else []
        self._pulls[url] = _Pull(now, sum(progress) if progress else None, self._started.get(url))
        self.pulled[url] = {"at": time.time(), "why": "hung", "reason": record.get("reason"),
                            "stalled_s": record.get("stalled_s"), "hang_s": record.get("hang_s")}
        return [{"event": "pulled", "url": url,
                 "detail": "pulled %s from the router: hung (%s)" % (url, record.get("reason"))}]

    def _bring_back(self, url: str, listed: Dict[str, Tuple[str, str]], now: float) -> List[Dict[str, Any]]:
        pull = self._pulls.setdefault(url, _Pull(now, None))
        state = listed.get(url, ("", ""))[1]
        if url in listed and state != "draining":
            if pull.posted_at is None:   # registered again by someone else (an `up`): theirs now
                return self._forget(url, "forgotten", "%s was registered again by another; no longer pulled" % url)
            if state == "healthy":
                return self._forget(url, "added-back", "added %s back to the router: it serves again" % url)
            return []
        if self.pulled[url].get("not_back"):
            return []
        if now - pull.since > READD_S:
            self.pulled[url]["not_back"] = "not serving again within %g s of the pull" % READD_S
            return [{"event": "not-back", "url": url,
                     "detail": "%s stays pulled: %s" % (url, self.pulled[url]["not_back"])}]
        if not self._new_engine(url, pull) or state == "draining":   # read while it drains too: a refusal counts
            return []
        if pull.posted_at is not None and now - pull.posted_at < READD_EVERY_S:
            return []
        if not self._serves(url):
            return []
        body = dict({"url": url}, **({"api_key": self.api_key} if self.api_key else {}))
        stale = pending_job(router_call(self.address, self.port, self.control, "POST", "/workers", body,
                                        send=self.send))
        if stale:  # an earlier POST's job that asked before it answered: deleted, and the worker POSTed again
            router_call(self.address, self.port, self.control, "DELETE", "/workers/" + stale, send=self.send)
            router_call(self.address, self.port, self.control, "POST", "/workers", body, send=self.send)
        pull.posted_at, pull.posts = now, pull.posts + 1
        self.pulled[url]["posted_at"] = time.time()
        return []

    def _new_engine(self, url: str, pull: _Pull) -> bool:
        """Whether the replica's /metrics shows another engine than the one pulled, or one that steps again: it did
        not answer since (its engine was ended) and answers now, its process start time changed (where the engine
        exposes prometheus_client's `process_start_time_seconds`), or its progress counters moved (a new engine's
        start again; a hung one's stand still)."""
        answered, readings = self._metrics(url)
        if not answered:
            pull.gone = True
            return False
        progress = [r[2] for r in (readings or {}).values() if r[2] is not None]
        moved = bool(progress) and pull.progress is not None and sum(progress) != pull.progress
        started = self._started.get(url)
        restarted = started is not None and pull.started is not None and started != pull.started
        return pull.gone or moved or restarted

    def _serves(self, url: str) -> bool:
        """Its health path answers 200 and a one-token completion gets its token."""
        health = ask_url(url, "GET", self.health_path, None, self.api_key, ASK_TIMEOUT_S, self.send)
        if health is None or health[0] != 200:
            return False
        token = ask_url(url, "POST", self.path, request_body(self.model), self.api_key, TOKEN_TIMEOUT_S, self.send)
        return token is not None and generated(token[0], token[1]) is None

    def _forget(self, url: str, event: str, detail: str) -> List[Dict[str, Any]]:
        self.pulled.pop(url, None)
        self._pulls.pop(url, None)
        return [{"event": event, "url": url, "detail": detail}]
