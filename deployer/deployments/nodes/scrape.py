"""A `nodes:` group's Prometheus scrape targets (`deploy export prometheus`): one engine on every node, at its own
port (rank 0's API; a follower's stand-in health server, which serves /metrics too where the engine's metrics are
on). The file_sd format and the addresses: deployer.export.prometheus."""

from __future__ import annotations

from deployer.export.prometheus import AddressOf, PromExport, engine_labels, engine_target, reach_of, written_address
from deployer.deployments.nodes.plan import plan_nodes
from deployer.profile.model import Profile


def node_targets(profile: Profile, address_of: AddressOf = written_address) -> PromExport:
    """Every node of a `nodes:` group, with its rank."""
    reach = reach_of(profile, address_of)
    targets = [engine_target(plan.profile, engine_labels(plan.profile, profile.name, node_rank=plan.rank), reach)
               for plan in plan_nodes(profile)]
    return PromExport(targets, reach.warnings)
