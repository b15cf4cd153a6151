"""`top`: one row per engine of a deployment (a single host's deployment, each replica of a fleet and its router,
each node of a node group), read from its status report: state, requests, tokens/s, KV cache, p99 latencies,
restarts. The rows of every kind come from the same status rows, so `top` needs nothing a kind does not already
answer in `status`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from deployer.deployments.reports import (
    FleetStatus, HostStatus, NodeStatus, Row, StatusReport, fleet_member_rows,
)


@dataclass(frozen=True)
class TopRow:
    """One engine (or router) as `top` shows it; a number the engine does not expose (or that needs a second
    look, the rates) is None."""

    deployment: str
    member: str                       # the deployment's name, `r0`.. / `router` of a fleet, `node N` of a group
    host: str
    state: str
    healthy: bool
    restarts: int | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    kv_cache_usage: float | None = None
    ttft_p99_s: float | None = None
    e2e_p99_s: float | None = None
    error: str | None = None
    metrics_off: bool = False         # the engine runs with its /metrics series off: not asked (`error` says why)

    @classmethod
    def of(cls, deployment: str, member: str, row: Row) -> TopRow:
        metrics = row.get("metrics") or {}
        return cls(deployment=deployment, member=member, host=str(row.get("alias") or row.get("host") or ""),
                   state=str(row.get("status") or "unknown"), healthy=bool(row.get("healthy")),
                   restarts=row.get("restarts"),
                   requests_running=metrics.get("requests_running"), requests_waiting=metrics.get("requests_waiting"),
                   generation_tokens_per_s=metrics.get("generation_tokens_per_s"),
                   prompt_tokens_per_s=metrics.get("prompt_tokens_per_s"),
                   kv_cache_usage=metrics.get("kv_cache_usage"),
                   ttft_p99_s=_p99(metrics, "time_to_first_token"), e2e_p99_s=_p99(metrics, "e2e_latency"),
                   error=row.get("error") or metrics.get("error"), metrics_off=bool(metrics.get("off")))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _p99(metrics: dict[str, Any], quantity: str) -> float | None:
    found = metrics.get(quantity)
    return found.get("p99_s") if isinstance(found, dict) else None


@dataclass(frozen=True)
class TopReport:
    """The rows of one deployment at one look, and the exit code its status gave."""

    rows: list[TopRow]
    exit_code: int
    nothing_found: str | None = None  # a host-wide look that found nothing: where it looked

    @classmethod
    def of(cls, name: str | None, status: StatusReport) -> TopReport:
        return cls(_rows(name, status), status.exit_code,
                   status.nothing_found if isinstance(status, HostStatus) else None)

    def to_json(self) -> Any:
        return [row.to_json() for row in self.rows]


def _rows(name: str | None, status: StatusReport) -> list[TopRow]:
    if isinstance(status, FleetStatus):
        name = str(status.data.get("name"))
        return [TopRow.of(name, str(r.get("member")), r) for r in fleet_member_rows(status.data)]
    if isinstance(status, NodeStatus):
        return [TopRow.of(name or r.name, f"node {r.node.rank if r.node else '?'}", r.to_json()) for r in status.rows]
    assert isinstance(status, HostStatus)
    return [TopRow.of(r.name, r.name, r.to_json()) for r in status.rows]
