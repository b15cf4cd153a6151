"""On-call for one engine across nodes: `deploy status|down|logs PROFILE [--node N]` of a `nodes:` profile.

Each node is a single-host deployment of the same name on its own host (nodes/plan.py), so every command is
the single-host one on that node's derived profile. `status` shows every node (or one); `down` stops every node,
all ranks at once (rank 0's graceful shutdown ends the followers, which ignore SIGTERM), or one node; `logs` reads one
node's log (`--node N`, required: the ranks' logs are separate files on separate hosts).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from deployer.errors import ProfileError
from deployer.nodes.diagnose import first_crash
from deployer.nodes.plan import NodePlan, host_port, plan_nodes
from deployer.runner.fanout import at_once
from deployer.logtext import bounded_diagnosis
from deployer.oncall import deployment as ops
from deployer.runner.up import diagnose_state
from deployer.profile.model import Profile
from deployer.target.push import RunDir
from deployer.remote.program import SUPERVISOR_PYTHON
from deployer.remote.base import TargetSpec
from deployer.supervisor.supervise_base import UP

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
# on its loopback: it is asked from node 0, as the group sees it.
HEALTH_PY = """import http.client, sys
for target in sys.argv[1:]:
    addr, port = target.rsplit(":", 1)
    try:
        c = http.client.HTTPConnection(addr.strip("[]"), int(port), timeout=3); c.request("GET", "/health")
        print(target, c.getresponse().status)
    except Exception as e:
        print(target, 0)
"""


def status(profile: Profile, node: int | None, workdir: str | None, trust_new_host: bool) -> list[dict[str, Any]]:
    refs = node_refs(profile, node, workdir, trust_new_host)
    rows = []
    for plan, ref in refs:
        for row in ops.status(ref):
            rows.append({**row, "node": plan.rank, "role": "rank 0 (API)" if plan.rank == 0 else "dummy health"})
    followers = [(plan, row) for (plan, _), row in zip(refs, rows) if plan.rank > 0 and row["status"] in UP]
    if followers:
        leader = node_refs(profile, 0, workdir, trust_new_host)[0][1]
        answers = _follower_health(leader, [host_port(p.addr, p.port) for p, _ in followers])
        for plan, row in followers:
            row["healthy"] = answers.get(host_port(plan.addr, plan.port)) == 200
            row["health_seen_from"] = "node 0"
            row["serving"] = ops.status_exit_code(row) == 0
    _mark_first_crash(profile, refs, rows)
    return rows


def _diagnose_crash(ref: ops.Ref, row: dict[str, Any], profile: Profile) -> dict[str, Any] | None:
    run_dir = str(row.get("run_dir") or "")
    if not run_dir:
        return None
    run = RunDir(run_dir, run_dir.rstrip("/").rsplit("/", 1)[-1])
    with ops.connected(ref) as remote:
        diag = diagnose_state(remote, run, {"last_crash": row["last_crash"]}, profile.engine.version,
                              engine=profile.engine.definition)
    return bounded_diagnosis({**diag.to_json(), "hint": diag.hint})


def _mark_first_crash(profile: Profile, refs: list[tuple[NodePlan, ops.Ref]], rows: list[dict[str, Any]]) -> None:
    """Every node's last crash diagnosed (`last_crash_diagnosis`, also while the restarted group serves), and
    the node whose crash brought the group down gets `first_crash: true` (the others only followed it)."""
    for (_, ref), row in zip(refs, rows):
        if isinstance(row.get("last_crash"), dict):
            row["last_crash_diagnosis"] = row.get("diagnosis") or _diagnose_crash(ref, row, profile)
    crashes = {row["node"]: (row["last_crash"], (row.get("last_crash_diagnosis") or {}).get("signature"))
               for row in rows if isinstance(row.get("last_crash"), dict)}
    first = first_crash(crashes, profile.engine.definition) if len(crashes) > 1 else None
    for row in rows:
        row["first_crash"] = row["node"] == first


def _follower_health(leader: ops.Ref, targets: list[str]) -> dict[str, int]:
    with ops.connected(leader) as remote:
        text = remote.run(" ".join([SUPERVISOR_PYTHON, "-c", shlex.quote(HEALTH_PY), *map(shlex.quote, targets)]),
                          timeout=30, check=False).stdout
    out: dict[str, int] = {}
    for line in text.splitlines():
        target, _, code = line.rpartition(" ")
        if code.isdigit():
            out[target] = int(code)
    return out


def down(profile: Profile, node: int | None, workdir: str | None, trust_new_host: bool,
         opts: ops.DownOptions) -> list[dict[str, Any]]:
    refs = node_refs(profile, node, workdir, trust_new_host)
    notify: Notify = opts.notify or _silent
    if node is not None and len(plan_nodes(profile)) > 1:
        notify(f"stopping node {node} alone breaks the group: the other ranks' supervisors stop theirs too "
               "(and restart the group if the restart policy says so)")
    # Every rank's supervisor is asked at once: rank 0's graceful shutdown ends the followers (which ignore
    # SIGTERM) within the grace, and their supervisors, asked too, record a stop, not a crash, and restart nothing.
    results = at_once(lambda pair: ops.down(pair[1], opts.grace, break_lock=opts.break_lock, notify=notify), refs)
    return [{**result, "node": plan.rank} for (plan, _), result in zip(refs, results)]


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
