"""Preflight across the nodes of one engine: the network (node 0's address, each node's interface), what every
node must agree on (engine version, GPU count, the model), free ports, and node 0's dist-init port free and
reachable from every follower (node 0 listens on it for a moment, each follower connects to it).
"""

from __future__ import annotations

from collections.abc import Callable

from deployer.deployments.nodes.net import decide, gather_net, node0_address
from deployer.deployments.nodes.plan import NodeNet, NodePlan
from deployer.runner.fanout import at_once
from deployer.deployments.nodes.watch import NodeSession
from deployer.preflight.facts import Facts
from deployer.profile.model import Profile
from deployer.errors import DeployError
from deployer.box.process import port_free

REACH_TIMEOUT_S = 10.0


def network(sessions: list[NodeSession], profile: Profile) -> list[NodeNet]:
    """Node 0 first (its address is what the followers route to), then the followers concurrently."""
    hosts = [s.plan.node.host for s in sessions]
    first = gather_net(sessions[0].remote, None)
    node0 = node0_address(first, hosts[0])
    rest = at_once(lambda s: gather_net(s.remote, node0), sessions[1:])
    for s, facts in zip(sessions, [first, *rest]):
        s.net = facts
    return decide([first, *rest], node0, hosts, profile.engine.nic)


def compare(sessions: list[NodeSession], plans: list[NodePlan], facts: list[Facts], lenient: bool,
            holder: Callable[[NodePlan], str] = lambda _plan: "") -> list[str]:
    """What the nodes disagree on, and their busy ports (`holder`: ': <who holds it>' on that node, or '')."""
    problems: list[str] = []
    versions = {p.rank: f.engine_version for p, f in zip(plans, facts)}
    missing = [p.label for p in plans if not versions[p.rank]]
    if missing:
        problems.append(f"no {plans[0].profile.engine.kind} found by {plans[0].profile.engine.python} on "
                        f"{', '.join(missing)}")
    elif len(set(versions.values())) > 1:
        problems.append("engine versions differ: " + ", ".join(f"{p.label} {versions[p.rank]}" for p in plans))
    counts = {p.rank: _gpu_count(p, f) for p, f in zip(plans, facts)}
    if not lenient and len(set(counts.values())) > 1:
        problems.append("GPU counts differ: " + ", ".join(f"{p.label} {counts[p.rank]}" for p in plans))
    local = plans[0].profile.engine.model_path.startswith(("/", "~"))
    for plan, fact in zip(plans, facts):
        if local and (fact.model is None or fact.model.error):
            why = fact.model.error if fact.model is not None and fact.model.error else "not found"
            problems.append(f"model {plan.profile.engine.model_path} on {plan.label}: {why}")
        own = sessions[plan.rank].serving is not None and \
            sessions[plan.rank].serving.record.get("port") == plan.port  # type: ignore[union-attr]
        if fact.port_free is False and not own:
            problems.append(f"port {plan.port} is taken on {plan.label}{holder(plan)}")
    return problems


def held_by(session: NodeSession, port: int) -> str:
    """': <holders>' as the node's supervisor names them (pid, command and user; a claim by its user), or ''."""
    free, detail = port_free(session.remote, session.layout, port)
    holders = detail.split(": ", 1)[1] if not free and ": " in detail else ""
    return f": {holders}" if holders else ""


def _gpu_count(plan: NodePlan, facts: Facts) -> int:
    gpus = plan.profile.engine.gpus
    return len(gpus) if gpus is not None else len(facts.gpus)


def dist_init_problems(sessions: list[NodeSession], plans: list[NodePlan]) -> list[str]:
    """The dist-init port is free on node 0 and every follower reaches it (a listener held for the look)."""
    leader, port = sessions[0], plans[0].profile.engine.dist_init_port
    own = leader.serving is not None
    free, holder = port_free(leader.remote, leader.layout, port)
    if not free and not own:
        return [f"dist-init port {port} is taken on {plans[0].label}: {holder}"]
    if not free:
        return []  # ours (the version serving now): its reachability was shown when it formed
    return _reach(sessions, plans[0].addr, port)


def _reach(sessions: list[NodeSession], addr: str, port: int) -> list[str]:
    """Node 0 listens on the dist-init port for a moment; every follower connects to <node 0>:<port> (the helper's
    `listen` and `reach`, supervisor/reach.py: all at once, each node's in its own helper)."""
    leader, followers = sessions[0], sessions[1:]

    def look(s: NodeSession) -> str | None:
        """None: node 0 listened, or a follower reached it; else why not."""
        try:
            if s.rank == 0:
                s.remote.helper.listen(port, len(followers), REACH_TIMEOUT_S)
                return None
            return s.remote.helper.reach(addr, port, REACH_TIMEOUT_S)
        except DeployError as e:
            return str(e)

    listened, *reached = at_once(look, [leader, *followers])
    out = [f"{s.plan.label} cannot reach node 0's dist-init address {addr}:{port} ({why})"
           for s, why in zip(followers, reached) if why is not None]
    if out and listened is not None:
        out.append(f"{leader.plan.label} could not listen on its dist-init port {port}: {listened}")
    return out
