"""Issue 34 finding 5, the pure parts: a pending smg creation job is replaced once the worker answers (a stand-in
for smg's worker API with its real 409 text), and fleet `status` is never 0 while the router's own readiness counts
fewer healthy workers than the fleet has replicas."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deployer.errors import Unhealthy
from deployer.deployments.fleet import router as router_mod
from deployer.deployments.fleet.oncall import _exit_code, _mark_in_router
from deployer.deployments.fleet.router_pending import pending_id
from deployer.remote.base import EndpointUnreachable, HttpReply

URL = "http://10.0.0.2:30001"
JOB = "01a24387-e47b-7775-80fb-823d150e0651"
# smg 1.13.0's answer to a POST of a URL whose creation job still waits (captured from the real binary)
IN_PROGRESS = {"error": f"Worker creation already in progress for URL '{URL}' with ID {JOB}. Poll GET /workers/{JOB}.",
               "code": "WORKER_CREATE_IN_PROGRESS"}


class PendingRouter:
    """Stand-in for smg with a creation job for URL that looks again only much later (its 30 s interval): every
    POST is 409 "in progress" until the job is deleted; then a POST is taken (and listed) at once. The worker's own
    /health answers once `answering`."""

    label = "pending-router"

    def __init__(self, answering: bool) -> None:
        self.answering, self.job, self.listed = answering, JOB, False
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, port: int, path: str, *, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 5.0, address: str = "127.0.0.1") -> Any:
        self.calls.append((method, path))
        if path == "/health" and port == 30001:
            if not self.answering:
                raise EndpointUnreachable("connection refused")
            return HttpReply(200, b"{}", {})
        if method == "GET":
            found = [{"id": "w1", "url": URL, "is_healthy": True}] if self.listed else []
            return HttpReply(200, json.dumps({"workers": found}).encode(), {})
        if method == "DELETE":
            assert path == f"/workers/{self.job}"
            self.job = ""
            return HttpReply(202, b"{}", {})
        if self.job:
            return HttpReply(409, json.dumps(IN_PROGRESS).encode(), {})
        self.listed = True
        return HttpReply(202, b"{}", {})


@pytest.fixture()
def member(tmp_path: Any) -> Any:
    from test_fleet import _profile, addr  # the unit fleet profile

    from deployer.deployments.fleet.members import fleet_of

    router = fleet_of(_profile(tmp_path), addr).router
    assert router is not None
    return router


def test_a_stale_creation_job_is_replaced_once_the_worker_answers(member: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router_mod, "CREATING_EVERY_S", 0.01)
    smg = PendingRouter(answering=True)
    router_mod.add_worker(smg, member, URL)  # type: ignore[arg-type]
    assert smg.listed and ("DELETE", f"/workers/{JOB}") in smg.calls
    assert sum(1 for c in smg.calls if c[0] == "DELETE") == 1


def test_a_job_is_left_alone_while_the_worker_does_not_answer(member: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleting it then would only start another job that waits as long: it is asked again, bounded in time."""
    monkeypatch.setattr(router_mod, "CREATING_EVERY_S", 0.01)
    smg = PendingRouter(answering=False)
    with pytest.raises(Unhealthy) as err:
        router_mod.add_worker(smg, member, URL, deadline_s=0.2)  # type: ignore[arg-type]
    assert "409" in err.value.message and not any(c[0] == "DELETE" for c in smg.calls)


def test_the_pending_job_id_is_read_from_smgs_answer() -> None:
    assert pending_id(IN_PROGRESS) == JOB
    assert pending_id({"error": "Worker already exists at URL"}) is None and pending_id(None) is None


def _rows(ready: int | None) -> list[dict[str, Any]]:
    states = {"http://a:1": "healthy", "http://b:1": "healthy"}
    router: dict[str, Any] = {"role": "router", "status": "ready", "healthy": True, "worker_states": states,
                              "foreign_workers": []}
    if ready is not None:
        router["readiness"] = {"status": "ready", "healthy_workers": ready, "total_workers": 2}
    rows = [{"role": "replica", "status": "ready", "healthy": True, "url": u} for u in states] + [router]
    _mark_in_router(rows)
    return rows


def test_status_is_never_0_while_the_routers_readiness_counts_fewer_workers_than_replicas() -> None:
    """Its worker list (read first) says both are healthy; its readiness (read next) counts one: not serving."""
    assert _exit_code(_rows(2)) == 0
    assert _exit_code(_rows(None)) == 0  # a readiness without the count says nothing more
    assert _exit_code(_rows(1)) == 9


def test_the_routers_guard_reads_the_pending_job_from_smgs_answer() -> None:
    """The guard on the router's host (stdlib) replaces a stale job the same way: the id from the real 409."""
    from deployer.supervisor.guard import _pending

    assert _pending(IN_PROGRESS) == JOB
    assert _pending({"error": f"Worker already exists at URL '{URL}' with ID {JOB}."}) == ""
    assert _pending(None) == "" and _pending({"status": "accepted"}) == ""
