"""One engine across nodes (`nodes:`): what each node runs, as a derived single-host profile per node.

Node R of N runs the profile's engine with the engine's own multi-node flags (`--nnodes N --node-rank R
--dist-init-addr <node 0>:<dist_init_port>` as the engine spells them in its Launch.multinode), the NIC env
(NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: engine.nic, else what the node's network facts say), its own GPUs and
port. Rank 0 serves the API on engine.host; ranks >= 1 serve only the engine's dummy health, bound to their own
address so that node 0's supervisor can watch them. Pure: the network facts come in as `NodeNet`s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployer.engines.base import MultiNode
from deployer.errors import ProfileError
from deployer.flag_names import option_key
from deployer.host import host_port
from deployer.profile.model import Node, Profile, Target

GROUP_MISSES = 3           # consecutive failed looks before a supervisor calls a peer lost


@dataclass(frozen=True)
class NodeNet:
    """One node's network facts: its address as the group reaches it, and the interface the collectives use."""

    addr: str
    nic: str | None            # None: not known (no `ip` on the node); NCCL/Gloo choose for themselves


@dataclass(frozen=True)
class NodePlan:
    """What one node runs: its rank, its entry in `nodes:`, and the single-host profile derived for it."""

    rank: int
    node: Node
    profile: Profile
    addr: str                  # where the others reach this node (node 0: the dist-init host)

    @property
    def label(self) -> str:
        return f"node {self.rank} ({self.node.host})"

    @property
    def port(self) -> int:
        return self.profile.engine.port


def multinode_of(profile: Profile) -> MultiNode:
    """The engine's multi-node flags, or one clear line when the engine has none known to deployer."""
    multinode = profile.engine.definition.launch.multinode
    if multinode is None:
        raise ProfileError(f"nodes: one {profile.engine.kind} engine across nodes is not supported by deployer "
                           "(no multi-node launch flags known for it)", file=_file(profile))
    return multinode


def node_keys(multinode: MultiNode) -> tuple[str, str, str]:
    """The profile keys (engine.args) of the multi-node flags: set by `nodes:`, never by hand."""
    return option_key(multinode.nnodes), option_key(multinode.node_rank), option_key(multinode.dist_init_addr)


def plan_nodes(profile: Profile, nets: list[NodeNet] | None = None) -> list[NodePlan]:
    """Every node's derived profile, node_rank in list order. Without network facts (`deploy render`), node
    addresses are the hosts as written and the NIC is engine.nic alone."""
    if not profile.nodes:
        raise ProfileError("not a multi-node profile (no nodes:)", file=_file(profile))
    multinode = multinode_of(profile)
    given = sorted(set(node_keys(multinode)) & set(profile.engine.args))
    if given:
        raise ProfileError(f"engine.args.{given[0]} is set per node from nodes: (node_rank is the list order); "
                           "remove it", file=_file(profile), field=f"engine.args.{given[0]}")
    seen: dict[tuple[str, int | None, str], int] = {}
    for rank, node in enumerate(profile.nodes):
        where = (node.host, node.port, node.workdir)
        if where in seen:  # one deployment dir, one lock: the second node could never take it
            raise ProfileError(f"nodes {seen[where]} and {rank} are the same host and workdir ({node.host}:"
                               f"{node.workdir}); give each node its own host (or workdir)", file=_file(profile))
        seen[where] = rank
    if nets is not None and len(nets) != len(profile.nodes):
        raise ValueError("one NodeNet per node")
    addrs = [n.addr for n in nets] if nets else [n.host for n in profile.nodes]
    nics = [n.nic for n in nets] if nets else [profile.engine.nic] * len(profile.nodes)
    dist_init = host_port(addrs[0], profile.engine.dist_init_port)
    return [_plan(profile, multinode, rank, node, addrs[rank], nics[rank], dist_init)
            for rank, node in enumerate(profile.nodes)]


def _plan(profile: Profile, multinode: MultiNode, rank: int, node: Node, addr: str, nic: str | None,
          dist_init: str) -> NodePlan:
    nnodes, node_rank, dist_init_addr = node_keys(multinode)
    engine = profile.engine
    args: dict[str, Any] = {**engine.args, nnodes: len(profile.nodes or []), node_rank: rank,
                            dist_init_addr: dist_init}
    env = dict(engine.env)
    if nic is not None:
        for name in multinode.nic_env:
            env.setdefault(name, nic)  # a value the profile sets itself wins
    update: dict[str, Any] = {"args": args, "env": env, "port": node.engine_port or engine.port,
                              "gpus": node.gpus if node.gpus is not None else engine.gpus}
    if rank > 0:
        update["host"] = addr  # the dummy health, where node 0's supervisor looks for it
    derived = profile.with_engine(engine.model_copy(update=update))
    target = Target(**{k: getattr(node, k) for k in Target.model_fields})
    single = derived.model_copy(update={"target": target, "nodes": None})
    _keep_private(derived, single)
    return NodePlan(rank=rank, node=node, profile=single, addr=addr)


def _keep_private(source: Profile, copy: Profile) -> None:
    """What the profile knows about its secrets and origin travels with the derived copy."""
    copy._source = source._source
    copy._secret_env = source._secret_env
    copy._secret_args = source._secret_args
    copy._templates = dict(source._templates)
    copy._unset = list(source._unset)


def group_config(plans: list[NodePlan], rank: int, every_s: float) -> dict[str, Any]:
    """The `group` section of a node's supervise.json: whom its supervisor watches (deployer/supervisor/
    group.py). Node 0 watches every follower's dummy health; a follower watches its engine's
    connection to node 0's rendezvous port."""
    leader = plans[0]
    common = {"every_s": every_s, "misses": GROUP_MISSES, "rank": rank, "nnodes": len(plans)}
    if rank == 0:
        followers = [{"rank": p.rank, "addr": p.addr, "port": p.port, "path": "/health"} for p in plans[1:]]
        return {"role": "leader", "followers": followers, **common}
    return {"role": "follower", "leader": {"addr": leader.addr, "port": leader.profile.engine.dist_init_port},
            **common}


def supervisor_overrides(plans: list[NodePlan], rank: int, every_s: float) -> dict[str, Any]:
    """What a node's supervise.json adds to the single-host one: the group, and a follower's ready line."""
    multinode = multinode_of(plans[rank].profile)
    extra: dict[str, Any] = {"group": group_config(plans, rank, every_s)}
    if rank > 0 and multinode.follower_ready_line:
        extra["ready_pattern"] = multinode.follower_ready_line
    return extra


def _file(profile: Profile) -> str:
    return str(profile.source or "<profile>")
