"""A `replicas:` fleet's Prometheus scrape targets (`deploy export prometheus`): one engine per replica (each its own
deployment `<fleet>-r<i>`, at its `engine_port`) and, with `router:`, the `smg` router's metrics server (its own
port, `router.metrics_port`). The file_sd format and the addresses: deployer.export.prometheus."""

from __future__ import annotations

from deployer.export.prometheus import (AddressOf, PromExport, Reach, Role, ScrapeTarget, TargetLabels,
                                        engine_labels, engine_target, reach_of, written_address)
from deployer.deployments.fleet.members import RouterMember, fleet_of
from deployer.deployments.fleet.router import metrics_port
from deployer.host import host_port
from deployer.profile.model import Profile


def fleet_targets(profile: Profile, address_of: AddressOf = written_address) -> PromExport:
    """Every replica of a `replicas:` fleet and its router's metrics server; ProfileError for a `replicas:` count
    (it names no hosts to scrape) or a fleet that cannot be deployed."""
    reach = reach_of(profile, address_of)
    fleet = fleet_of(profile, reach.address_of)
    targets = [engine_target(m.profile, engine_labels(m.profile, profile.name, replica=m.tag), reach)
               for m in fleet.replicas]
    if fleet.router is not None:
        targets.append(_router_target(fleet.router, profile.name, reach))
    return PromExport(targets, reach.warnings)


def _router_target(member: RouterMember, group: str, reach: Reach) -> ScrapeTarget:
    """smg's metrics server (smg 1.13.0 model_gateway/src/observability/metrics_server.rs: `/metrics`, no
    authentication): on --prometheus-host (deployer passes the router's bind address unless the profile sets it)
    and --prometheus-port (deployer's default: the router's port + 1)."""
    given = member.router.args.get("prometheus_host")
    bind = given if isinstance(given, str) and given else member.bind
    address = reach.address(bind, member.target, member.name, "router.args.prometheus_host")
    labels = TargetLabels(deployment=member.name, profile=group, role=Role.ROUTER, host=member.host)
    return ScrapeTarget(host_port(address, metrics_port(member)), labels)
