"""On-call for a fleet: status of every replica and the router, down of all, logs of one member.

Each member is a deployment of its own on its host, read with the single-host on-call functions; hosts are asked
at once (fan-out). Each replica is reported by the router's own health of it (`router_health`: healthy, the
router's status of it, `pulled (hung)` while the router's watch holds it out (replicas), or `not
registered`). `status` exits 0 only while every member serves and every replica is
one of the router's healthy workers; 9 (partly) while the router serves through at least one replica but not every
member serves or a replica is out of the router; otherwise the most urgent code of the members. A worker of the
router that is not one of the fleet's replicas (`foreign_workers`: someone else registered it, and the router sends
it prompts) is an alarm: exit 6 (not serving as deployed), unless a more urgent code (5, 7, 8, a connection's)
already applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deployer.errors import DeployError, NotFound, PartlyFailed, ProfileError
from deployer.runner.fanout import TaggedSink, fan_out
from deployer.deployments.fleet.members import Fleet
from deployer.remote.connect import spec_of
from deployer.deployments.fleet.router import readiness, workers
from deployer.deployments.fleet.router_key import keyed
from deployer.operate import deployment as ops
from deployer.operate.deployment import Ref
from deployer.profile.model import Target
from deployer.remote.connect import conversing
from deployer.events import Event, EventSink, Warn

HEALTHY = "healthy"
NOT_REGISTERED = "not registered"
PULLED = "pulled (hung)"   # the router's watch took it out (supervisor/replicas.py)


@dataclass(frozen=True)
class Member:
    """One deployment of the fleet, as on-call sees it."""

    role: str            # replica | router
    index: int | None
    name: str
    target: Target
    url: str

    @property
    def tag(self) -> str:
        return "router" if self.role == "router" else f"r{self.index}"

    @property
    def host(self) -> str:
        return self.target.host


def members(fleet: Fleet) -> list[Member]:
    out = [Member("replica", r.index, r.name, r.profile.target, r.url) for r in fleet.replicas]
    if fleet.router is not None:
        r = fleet.router
        out.append(Member("router", None, r.name, r.target, f"http://{r.bind}:{r.router.port}"))
    return out


def member_ref(member: Member, trust_new_host: bool = False) -> Ref:
    """The member as a single-host deployment of its name on its host."""
    return _ref(member, trust_new_host)


def _ref(member: Member, trust_new_host: bool) -> Ref:
    return Ref(member.name, spec_of(member.target, trust_new_host), member.target.workdir)


def _quiet(_event: Event) -> None:
    pass


def fleet_status(fleet: Fleet, trust_new_host: bool = False) -> tuple[dict[str, Any], int]:
    """Every member's status row (absent when it was never deployed) and the fleet's exit code."""
    everyone = members(fleet)

    def one(member: Member, _emit: EventSink) -> dict[str, Any]:
        try:
            row = ops.status(_ref(member, trust_new_host))[0].to_json()
        except NotFound:
            row = {"name": member.name, "host": member.host, "status": "absent", "healthy": False,
                   "serving": False}
        row = {**row, "role": member.role, "index": member.index, "member": member.tag, "url": member.url,
               "alias": member.host}
        if member.role == "router" and row.get("healthy"):
            row["readiness"], states = _router_readiness(fleet, trust_new_host)
            row["workers"] = None if states is None else {url: state == HEALTHY for url, state in states.items()}
            row["worker_states"] = states
            row["foreign_workers"] = None if states is None else \
                sorted(url for url in states if url not in {r.url for r in fleet.replicas})
        return row

    done = fan_out(everyone, lambda m: m.host, lambda m: m.tag, one, TaggedSink(_quiet))
    rows = [d.value if d.value is not None else
            {"name": d.member.name, "host": d.member.host, "alias": d.member.host, "role": d.member.role,
             "index": d.member.index, "member": d.member.tag, "url": d.member.url, "status": "unreachable",
             "healthy": False,
             "serving": False, "error": d.error.message if d.error else None, "code": d.error.exit_code if d.error
             else 1}
            for d in done]
    _mark_in_router(rows)
    code = _exit_code(rows)
    return {"name": fleet.name, "serving": code == ops.SERVING, "code": code,
            "replicas": [r for r in rows if r["role"] == "replica"],
            "router": next((r for r in rows if r["role"] == "router"), None)}, code


def _router_readiness(fleet: Fleet, trust_new_host: bool) -> tuple[dict[str, Any], dict[str, str] | None]:
    """The router's readiness, and its own state of each worker (url -> `healthy` or smg's status of it: `pending`,
    `draining`, `unhealthy`...; None when it could not say)."""
    assert fleet.router is not None
    try:
        with conversing(spec_of(fleet.router.target, trust_new_host)) as remote:
            member = keyed(remote, fleet.router)
            ready = readiness(remote, member)
            try:
                return ready, {url: HEALTHY if w.healthy else (w.status or "unhealthy")
                               for url, w in workers(remote, member).items()}
            except DeployError:
                return ready, None
    except DeployError as exc:
        return {"error": exc.message}, None


def _mark_in_router(rows: list[dict[str, Any]]) -> None:
    """Each replica's `in_router`: whether the serving router counts it a healthy worker (None: unknown, or no
    router), and `router_health`: the router's own word for it. A replica an interrupted rolling restart drained and
    never added back serves, but not the fleet."""
    router = next((r for r in rows if r["role"] == "router"), None)
    have = (router or {}).get("worker_states")
    pulled = (router or {}).get("pulled") or {}
    for row in rows:
        if row["role"] != "replica":
            continue
        state = have.get(row["url"], NOT_REGISTERED) if isinstance(have, dict) else None
        row["in_router"] = None if state is None else state == HEALTHY
        if state != HEALTHY and isinstance(pulled.get(row["url"]), dict):  # the router's watch took it out
            state, row["pulled"] = PULLED, pulled[row["url"]]
        row["router_health"] = state


def _exit_code(rows: list[dict[str, Any]]) -> int:
    """The members' code; a foreign worker in the router turns a serving (0) or partly serving (9) fleet into 6."""
    code = _members_code(rows)
    router = next((r for r in rows if r["role"] == "router"), None)
    if code == ops.SERVING and router is not None and _short_of_replicas(router, rows):
        code = PartlyFailed.exit_code  # the router's own readiness counts fewer healthy workers than replicas
    if router is not None and router.get("foreign_workers") and code in (ops.SERVING, PartlyFailed.exit_code):
        return ops.NOT_SERVING
    return code


def _short_of_replicas(router: dict[str, Any], rows: list[dict[str, Any]]) -> bool:
    """Whether the router's /readiness counts fewer healthy workers than the fleet has replicas (issue 34: a status
    read between its worker list and its readiness must not say serving)."""
    ready = router.get("readiness")
    healthy = ready.get("healthy_workers") if isinstance(ready, dict) else None
    return isinstance(healthy, int) and healthy < sum(1 for r in rows if r["role"] == "replica")


def _members_code(rows: list[dict[str, Any]]) -> int:
    codes = [_row_code(r) for r in rows]
    left_out = any(r["role"] == "replica" and r.get("in_router") is False for r in rows)
    if all(c == ops.SERVING for c in codes) and not left_out:
        return ops.SERVING
    router = next((r for r in rows if r["role"] == "router"), None)
    serving_replicas = [r for r in rows if r["role"] == "replica" and _row_code(r) == ops.SERVING
                        and r.get("in_router") is not False]
    front_ok = router is None or _row_code(router) == ops.SERVING
    if (serving_replicas or left_out) and front_ok:
        return PartlyFailed.exit_code
    return next((c for c in (ops.CRASHED, ops.NOT_SERVING, ops.STOPPED, ops.NO_DEPLOYMENT) if c in codes),
                max(codes))


def _row_code(row: dict[str, Any]) -> int:
    if row["status"] == "absent":
        return ops.NO_DEPLOYMENT
    if row["status"] == "unreachable":
        return int(row.get("code") or 1)
    return ops.status_code(row["status"], bool(row["healthy"]))


def fleet_down(fleet: Fleet, grace: float | None, *, trust_new_host: bool = False, break_lock: bool = False,
               emit: EventSink) -> dict[str, Any]:
    """Stop the router first (no new requests), then every replica (hosts at once). Raises PartlyFailed when a
    host could not be stopped, after trying every one."""
    everyone = members(fleet)
    sink = TaggedSink(emit)
    grace = grace if grace is not None else fleet.profile.restart.grace_s

    def one(member: Member, e: EventSink) -> dict[str, Any]:
        result = ops.down(_ref(member, trust_new_host), grace, break_lock=break_lock,
                          notify=lambda m: e(Warn(message=m)))
        return {**result.to_json(), "role": member.role, "member": member.tag, "alias": member.host}

    routers = fan_out([m for m in everyone if m.role == "router"], lambda m: m.host, lambda m: m.tag, one, sink)
    replicas = fan_out([m for m in everyone if m.role == "replica"], lambda m: m.host, lambda m: m.tag, one, sink)
    rows, failed = [], []
    for d in [*routers, *replicas]:
        if d.error is None and d.value is not None:
            rows.append(d.value)
        else:
            failed.append(f"{d.member.tag}@{d.member.host}: {d.error.message if d.error else 'failed'}")
            rows.append({"name": d.member.name, "host": d.member.host, "alias": d.member.host, "role": d.member.role,
                         "member": d.member.tag, "status": "failed", "error": d.error.message if d.error else None})
    result = {"name": fleet.name, "members": rows}
    if failed:
        raise PartlyFailed(f"{fleet.name}: could not stop {'; '.join(failed)}", outcome=result)
    return result


def pick_member(fleet: Fleet, *, replica: int | None, host: str | None, router: bool) -> Member:
    """`logs --replica N` / `--host H` (that host's only member) / `--router`: exactly one member."""
    everyone = members(fleet)
    if router:
        found = [m for m in everyone if m.role == "router"]
        if not found:
            raise ProfileError(f"{fleet.name} has no router")
        return found[0]
    if replica is not None:
        found = [m for m in everyone if m.role == "replica" and m.index == replica]
        if not found:
            raise ProfileError(f"{fleet.name} has replicas 0..{len(fleet.replicas) - 1}, not {replica}")
        return found[0]
    if host is not None:
        found = [m for m in everyone if m.host == host]
        if len(found) == 1:
            return found[0]
        if not found:
            raise ProfileError(f"{fleet.name} has no member on {host} (hosts: {', '.join(fleet.hosts())})")
        raise ProfileError(f"{fleet.name} has {len(found)} members on {host} "
                           f"({', '.join(m.tag for m in found)}): add --replica N or --router")
    raise ProfileError(f"{fleet.name} is a fleet: choose a member with --replica N (0..{len(fleet.replicas) - 1}), "
                       "--host H or --router")


def fleet_logs(member: Member, opts: ops.LogOptions, out: Callable[[str], None], trust_new_host: bool = False) -> None:
    ops.logs(_ref(member, trust_new_host), lines=opts.lines, follow=opts.follow, previous=opts.previous, out=out,
             grep=opts.grep, since=opts.since)
