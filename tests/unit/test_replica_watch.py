"""The fleet router's watch of its replicas (issue 37; supervisor/replicas.py): a HangRule per replica
fed the real vLLM capture (tests/cases/metrics/vllm-0.32.0, its progress counter held or advanced) through a fake
smg and fake replicas; only the frozen replica is DELETEd, a foreign worker and a held lease are left alone, a new
engine is POSTed back once; the router's supervise.json carries the watch; `deploy status` shows the pull."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.deployments.fleet import router as router_mod
from deployer.deployments.fleet.members import fleet_of
from deployer.deployments.fleet.oncall import PULLED, _mark_in_router
from deployer.deployments.fleet.router_key import CONTROL_KEY_VAR
from deployer.operate.history import lock_event_text
from deployer.deployments.status_text import fleet_lines as status_lines
from deployer.profile.loader import load_profile
from deployer.secrets import secret_var
from deployer.supervisor.protocol import REPLICAS_FILE
from deployer.supervisor.replicas import READD_S, ReplicaWatch, pending_job

CAPTURE = Path(__file__).resolve().parents[1] / "cases" / "metrics" / "vllm-0.32.0"
ROUTER = ("127.0.0.1", 30080)
KEY, API_KEY = "control-key-1", "replica-key-1"
A, B, FOREIGN = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.9:9000"
CONFIG = {"address": ROUTER[0], "port": ROUTER[1], "control_key_env": CONTROL_KEY_VAR, "api_key_env": "API_KEY_VAR",
          "running_metrics": ["vllm:num_requests_running"], "waiting_metrics": ["vllm:num_requests_waiting"],
          "progress_metrics": ["vllm:iteration_tokens_total_count"], "engine_labels": ["engine"], "hang_s": 5.0,
          "path": "/v1/completions", "model": "tiny", "health_path": "/health"}
ENV = {CONTROL_KEY_VAR: KEY, "API_KEY_VAR": API_KEY}


def _capture(which: str, progress: float | None = None) -> str:
    """A real /metrics capture, its progress counter set to `progress` (a replica that steps, or does not)."""
    text = (CAPTURE / f"{which}.prom").read_text(encoding="utf-8")
    if progress is None:
        return text
    return re.sub(r"^(vllm:iteration_tokens_total_count\{[^}]*\}) \S+$", rf"\g<1> {progress}", text, flags=re.M)


class World:
    """A fake smg (its worker API, the control key required) and fake replicas (each /metrics a text, or None:
    the port refuses)."""

    def __init__(self, urls: list[str]) -> None:
        self.workers = {u: {"id": f"w{i}", "url": u, "is_healthy": True, "status": "healthy"}
                        for i, u in enumerate(urls)}
        self.metrics: dict[str, str | None] = {u: _capture("during", 414.0) for u in urls}
        self.health: dict[str, int] = {u: 200 for u in urls}
        self.tokens: dict[str, bool] = {u: True for u in urls}   # whether a completion gets its token
        self.refuse_delete = False
        self.listing = True                  # a POSTed worker is listed at once (False: smg's job still checks it)
        self.calls: list[tuple[str, str, str]] = []   # (where, method, path)
        self.next_id = len(urls)

    def send(self, address: str, port: int, method: str, path: str, body: bytes | None, headers: dict[str, str],
             timeout: float) -> tuple[int, bytes]:
        if (address, port) == ROUTER:
            self.calls.append(("router", method, path))
            if headers.get("authorization") != f"Bearer {KEY}":
                return 401, b'{"error": "unauthorized"}'
            return self._router(method, path, json.loads(body) if body else None)
        url = f"http://{address}:{port}"
        self.calls.append((url, method, path))
        assert headers.get("authorization") == f"Bearer {API_KEY}"
        text = self.metrics.get(url)
        if text is None:
            raise ConnectionRefusedError(111, "refused")
        if path == "/metrics":
            return 200, text.encode()
        if path == "/health":
            return self.health[url], b""
        assert path == "/v1/completions" and json.loads(body or b"{}")["max_tokens"] == 1
        if not self.tokens[url]:
            return 500, b'{"error": "no step"}'
        return 200, json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}).encode()

    def _router(self, method: str, path: str, body: Any) -> tuple[int, bytes]:
        if method == "GET" and path == "/workers":
            return 200, json.dumps({"workers": list(self.workers.values())}).encode()
        if method == "DELETE" and self.refuse_delete:
            return 403, b'{"error": "forbidden"}'
        if method == "DELETE":
            wid = path.rsplit("/", 1)[-1]
            self.workers = {u: w for u, w in self.workers.items() if w["id"] != wid}
            return 202, b"{}"
        if method == "POST" and path == "/workers":
            assert body["api_key"] == API_KEY
            if not self.listing:
                return 202, b"{}"
            self.workers[body["url"]] = {"id": f"w{self.next_id}", "url": body["url"], "is_healthy": True,
                                         "status": "healthy"}
            self.next_id += 1
            return 202, b"{}"
        raise AssertionError((method, path))

    def router_calls(self, method: str) -> list[str]:
        return [path for where, m, path in self.calls if where == "router" and m == method]


def _watch(tmp_path: Path, world: World, replicas: list[str]) -> ReplicaWatch:
    (tmp_path / REPLICAS_FILE).write_text(json.dumps({"urls": replicas}))
    return ReplicaWatch(dict(CONFIG), dict(ENV), str(tmp_path), world.send)


def _polls(watch: ReplicaWatch, world: World, start: float, end: float, steps: dict[str, float]) -> list[
        tuple[float, dict[str, Any]]]:
    """One cycle a second from `start` to `end`; each replica in `steps` advances its counter by that much."""
    events = []
    for now in range(int(start), int(end) + 1):
        for url, by in steps.items():
            world.metrics[url] = _capture("during", 414.0 + by * now)
        events += [(float(now), e) for e in watch.cycle(float(now))]
    return events


def test_of_two_replicas_only_the_frozen_one_is_deleted_at_hang_s(tmp_path: Path) -> None:
    world = World([A, B])
    watch = _watch(tmp_path, world, [A, B])
    before = _polls(watch, world, 0, 4, {A: 8.0, B: 0.0})     # B: 4 running, its counter still for 4 s
    assert before == [] and world.router_calls("DELETE") == []
    pulled = _polls(watch, world, 5, 8, {A: 8.0, B: 0.0})
    assert [(at, e["event"], e["url"]) for at, e in pulled] == [(5.0, "pulled", B)]
    assert world.router_calls("DELETE") == ["/workers/w1"] and list(world.workers) == [A]
    record = watch.pulled[B]
    assert record["why"] == "hung" and record["hang_s"] == 5.0 and "4 running" in record["reason"], record
    assert "hung" in pulled[0][1]["detail"] and B in pulled[0][1]["detail"]


def test_a_delete_the_router_refuses_is_no_pull_and_is_asked_again(tmp_path: Path) -> None:
    world = World([A, B])
    watch = _watch(tmp_path, world, [A, B])
    world.refuse_delete = True                               # e.g. 403: not done
    assert _polls(watch, world, 0, 6, {A: 8.0, B: 0.0}) == [] and watch.pulled == {}
    assert world.router_calls("DELETE") == ["/workers/w1"] * 2 and B in world.workers
    world.refuse_delete = False
    assert [e["url"] for _, e in _polls(watch, world, 7, 7, {A: 8.0, B: 0.0})] == [B]


def test_the_daemons_view_of_the_pulled_is_a_copy_taken_after_each_cycle(tmp_path: Path) -> None:
    world, watch = _pull_b(tmp_path)
    world.metrics[A] = _capture("after")
    watch._run(6.0)                                           # one cycle as the daemon's thread runs it
    events, pulled = watch.result()
    assert events == [] and list(pulled) == [B]
    pulled[B]["reason"] = "changed by the reader"
    assert watch.pulled[B]["reason"] != "changed by the reader"


def test_a_foreign_worker_and_a_held_lease_are_left_alone(tmp_path: Path) -> None:
    world = World([A, FOREIGN])
    watch = _watch(tmp_path, world, [A])   # FOREIGN was registered by someone else: not a replica of the fleet
    assert _polls(watch, world, 0, 12, {A: 8.0, FOREIGN: 0.0}) == []
    assert world.router_calls("DELETE") == [] and not any(where == FOREIGN for where, _, _ in world.calls)
    # A freezes (at its last count) while a client holds the router deployment's lease: nothing is judged or changed
    (tmp_path / "lock").write_text(json.dumps({"token": "t", "owner": "me", "expires_at": time.time() + 60}))
    world.metrics[A] = _capture("during", 414.0 + 8.0 * 12)
    asked = len(world.calls)
    assert [e for now in range(13, 31) for e in watch.cycle(float(now))] == []
    assert len(world.calls) == asked and world.router_calls("DELETE") == []
    # the lease released: the rule starts afresh (the time under the lease does not count)
    (tmp_path / "lock").write_text(json.dumps({"token": "t", "expires_at": time.time() - 1}))
    assert [e for now in range(31, 36) for e in watch.cycle(float(now))] == []
    assert [e["url"] for e in watch.cycle(36.0)] == [A]


def _pull_b(tmp_path: Path) -> tuple[World, ReplicaWatch]:
    world = World([A, B])
    watch = _watch(tmp_path, world, [A, B])
    assert [e["url"] for _, e in _polls(watch, world, 0, 5, {A: 8.0, B: 0.0})] == [B]
    return world, watch


def test_a_new_engine_is_posted_back_once_then_forgotten(tmp_path: Path) -> None:
    world, watch = _pull_b(tmp_path)
    # the hung engine answers again as it was (same counter, never gone): not a new engine, not asked back
    assert _polls(watch, world, 6, 12, {A: 8.0, B: 0.0}) == [] and world.router_calls("POST") == []
    world.metrics[A], world.metrics[B] = _capture("after"), None   # A idle; B's supervisor ended it: refused
    assert watch.cycle(13.0) == [] and world.router_calls("POST") == []
    world.metrics[B], world.health[B] = _capture("before"), 503   # a new engine, loading: /health not yet 200
    assert watch.cycle(14.0) == [] and world.router_calls("POST") == []
    world.health[B], world.tokens[B] = 200, False             # health answers, but no token comes
    assert watch.cycle(15.0) == [] and world.router_calls("POST") == []
    world.tokens[B] = True                                    # serving: health, then a one-token completion
    assert watch.cycle(20.0) == []
    assert world.router_calls("POST") == ["/workers"] and world.workers[B]["is_healthy"]
    assert (B, "POST", "/v1/completions") in world.calls
    back = watch.cycle(21.0)
    assert [(e["event"], e["url"]) for e in back] == [("added-back", B)] and watch.pulled == {}
    for now in range(22, 30):
        watch.cycle(float(now))
    assert world.router_calls("POST") == ["/workers"]         # once


def _no_start_time(text: str) -> str:
    """A capture as an engine without prometheus_client's process collector would serve it (SGLang's has none)."""
    return re.sub(r"^process_start_time_seconds .*\n", "", text, flags=re.M)


def test_an_engine_that_hung_before_its_first_step_is_new_once_it_refused(tmp_path: Path) -> None:
    world = World([A, B])
    watch = _watch(tmp_path, world, [A, B])
    world.metrics[A], world.metrics[B] = _capture("after"), _no_start_time(_capture("during", 0.0))
    assert [e["url"] for now in range(0, 6) for e in watch.cycle(float(now))] == [B]
    world.metrics[B] = _no_start_time(_capture("before"))    # idle, its counter at 0 as at the pull: same engine?
    assert watch.cycle(6.0) == [] and world.router_calls("POST") == []
    world.metrics[B] = None                                   # refused: it was ended
    assert watch.cycle(7.0) == []
    world.metrics[B] = _no_start_time(_capture("before"))    # the same figures, from a new engine
    assert watch.cycle(8.0) == [] and world.router_calls("POST") == ["/workers"]


def test_a_post_not_yet_listed_is_asked_again_every_few_seconds(tmp_path: Path) -> None:
    world, watch = _pull_b(tmp_path)
    world.metrics[A], world.metrics[B], world.listing = _capture("after"), _capture("during", 2.0), False
    assert watch.cycle(6.0) == [] and world.router_calls("POST") == ["/workers"]   # smg's job still checks it
    for now in (7.0, 8.0, 9.0, 10.0):
        assert watch.cycle(now) == []
    assert world.router_calls("POST") == ["/workers"]
    assert watch.cycle(11.0) == [] and world.router_calls("POST") == ["/workers"] * 2


def test_a_progress_counter_that_went_back_is_a_new_engine(tmp_path: Path) -> None:
    world, watch = _pull_b(tmp_path)
    world.metrics[B] = _capture("during", 2.0)                # answered all along, its counter started again
    assert watch.cycle(6.0) == [] and world.router_calls("POST") == ["/workers"]


def test_a_new_process_start_time_is_a_new_engine(tmp_path: Path) -> None:
    world, watch = _pull_b(tmp_path)
    world.metrics[B] = _capture("during", 414.0).replace("process_start_time_seconds 1.79616737614e+09",
                                                         "process_start_time_seconds 1.79616740000e+09")
    assert watch.cycle(6.0) == [] and world.router_calls("POST") == ["/workers"]   # never seen refusing


def test_a_pulled_replica_registered_again_by_another_is_forgotten_not_posted(tmp_path: Path) -> None:
    world, watch = _pull_b(tmp_path)
    world.workers[B] = {"id": "w9", "url": B, "is_healthy": True, "status": "healthy"}   # an `up` put it back
    assert [(e["event"], e["url"]) for e in watch.cycle(6.0)] == [("forgotten", B)]
    assert watch.pulled == {} and world.router_calls("POST") == []


def test_a_replica_not_back_within_the_bound_stays_pulled_and_says_so(tmp_path: Path) -> None:
    world, watch = _pull_b(tmp_path)
    world.metrics[A], world.metrics[B] = _capture("after"), None    # A idle meanwhile
    assert watch.cycle(6.0) == []
    events = watch.cycle(5.0 + READD_S + 1)
    assert [e["event"] for e in events] == ["not-back"] and "stays pulled" in events[0]["detail"]
    world.metrics[B] = _capture("before")                     # serving only now: too late, no more tries
    assert watch.cycle(5.0 + READD_S + 2) == [] and world.router_calls("POST") == []
    assert watch.pulled[B]["not_back"]


def test_a_pending_creation_job_is_deleted_and_the_worker_posted_again() -> None:
    answer = {"error": "Worker creation already in progress for URL http://x:1 with ID 6f1c-aa"}
    assert pending_job(answer) == "6f1c-aa" and pending_job({"error": "other"}) == "" and pending_job(None) == ""


def _fleet(tmp_path: Path, **health: Any) -> Any:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({
        "name": "f", "replicas": [{"host": "gpu-a"}, {"host": "gpu-b"}],
        "engine": {"kind": "vllm", "model_path": "m/tiny", "python": "/venv/bin/python", "args": {"api_key": "${K}"}},
        "health": health, "router": {"python": "/r/bin/python", "port": 8000}}))
    return load_profile(path, environ={"K": "replica-secret"})


def test_the_routers_supervise_json_carries_the_watch(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, hang_s=25)
    member = fleet_of(fleet, lambda t: {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}[t.host]).router
    assert member is not None
    watch = router_mod.router_supervise(member, fleet)["replica_watch"]
    assert watch["progress_metrics"] == ["vllm:iteration_tokens_total_count"]
    assert watch["running_metrics"] == ["vllm:num_requests_running"] and watch["hang_s"] == 25.0
    assert watch["control_key_env"] == CONTROL_KEY_VAR and watch["api_key_env"] == secret_var("router_api_key")
    assert watch["port"] == 8000 and watch["path"] == "/v1/completions"
    assert "replica-secret" not in json.dumps(watch)           # variable names only
    off = _fleet(tmp_path, hang_s="off")
    assert "replica_watch" not in router_mod.router_supervise(member, off)


def test_status_shows_a_pulled_replica_as_pulled_hung() -> None:
    record = {"at": 1.0, "why": "hung", "reason": "4 running, 0 waiting and no engine step for 5 s (hang_s 5)"}
    rows: list[dict[str, Any]] = [
        {"role": "replica", "member": "r0", "host": "a", "url": A, "status": "ready", "healthy": True},
        {"role": "replica", "member": "r1", "host": "b", "url": B, "status": "ready", "healthy": True},
        {"role": "router", "member": "router", "host": "a", "url": "http://a:8000", "status": "ready",
         "healthy": True, "worker_states": {A: "healthy"}, "pulled": {B: record}}]
    _mark_in_router(rows)
    assert rows[0]["router_health"] == "healthy" and "pulled" not in rows[0]
    assert rows[1]["router_health"] == PULLED == "pulled (hung)" and rows[1]["in_router"] is False
    assert rows[1]["pulled"] == record
    lines = status_lines({"name": "f", "serving": False, "replicas": rows[:2], "router": rows[2]})
    assert any("router: pulled (hung): 4 running" in line and "added back once it serves again" in line
               for line in lines), lines
    text = lock_event_text({"event": "pulled", "what": "replica watch", "detail": f"pulled {B} from the router"})
    assert text == f"the router's watch of its replicas: pulled {B} from the router"


@pytest.mark.parametrize("state", ["pending", "unhealthy"])
def test_a_replica_the_router_does_not_list_healthy_is_never_judged(tmp_path: Path, state: str) -> None:
    world = World([A, B])
    world.workers[B]["is_healthy"], world.workers[B]["status"] = False, state
    watch = _watch(tmp_path, world, [A, B])
    assert _polls(watch, world, 0, 12, {A: 8.0, B: 0.0}) == []
    assert world.router_calls("DELETE") == [] and not any(where == B for where, _, _ in world.calls)
