"""On-call for one engine across nodes: `deploy status|down|logs PROFILE [--node N]` of a `nodes:` profile.

Each node is a single-host deployment of the same name on its own host (deployments/nodes/plan.py), so every command is
the single-host one on that node's derived profile. `status` shows every node (or one); `down` stops every node,
all ranks at once (rank 0's graceful shutdown ends the followers, which ignore SIGTERM), or one node; `logs` reads one
node's log (`--node N`, required: the ranks' logs are separate files on separate hosts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from deployer.errors import ProfileError
from deployer.deployments.nodes.diagnose import first_crash
from deployer.deployments.nodes.plan import NodePlan, plan_nodes
from deployer.host import host_port
from deployer.runner.fanout import at_once
from deployer.logtext import bounded_diagnosis
from deployer.operate import deployment as ops
from deployer.operate.rows import DownResult, NodeFacts, ShownDiagnosis, StatusRow
from deployer.runner.up import diagnose_state
from deployer.profile.model import Profile
from deployer.box.push import RunDir
from deployer.box.process import listener
from deployer.remote.base import EndpointUnreachable
from deployer.host import TargetSpec
from deployer.supervisor.base import UP

Notify = Callable[[str], None]


def node_refs(profile: Profile, node: int | None, workdir: str | None,
              trust_new_host: bool) -> list[tuple[NodePlan, ops.Ref]]:
    """Every node's plan and Ref (or the one --node names): a single-host deployment of the group's name on it."""
    plans = plan_nodes(profile)
    if node is not None and not 0 <= node < len(plans):
        raise ProfileError(f"--node {node}: {profile.name} has nodes 0..{len(plans) - 1}")
    chosen = plans if node is None else [plans[node]]
    out = []
    for plan in chosen:
        t = plan.profile.target
        spec = TargetSpec(host=t.host, user=t.user, port=t.port, identity_file=t.identity_file,
                          known_hosts=t.known_hosts, trust_new_host=trust_new_host)
        out.append((plan, ops.Ref(profile.name, spec, workdir or t.workdir, plan.profile)))
    return out


# A follower's dummy health listens on the follower's own address (where node 0's supervisor watches it), not
# on its loopback: it is asked from node 0 (the helper's `http` there), as the group sees it.
HEALTH_TIMEOUT_S = 3.0


def status(profile: Profile, node: int | None, workdir: str | None, trust_new_host: bool) -> list[StatusRow]:
    refs = node_refs(profile, node, workdir, trust_new_host)
    rows = [row.replace(node=NodeFacts(plan.rank, "rank 0 (API)" if plan.rank == 0 else "dummy health"))
            for plan, ref in refs for row in ops.status(ref, with_metrics=plan.rank == 0)]  # node 0 serves the API
    followers = [i for i, ((plan, _), row) in enumerate(zip(refs, rows)) if plan.rank > 0 and row.status in UP]
    if followers:
        leader = node_refs(profile, 0, workdir, trust_new_host)[0][1]
        answers = _follower_health(leader, [(refs[i][0].addr, refs[i][0].port) for i in followers])
        answered = [i for i in followers if answers.get(host_port(refs[i][0].addr, refs[i][0].port)) == 200]
        squatters = dict(zip(answered, at_once(lambda i: _squatter(refs[i][1], rows[i], refs[i][0].port), answered)))
        for i in followers:
            plan, row, squat = refs[i][0], rows[i], squatters.get(i)
            healthy = i in answered and squat is None
            rows[i] = row.replace(healthy=healthy, serving=ops.status_code(row.status, healthy) == ops.SERVING,
                                  unhealthy=squat or row.unhealthy,
                                  node=dataclasses.replace(_facts(row), health_seen_from="node 0"))
    return _mark_first_crash(profile, refs, rows)


def _squatter(ref: ops.Ref, row: StatusRow, port: int) -> dict[str, Any] | None:
    """The `unhealthy` record when the follower's port is answered by a process that is not its engine's (another
    user's server in a restart's backoff: issue 34), asked on the follower's host; None when it is its engine's.
    A ready rank holds its port, so only a rank that is not ready is asked."""
    if row.status == "ready" or not row.run_dir:
        return None
    run = RunDir(row.run_dir, row.run_dir.rstrip("/").rsplit("/", 1)[-1])
    with ops.connected(ref) as remote:
        owner = listener(remote, run, port)
    if owner.ours is not False:
        return None
    return {"reason": f"port {port} is answered by {owner.describe()}, not by this run's engine",
            "holders": owner.holders}


def _facts(row: StatusRow) -> NodeFacts:
    assert row.node is not None
    return row.node


def _diagnose_crash(ref: ops.Ref, row: StatusRow, profile: Profile) -> ShownDiagnosis | None:
    if not row.run_dir or row.last_crash is None:
        return None
    run = RunDir(row.run_dir, row.run_dir.rstrip("/").rsplit("/", 1)[-1])
    with ops.connected(ref) as remote:
        diag = diagnose_state(remote, run, {"last_crash": row.last_crash.to_json()}, profile.engine.version,
                              engine=profile.engine.definition)
    return ShownDiagnosis.of(bounded_diagnosis({**diag.to_json(), "hint": diag.hint}))


def _mark_first_crash(profile: Profile, refs: list[tuple[NodePlan, ops.Ref]],
                      rows: list[StatusRow]) -> list[StatusRow]:
    """Every node's last crash diagnosed (`last_crash_diagnosis`, also while the restarted group serves), and
    the node whose crash brought the group down gets `first_crash: true` (the others only followed it)."""
    rows = [row.replace(node=dataclasses.replace(_facts(row), diagnosed=True, last_crash_diagnosis=row.diagnosis if
                                                 row.diagnosis and row.diagnosis.raw else
                                                 _diagnose_crash(ref, row, profile)))
            if row.last_crash is not None else row for (_, ref), row in zip(refs, rows)]
    crashes = {_facts(row).rank: (row.last_crash.to_json(), _signature(_facts(row).last_crash_diagnosis))
               for row in rows if row.last_crash is not None}
    first = first_crash(crashes, profile.engine.definition) if len(crashes) > 1 else None
    return [row.replace(node=dataclasses.replace(_facts(row), first_crash=_facts(row).rank == first)) for row in rows]


def _signature(diagnosis: ShownDiagnosis | None) -> str | None:
    return None if diagnosis is None else diagnosis.signature


def _follower_health(leader: ops.Ref, followers: list[tuple[str, int]]) -> dict[str, int]:
    """Each follower's /health status code as node 0 gets it (0: nothing answered)."""
    out: dict[str, int] = {}
    with ops.connected(leader) as remote:
        for addr, port in followers:
            try:
                out[host_port(addr, port)] = remote.request("GET", port, "/health", timeout=HEALTH_TIMEOUT_S,
                                                            address=addr).status
            except EndpointUnreachable:
                out[host_port(addr, port)] = 0
    return out


def down(profile: Profile, node: int | None, workdir: str | None, trust_new_host: bool,
         opts: ops.DownOptions) -> list[DownResult]:
    refs = node_refs(profile, node, workdir, trust_new_host)
    notify: Notify = opts.notify or _silent
    if node is not None and len(plan_nodes(profile)) > 1:
        notify(f"stopping node {node} alone breaks the group: the other ranks' supervisors stop theirs too "
               "(and restart the group if the restart policy says so)")
    # Every rank's supervisor is asked at once: rank 0's graceful shutdown ends the followers (which ignore
    # SIGTERM) within the grace, and their supervisors, asked too, record a stop, not a crash, and restart nothing.
    results = at_once(lambda pair: ops.down(pair[1], opts.grace, break_lock=opts.break_lock, notify=notify), refs)
    return [dataclasses.replace(result, node=plan.rank) for (plan, _), result in zip(refs, results)]


def logs(profile: Profile, node: int | None, workdir: str | None, trust_new_host: bool, opts: ops.LogOptions,
         out: Callable[[str], None]) -> None:
    if node is None:
        raise ProfileError(f"{profile.name} runs on {len(profile.nodes or [])} nodes: give --node N "
                           f"(0 is rank 0, which serves the API)")
    (_, ref), = node_refs(profile, node, workdir, trust_new_host)
    ops.logs(ref, lines=opts.lines, follow=opts.follow, previous=opts.previous, out=out,
             grep=opts.grep, since=opts.since)


def _silent(_message: str) -> None:
    pass
